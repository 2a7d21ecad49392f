#include "testing/test_util.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "tiers/host/host_tier.h"

namespace kvtier::testing {

BlockKey Key(uint64_t n, uint64_t set) {
  // SplitMix64's finaliser of a value injective in `set` for a fixed n.
  uint64_t x = (set + 1) * 0x9e3779b97f4a7c15ULL ^ n;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return BlockKey{x ^ (x >> 31), n};
}

KvLayout SmallLayout(uint32_t block_tokens) {
  KvLayout l;
  l.num_layers = 2;
  l.num_kv_heads = 2;
  l.head_dim = 8;
  l.dtype = DType::kFp32;
  l.block_tokens = block_tokens;
  return l;
}

KvLayout Layout16KiB() {
  KvLayout l;
  l.num_layers = 2;
  l.num_kv_heads = 2;
  l.head_dim = 64;
  l.dtype = DType::kBf16;
  l.block_tokens = 16;
  return l;
}

TierSpec HostSpec(uint64_t blocks, std::string name) {
  TierSpec t;
  t.kind = "host";
  t.name = std::move(name);
  t.capacity_bytes = blocks * SmallLayout().bytes_per_block();
  return t;
}

TierSpec InstanceSpec(std::shared_ptr<Tier> tier) {
  TierSpec t;
  t.instance = std::move(tier);
  return t;
}

std::unique_ptr<Cache> OpenSmallCache(std::vector<TierSpec> tiers, WriteMode mode,
                                      KvEventCallback cb, uint32_t queue_blocks) {
  CacheOptions o;
  o.layout = SmallLayout();
  o.tiers = std::move(tiers);
  o.write_mode = mode;
  o.on_event = std::move(cb);
  o.write_queue_blocks = queue_blocks;
  auto c = Cache::Open(std::move(o));
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(c).value() : nullptr;
}

StoredRequest::StoredRequest(const Cache& c, size_t blocks, TokenId seed)
    : tokens(Tokens(blocks * c.layout().block_tokens, seed)) {
  HashPrefix(c.Root(), c.layout().block_tokens, tokens, &keys);
  for (size_t i = 0; i < blocks; ++i) {
    data.emplace_back(c.layout().bytes_per_block());
    FillBlock(data.back(), keys[i].lo);
  }
  for (auto& d : data) views.emplace_back(d);
}

void FillBlock(std::span<std::byte> block, uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < block.size(); ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    block[i] = static_cast<std::byte>(x);
  }
}

std::vector<std::byte> MakeBlock(size_t bytes, uint64_t seed) {
  std::vector<std::byte> b(bytes);
  FillBlock(b, seed);
  return b;
}

std::vector<TokenId> Tokens(size_t n, uint32_t base) {
  std::vector<TokenId> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = base + static_cast<TokenId>(i);
  return t;
}

TempDir::TempDir() {
  const char* tmp = std::getenv("TMPDIR");
  std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/kvtier-test-XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (!mkdtemp(buf.data())) std::abort();
  path_ = buf.data();
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::shared_ptr<FaultyTier> FaultyTier::Make(const KvLayout& layout, uint64_t capacity_bytes,
                                             std::string name, bool verify_on_load) {
  HostTierOptions o;
  o.name = name + "-inner";
  o.capacity_bytes = capacity_bytes;
  o.pin = false;
  auto inner = HostTier::Open(layout, o);
  if (!inner.ok()) std::abort();
  return std::shared_ptr<FaultyTier>(new FaultyTier(layout, capacity_bytes, std::move(name),
                                                    std::move(inner).value(), verify_on_load));
}

FaultyTier::FaultyTier(const KvLayout& layout, uint64_t capacity, std::string name,
                       std::unique_ptr<Tier> inner, bool verify_on_load)
    : Tier(std::move(name), TierKind::kDisk, layout, capacity),
      inner_(std::move(inner)),
      verify_on_load_(verify_on_load) {}

void FaultyTier::PutImpl(std::span<const BlockKey> keys, std::span<const ConstBlock> blocks,
                         std::span<Status> results) {
  if (on_put) on_put();
  if (fail_writes) {
    for (auto& r : results) r = Status::Unavailable(name() + ": injected write failure");
    return;
  }
  (void)inner_->Put(keys, blocks, results);
}

void FaultyTier::GetImpl(std::span<const BlockKey> keys, std::span<const MutableBlock> out,
                         std::span<Status> results) {
  GetSliceImpl(keys, 0, out, {}, results);
}

void FaultyTier::GetSliceImpl(std::span<const BlockKey> keys, uint64_t offset,
                              std::span<const MutableBlock> out, std::span<uint64_t>,
                              std::span<Status> results) {
  if (on_get) on_get(offset);
  gets += static_cast<int>(keys.size());
  if (fail_reads) {
    for (auto& r : results) r = Status::Unavailable(name() + ": injected read failure");
    return;
  }
  // The inner host tier keeps no checksums: the Cache checks this tier's reads itself.
  if (out.empty() || out[0].size() == block_bytes()) {
    (void)inner_->Get(keys, out, results);
  } else {
    (void)inner_->GetSlice(keys, offset, out, {}, results);
  }
  if (corrupt_reads) {
    for (size_t i = 0; i < out.size(); ++i)
      if (results[i].ok()) out[i][out[i].size() / 2] ^= std::byte{0x40};
  }
}

Status FaultyTier::ExistsImpl(std::span<const BlockKey> keys, std::span<bool> out) {
  return inner_->Exists(keys, out);
}
Status FaultyTier::EraseImpl(std::span<const BlockKey> keys) { return inner_->Erase(keys); }
uint64_t FaultyTier::UsedBytesImpl() const { return inner_->used_bytes(); }
TierCapabilities FaultyTier::CapabilitiesImpl() const {
  TierCapabilities c;
  c.verify_on_load = verify_on_load_;
  c.reads_slices = slices;
  return c;
}

void FaultyTier::CountersImpl(std::vector<TierStats::Counter>* out) const {
  out->push_back(
      {"faulty_gets", "Get calls the faulty tier saw", static_cast<uint64_t>(gets.load())});
}

HeldPutTier::HeldPutTier(const KvLayout& layout, uint64_t capacity_bytes, std::string name)
    : tier(FaultyTier::Make(layout, capacity_bytes, std::move(name))) {
  tier->on_put = [this] {
    if (first.exchange(false)) entered_p.set_value();
    opened.wait();
  };
}

}  // namespace kvtier::testing
