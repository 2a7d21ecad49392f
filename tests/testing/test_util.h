// Test helpers: layouts, deterministic block contents, a temp directory, and FaultyTier, a
// fake that wraps a real HostTier and injects faults (leveldb's fault-injecting Env idea).
#ifndef KVTIER_TESTS_TESTING_TEST_UTIL_H_
#define KVTIER_TESTS_TESTING_TEST_UTIL_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "kvtier/block_key.h"
#include "kvtier/cache.h"
#include "kvtier/layout.h"
#include "kvtier/tier.h"

namespace kvtier::testing {

// Key n of key set `set`: distinct (n, set) pairs give distinct keys; key.lo is n, and key.hi
// is mixed, so keys spread over hash buckets, index shards and cluster slots.
BlockKey Key(uint64_t n, uint64_t set = 0);

// A small layout (2 layers x 2 heads x 8 dims fp32, 4 tokens/block = 512 B/block).
KvLayout SmallLayout(uint32_t block_tokens = 4);
// A block the size of a real one's page (2 layers x 2 heads x 64 dims bf16, 16 tokens/block =
// 16 KiB/block).
KvLayout Layout16KiB();
// A host tier of `blocks` blocks of SmallLayout().
TierSpec HostSpec(uint64_t blocks, std::string name = "host");
// The spec of a tier built by the test.
TierSpec InstanceSpec(std::shared_ptr<Tier> tier);

// Fills a block with bytes derived from (seed, index): equal inputs give equal bytes.
void FillBlock(std::span<std::byte> block, uint64_t seed);
std::vector<std::byte> MakeBlock(size_t bytes, uint64_t seed);

// Tokens 0..n-1 offset by `base`, so different bases give different prefixes.
std::vector<TokenId> Tokens(size_t n, uint32_t base = 0);

// A Cache of SmallLayout() blocks over `tiers`; a failed open fails the test (and returns null).
std::unique_ptr<Cache> OpenSmallCache(std::vector<TierSpec> tiers, WriteMode mode,
                                      KvEventCallback cb = nullptr, uint32_t queue_blocks = 256);

// A request of `blocks` full SmallLayout() blocks: tokens from `seed`, their keys under the
// Cache's root, and block contents that are a function of their key (FillBlock of key.lo).
struct StoredRequest {
  std::vector<TokenId> tokens;
  std::vector<BlockKey> keys;
  std::vector<std::vector<std::byte>> data;
  std::vector<ConstBlock> views;
  StoredRequest(const Cache& c, size_t blocks, TokenId seed);
};

// A fresh directory under $TMPDIR (or /tmp), removed with its contents on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Wraps a HostTier. Faults are switched on by the test between calls.
class FaultyTier final : public Tier {
 public:
  static std::shared_ptr<FaultyTier> Make(const KvLayout& layout, uint64_t capacity_bytes,
                                          std::string name = "faulty", bool verify_on_load = true);
  std::atomic<bool> corrupt_reads{false};  // flip a byte in every block read (no error)
  std::atomic<bool> fail_reads{false};     // every Get is Unavailable
  std::atomic<bool> fail_writes{false};    // every Put is Unavailable
  std::atomic<int> gets{0};
  // Called at the start of every Put (set before use): a test can hold a Put in flight.
  std::function<void()> on_put;
  // Reads slices (layer-wise loads) when set before the tier is given to a Cache.
  bool slices = false;
  // Called at the start of every Get (offset 0) and GetSlice with its offset (set before use).
  std::function<void(uint64_t offset)> on_get;

 protected:
  void PutImpl(std::span<const BlockKey> keys, std::span<const ConstBlock> blocks,
               std::span<Status> results) override;
  void GetImpl(std::span<const BlockKey> keys, std::span<const MutableBlock> out,
               std::span<Status> results) override;
  void GetSliceImpl(std::span<const BlockKey> keys, uint64_t offset,
                    std::span<const MutableBlock> out, std::span<uint64_t> checksums,
                    std::span<Status> results) override;
  Status ExistsImpl(std::span<const BlockKey> keys, std::span<bool> out) override;
  Status EraseImpl(std::span<const BlockKey> keys) override;
  uint64_t UsedBytesImpl() const override;
  TierCapabilities CapabilitiesImpl() const override;
  // One kind-specific counter, "faulty_gets" (= gets), so tests see counters reach /metrics.
  void CountersImpl(std::vector<TierStats::Counter>* out) const override;

 private:
  FaultyTier(const KvLayout& layout, uint64_t capacity, std::string name,
             std::unique_ptr<Tier> inner, bool verify_on_load);
  std::unique_ptr<Tier> inner_;
  bool verify_on_load_;
};

// A FaultyTier whose Puts wait on a latch the test opens: `entered` is ready once the first Put
// has started. Open() is idempotent; destroying it opens the latch, so a Cache draining its
// writes on destruction cannot hang on a failed test.
struct HeldPutTier {
  HeldPutTier(const KvLayout& layout, uint64_t capacity_bytes, std::string name);
  ~HeldPutTier() { Open(); }
  void Open() {
    if (!was_opened.exchange(true)) open_p.set_value();
  }
  // Opens the latch before failing, so the test ends instead of hanging.
  bool Check(bool ok) {
    if (!ok) Open();
    return ok;
  }
  std::shared_ptr<FaultyTier> tier;
  std::promise<void> entered_p, open_p;
  std::future<void> entered = entered_p.get_future();
  std::shared_future<void> opened = open_p.get_future().share();
  std::atomic<bool> first{true}, was_opened{false};
};

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_TESTING_TEST_UTIL_H_
