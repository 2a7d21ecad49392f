// The Cache's background writer: lower tiers are written after Store returns, from the host
// copy, while nothing waits on them; visibility, backpressure, Flush, drain and failure counts.
#include <gtest/gtest.h>

#include <future>
#include <mutex>

#include "kvtier/cache.h"
#include "testing/test_util.h"

namespace kvtier {
namespace {

using testing::HostSpec;
using testing::InstanceSpec;

using testing::FaultyTier;
using testing::FillBlock;
using testing::SmallLayout;
using testing::Tokens;

constexpr uint32_t kBt = 4;
constexpr auto kPatience = std::chrono::seconds(30);  // a hang fails instead of blocking CI

// A lower tier whose Puts wait on a latch the test opens.
struct BlockingTier {
  std::shared_ptr<FaultyTier> tier =
      FaultyTier::Make(SmallLayout(kBt), 64 * SmallLayout(kBt).bytes_per_block(), "ssd");
  std::promise<void> entered_p, open_p;
  std::future<void> entered = entered_p.get_future();
  std::shared_future<void> opened = open_p.get_future().share();
  std::atomic<bool> first{true};
  BlockingTier() {
    tier->on_put = [this] {
      if (first.exchange(false)) entered_p.set_value();
      opened.wait();
    };
  }
  void Open() {
    if (!was_opened.exchange(true)) open_p.set_value();
  }
  // Opens the latch before failing, so the Cache's drain on destruction cannot hang.
  bool Check(bool ok) {
    if (!ok) Open();
    return ok;
  }
  std::atomic<bool> was_opened{false};
};

struct Recorder {
  std::mutex mu;
  std::vector<KvEvent> events;
  KvEventCallback Callback() {
    return [this](const KvEvent& e) {
      std::lock_guard<std::mutex> l(mu);
      events.push_back(e);
    };
  }
  int Stored(int tier) {
    std::lock_guard<std::mutex> l(mu);
    int n = 0;
    for (const KvEvent& e : events) n += e.type == KvEvent::Type::kStored && e.tier == tier;
    return n;
  }
};

std::unique_ptr<Cache> Open(std::vector<TierSpec> tiers, WriteMode mode, KvEventCallback cb,
                            uint32_t queue_blocks = 256) {
  CacheOptions o;
  o.layout = SmallLayout(kBt);
  o.tiers = std::move(tiers);
  o.write_mode = mode;
  o.on_event = std::move(cb);
  o.write_queue_blocks = queue_blocks;
  auto c = Cache::Open(std::move(o));
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return std::move(c).value();
}

struct Request {
  std::vector<TokenId> tokens;
  std::vector<BlockKey> keys;
  std::vector<std::vector<std::byte>> data;
  std::vector<ConstBlock> views;
  Request(const Cache& c, size_t blocks, TokenId seed) : tokens(Tokens(blocks * kBt, seed)) {
    HashPrefix(c.Root(), kBt, tokens, &keys);
    for (size_t i = 0; i < blocks; ++i) {
      data.emplace_back(c.layout().bytes_per_block());
      FillBlock(data.back(), keys[i].lo);
    }
    for (auto& d : data) views.emplace_back(d);
  }
};

// Looks up r and loads every hit block, checking the bytes; returns the hit count.
uint32_t LookupAndLoad(Cache& c, const Request& r, int expect_tier = -1) {
  auto lk = c.Lookup(r.tokens);
  EXPECT_TRUE(lk.ok());
  if (expect_tier >= 0) {
    EXPECT_EQ(lk->blocks_by_tier[expect_tier], lk->hit_blocks);
  }
  std::vector<std::vector<std::byte>> out(lk->hit_blocks,
                                          std::vector<std::byte>(c.layout().bytes_per_block()));
  std::vector<MutableBlock> views(out.begin(), out.end());
  auto ld = c.Load(*lk, views);
  EXPECT_TRUE(ld.ok());
  EXPECT_EQ(ld->loaded_blocks, lk->hit_blocks);
  for (uint32_t i = 0; i < ld->loaded_blocks; ++i) {
    EXPECT_EQ(out[i], r.data[i]) << "block " << i;
  }
  return lk->hit_blocks;
}

// Write-through: a Store returns, and Lookups and host Loads from other threads complete, while
// the lower tier's Put is held; the blocks show below only once the Put is done.
TEST(CacheAsyncTest, WriteThroughStoreDoesNotWaitForALowerTierPut) {
  BlockingTier low;
  Recorder rec;
  auto cache = Open({HostSpec(64, "dram"), InstanceSpec(low.tier)}, WriteMode::kWriteThrough,
                    rec.Callback());
  Request a(*cache, 4, 100), b(*cache, 3, 200);
  auto st = std::async(std::launch::async, [&] { return cache->Store(a.tokens, a.views); });
  ASSERT_TRUE(low.Check(st.wait_for(kPatience) == std::future_status::ready))
      << "Store waited for the SSD";
  EXPECT_EQ(st.get()->stored_blocks, 4u);
  low.entered.wait();  // the writer is inside the lower tier's Put now

  auto other = std::async(std::launch::async, [&] {
    EXPECT_EQ(LookupAndLoad(*cache, a, /*expect_tier=*/0), 4u);
    auto sb = cache->Store(b.tokens, b.views);  // queued behind the held write
    EXPECT_EQ(sb->stored_blocks, 3u);
    EXPECT_EQ(LookupAndLoad(*cache, b, 0), 3u);
  });
  const bool done = other.wait_for(kPatience) == std::future_status::ready;
  EXPECT_EQ(rec.Stored(1), 0) << "a block showed in the SSD before the SSD had it";
  low.Open();
  ASSERT_TRUE(done) << "a Lookup, Load or Store waited on the SSD's Put";
  other.get();
  cache->Flush();
  EXPECT_EQ(rec.Stored(1), 7);
  EXPECT_EQ(low.tier->stats().puts, 7u);
  EXPECT_EQ(cache->stats().tiers[1].write_failures, 0u);
}

// Write-back: victims go down in the background; the Store that evicted them returns while
// their Put is held, and they are found in the lower tier once it is done.
TEST(CacheAsyncTest, WriteBackVictimsMoveDownWithoutBlockingTheStore) {
  BlockingTier low;
  Recorder rec;
  auto cache =
      Open({HostSpec(4, "dram"), InstanceSpec(low.tier)}, WriteMode::kWriteBack, rec.Callback());
  Request a(*cache, 4, 100), b(*cache, 4, 200);
  ASSERT_TRUE(cache->Store(a.tokens, a.views).ok());
  EXPECT_EQ(low.tier->stats().puts, 0u);  // a fits: nothing went down
  auto st = std::async(std::launch::async, [&] { return cache->Store(b.tokens, b.views); });
  ASSERT_TRUE(low.Check(st.wait_for(kPatience) == std::future_status::ready))
      << "Store waited for the SSD";
  EXPECT_EQ(st.get()->stored_blocks, 4u);
  low.entered.wait();

  auto other = std::async(std::launch::async, [&] {
    EXPECT_EQ(LookupAndLoad(*cache, b, 0), 4u);
    EXPECT_EQ(LookupAndLoad(*cache, b, 0), 4u);
  });
  const bool done = other.wait_for(kPatience) == std::future_status::ready;
  EXPECT_EQ(rec.Stored(1), 0);
  low.Open();
  ASSERT_TRUE(done) << "a Lookup or Load waited on the SSD's Put";
  other.get();
  cache->Flush();
  EXPECT_EQ(rec.Stored(1), 4);
  EXPECT_EQ(cache->stats().tiers[0].writebacks, 4u);
  EXPECT_EQ(LookupAndLoad(*cache, a), 4u);  // from the SSD, bytes intact
}

// A full queue makes Store wait (never unbounded growth); it goes on once the writer drains.
TEST(CacheAsyncTest, FullWriteQueueAppliesBackpressure) {
  BlockingTier low;
  auto cache =
      Open({HostSpec(64, "dram"), InstanceSpec(low.tier)}, WriteMode::kWriteThrough, nullptr,
           /*queue_blocks=*/2);
  Request a(*cache, 2, 100), b(*cache, 1, 200);
  ASSERT_TRUE(cache->Store(a.tokens, a.views).ok());  // 2 blocks: the queue is full
  low.entered.wait();
  auto st = std::async(std::launch::async, [&] { return cache->Store(b.tokens, b.views); });
  // The Store must still be waiting: nothing it waits on moves until the latch opens.
  EXPECT_EQ(st.wait_for(std::chrono::milliseconds(200)), std::future_status::timeout)
      << "a Store went past a full write queue";
  low.Open();
  ASSERT_EQ(st.wait_for(kPatience), std::future_status::ready);
  EXPECT_EQ(st.get()->stored_blocks, 1u);
  cache->Flush();
  EXPECT_EQ(low.tier->stats().puts, 3u);
  EXPECT_EQ(cache->stats().write_queue_waits, 1u);
}

TEST(CacheAsyncTest, FailedBackgroundWritesAreCounted) {
  auto low = FaultyTier::Make(SmallLayout(kBt), 64 * SmallLayout(kBt).bytes_per_block(), "ssd");
  low->fail_writes = true;
  Recorder rec;
  auto cache =
      Open({HostSpec(64, "dram"), InstanceSpec(low)}, WriteMode::kWriteThrough, rec.Callback());
  Request a(*cache, 3, 100);
  auto st = cache->Store(a.tokens, a.views);
  EXPECT_EQ(st->stored_blocks, 3u);  // the host has them
  cache->Flush();
  EXPECT_EQ(cache->stats().tiers[1].write_failures, 3u);
  EXPECT_NE(cache->PrometheusText().find("kvtier_tier_write_failures_total{tier=\"ssd\"} 3\n"),
            std::string::npos);
  EXPECT_EQ(rec.Stored(1), 0);
}

// Destroying the Cache drains the queue: writes in flight finish into the lower tier.
TEST(CacheAsyncTest, DestructionDrainsWritesInFlight) {
  BlockingTier low;
  auto cache =
      Open({HostSpec(64, "dram"), InstanceSpec(low.tier)}, WriteMode::kWriteThrough, nullptr);
  Request a(*cache, 2, 100), b(*cache, 3, 200);
  ASSERT_TRUE(cache->Store(a.tokens, a.views).ok());
  low.entered.wait();
  ASSERT_TRUE(cache->Store(b.tokens, b.views).ok());  // queued behind the held Put
  auto gone = std::async(std::launch::async, [&] { cache.reset(); });
  low.Open();
  ASSERT_EQ(gone.wait_for(kPatience), std::future_status::ready);
  EXPECT_EQ(low.tier->stats().puts, 5u);
}

// Promotion of a block loaded from below runs after Load returns, and lands in the host.
TEST(CacheAsyncTest, PromotionHappensAfterTheLoad) {
  auto low = FaultyTier::Make(SmallLayout(kBt), 64 * SmallLayout(kBt).bytes_per_block(), "ssd");
  auto cache = Open({HostSpec(4, "dram"), InstanceSpec(low)}, WriteMode::kWriteThrough, nullptr);
  Request a(*cache, 4, 100), b(*cache, 4, 200);
  ASSERT_TRUE(cache->Store(a.tokens, a.views).ok());
  cache->Flush();  // a's host copy is pinned until the SSD has it
  ASSERT_TRUE(cache->Store(b.tokens, b.views).ok());  // a leaves the host
  cache->Flush();
  EXPECT_EQ(LookupAndLoad(*cache, a, /*expect_tier=*/1), 4u);
  cache->Flush();
  auto lk = cache->Lookup(a.tokens);
  EXPECT_EQ(lk->blocks_by_tier[0], 4u);
}

// Load of a block range of one lookup: the tail, without a second lookup.
TEST(CacheAsyncTest, LoadsABlockRangeOfALookup) {
  auto cache = Open({HostSpec(64, "dram")}, WriteMode::kWriteThrough, nullptr);
  Request a(*cache, 6, 100);
  ASSERT_TRUE(cache->Store(a.tokens, a.views).ok());
  auto lk = cache->Lookup(a.tokens);
  ASSERT_EQ(lk->hit_blocks, 6u);
  std::vector<std::vector<std::byte>> out(2, std::vector<std::byte>(a.data[0].size()));
  std::vector<MutableBlock> views(out.begin(), out.end());
  auto ld = cache->Load(*lk, 3, views);
  ASSERT_TRUE(ld.ok());
  EXPECT_EQ(ld->loaded_blocks, 2u);
  EXPECT_EQ(out[0], a.data[3]);
  EXPECT_EQ(out[1], a.data[4]);
  auto bad = cache->Load(*lk, 5, views);
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("blocks 5..7"), std::string::npos)
      << bad.status().ToString();
}

// Regression: write-back victims reached the lower tier's admission with a prefix length of 0,
// so min-prefix-tokens refused every one. A victim at chain position p carries (p + 1) blocks.
TEST(CacheAsyncTest, WriteBackVictimsCarryTheirChainPositionToAdmission) {
  TierSpec low = HostSpec(64, "dram");
  low.name = "ssd";
  low.admission.kind = AdmissionOptions::Kind::kMinPrefixTokens;
  low.admission.min_prefix_tokens = 3 * kBt;
  TierSpec top = HostSpec(4, "dram");
  top.name = "hbm";
  auto cache = Open({top, low}, WriteMode::kWriteBack, nullptr);
  Request a(*cache, 4, 100), b(*cache, 4, 200);
  ASSERT_TRUE(cache->Store(a.tokens, a.views).ok());
  ASSERT_TRUE(cache->Store(b.tokens, b.views).ok());  // a's 4 blocks are victims
  cache->Flush();
  CacheStats s = cache->stats();
  EXPECT_EQ(s.tiers[1].rejected, 2u);   // positions 0 and 1: prefixes of 4 and 8 tokens
  EXPECT_EQ(s.tiers[1].tier.puts, 2u);  // positions 2 and 3
}

// Layer-wise loads (Cache::LoadLayerwise) from a tier that reads slices.
struct LayerwiseFixture {
  std::shared_ptr<FaultyTier> low;
  std::unique_ptr<Cache> cache;
  std::unique_ptr<Request> req;
  std::vector<std::vector<std::byte>> out;
  std::vector<MutableBlock> views;
  std::mutex mu;
  std::vector<uint64_t> offsets;  // GetSlice calls, in order

  explicit LayerwiseFixture(size_t blocks = 5) {
    low = FaultyTier::Make(SmallLayout(kBt), 64 * SmallLayout(kBt).bytes_per_block(), "ssd");
    low->slices = true;
    low->on_get = [this](uint64_t off) {
      std::lock_guard<std::mutex> l(mu);
      offsets.push_back(off);
    };
    cache = Open({InstanceSpec(low)}, WriteMode::kWriteThrough, nullptr);
    req = std::make_unique<Request>(*cache, blocks, 300);
    EXPECT_TRUE(cache->Store(req->tokens, req->views).ok());
    cache->Flush();
    out.assign(blocks, std::vector<std::byte>(cache->layout().bytes_per_block()));
    views.assign(out.begin(), out.end());
    std::lock_guard<std::mutex> l(mu);
    offsets.clear();
  }
};

TEST(CacheLayerwiseTest, LayersArriveInOrderAndBlocksMatch) {
  LayerwiseFixture f;
  auto lk = f.cache->Lookup(f.req->tokens);
  ASSERT_EQ(lk->hit_blocks, 5u);
  auto load = f.cache->LoadLayerwise(*lk, 1, std::span(f.views).first(4));
  ASSERT_TRUE(load.ok()) << load.status().ToString();
  const uint32_t layers = f.cache->layout().num_layers;
  ASSERT_GT(layers, 1u);
  EXPECT_EQ((*load)->num_layers(), layers);
  EXPECT_EQ((*load)->num_blocks(), 4u);
  for (uint32_t l = 0; l < layers; ++l) EXPECT_TRUE((*load)->WaitLayer(l, kPatience).ok()) << l;
  EXPECT_EQ((*load)->WaitLayer(layers, kPatience).code(), StatusCode::kInvalidArgument);
  auto r = (*load)->Finish(kPatience);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->loaded_blocks, 4u);
  for (uint32_t i = 0; i < 4; ++i) EXPECT_EQ(f.out[i], f.req->data[1 + i]) << "block " << i;
  // One batched slice read per layer, layer 0 first.
  std::vector<uint64_t> want;
  for (uint32_t l = 0; l < layers; ++l)
    want.push_back(uint64_t{l} * f.cache->layout().layer_bytes());
  EXPECT_EQ(f.offsets, want);
  EXPECT_EQ((*load)->Finish(kPatience).status().code(), StatusCode::kInvalidArgument);
  auto bad = f.cache->LoadLayerwise(*lk, 2, std::span(f.views).first(4));
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
}

// A block is checked whole once every layer is in: one corrupt slice fails that block at
// Finish, which drops it from its tier, and the leading run stops there.
TEST(CacheLayerwiseTest, CorruptSliceFailsTheBlockAtFinish) {
  LayerwiseFixture f;
  auto lk = f.cache->Lookup(f.req->tokens);
  f.low->corrupt_reads = true;
  auto load = f.cache->LoadLayerwise(*lk, 0, f.views);
  ASSERT_TRUE(load.ok());
  auto r = (*load)->Finish(kPatience);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->loaded_blocks, 0u);
  EXPECT_EQ(r->block_status[0].code(), StatusCode::kCorruption) << r->block_status[0].ToString();
  lk = Status::NotFound("released");
  f.low->corrupt_reads = false;
  EXPECT_EQ(f.cache->Lookup(f.req->tokens)->hit_blocks, 0u);  // dropped from the index
}

// A slow tier: WaitLayer times out (the load goes on), Lookups complete meanwhile, and a load
// destroyed in flight stops without touching the buffers after.
TEST(CacheLayerwiseTest, TimeoutAndDestructionInFlight) {
  LayerwiseFixture f;
  std::promise<void> open_p;
  std::shared_future<void> opened = open_p.get_future().share();
  const uint64_t layer1 = f.cache->layout().layer_bytes();
  f.low->on_get = [&](uint64_t off) {
    if (off == layer1) opened.wait();
  };
  auto lk = f.cache->Lookup(f.req->tokens);
  auto load = f.cache->LoadLayerwise(*lk, 0, f.views);
  ASSERT_TRUE(load.ok());
  EXPECT_TRUE((*load)->WaitLayer(0, kPatience).ok());
  Status slow = (*load)->WaitLayer(1, std::chrono::milliseconds(50));
  EXPECT_EQ(slow.code(), StatusCode::kUnavailable);
  EXPECT_NE(slow.message().find("timed out"), std::string::npos) << slow.ToString();
  EXPECT_EQ(f.cache->Lookup(f.req->tokens)->hit_blocks, 5u);  // no Cache lock is held
  EXPECT_EQ((*load)->Finish(std::chrono::milliseconds(20)).status().code(),
            StatusCode::kUnavailable);
  open_p.set_value();
  (*load)->Cancel();
  auto r = (*load)->Finish(kPatience);
  ASSERT_TRUE(r.ok());
  // Cancelled before the last layer: nothing counts as loaded; or it had finished: all does.
  if (r->loaded_blocks == 0) {
    EXPECT_NE(r->block_status[0].message().find("cancelled"), std::string::npos)
        << r->block_status[0].ToString();
  } else {
    EXPECT_EQ(r->loaded_blocks, 5u);
    for (uint32_t i = 0; i < 5; ++i) EXPECT_EQ(f.out[i], f.req->data[i]);
  }
  // A second load, destroyed while its layer 1 is still being read.
  std::promise<void> open2;
  std::shared_future<void> opened2 = open2.get_future().share();
  std::promise<void> entered;
  std::atomic<bool> once{true};
  f.low->on_get = [&](uint64_t off) {
    if (off != layer1) return;
    if (once.exchange(false)) entered.set_value();
    opened2.wait();
  };
  auto load2 = f.cache->LoadLayerwise(*lk, 0, f.views);
  ASSERT_TRUE(load2.ok());
  entered.get_future().wait();
  auto destroyer = std::async(std::launch::async, [&] { load2->reset(); });
  open2.set_value();
  destroyer.wait();
}

}  // namespace
}  // namespace kvtier
