// The Cache's background writer: lower tiers are written after Store returns, from the host
// copy, while nothing waits on them; visibility, backpressure, WaitForWrites, drain and failure
// counts.
#include <gtest/gtest.h>

#include <future>
#include <mutex>

#include "kvtier/cache.h"
#include "testing/test_util.h"

namespace kvtier {
namespace {

using testing::HostSpec;
using testing::InstanceSpec;
using testing::OpenSmallCache;
using testing::StoredRequest;

using testing::FaultyTier;
using testing::FillBlock;
using testing::SmallLayout;
using testing::Tokens;

constexpr uint32_t kBt = 4;
constexpr auto kPatience = std::chrono::seconds(30);  // a hang fails instead of blocking CI

// A lower tier whose Puts wait on a latch the test opens.
struct BlockingTier : testing::HeldPutTier {
  BlockingTier() : HeldPutTier(SmallLayout(kBt), 64 * SmallLayout(kBt).bytes_per_block(), "ssd") {}
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

// Looks up r and loads every hit block, checking the bytes; returns the hit count.
uint32_t LookupAndLoad(Cache& c, const StoredRequest& r, int expect_tier = -1) {
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
TEST(CacheWriterTest, WriteThroughStoreDoesNotWaitForALowerTierPut) {
  BlockingTier low;
  Recorder rec;
  auto cache = OpenSmallCache({HostSpec(64, "dram"), InstanceSpec(low.tier)},
                              WriteMode::kWriteThrough, rec.Callback());
  StoredRequest a(*cache, 4, 100), b(*cache, 3, 200);
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
  cache->WaitForWrites();
  EXPECT_EQ(rec.Stored(1), 7);
  EXPECT_EQ(low.tier->stats().puts, 7u);
  EXPECT_EQ(cache->stats().tiers[1].write_failures, 0u);
}

// Write-back: victims go down in the background; the Store that evicted them returns while
// their Put is held, and they are found in the lower tier once it is done.
TEST(CacheWriterTest, WriteBackVictimsMoveDownWithoutBlockingTheStore) {
  BlockingTier low;
  Recorder rec;
  auto cache = OpenSmallCache({HostSpec(4, "dram"), InstanceSpec(low.tier)}, WriteMode::kWriteBack,
                              rec.Callback());
  StoredRequest a(*cache, 4, 100), b(*cache, 4, 200);
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
  cache->WaitForWrites();
  EXPECT_EQ(rec.Stored(1), 4);
  EXPECT_EQ(cache->stats().tiers[0].writebacks, 4u);
  EXPECT_EQ(LookupAndLoad(*cache, a), 4u);  // from the SSD, bytes intact
}

// A full queue makes Store wait (never unbounded growth); it goes on once the writer drains.
TEST(CacheWriterTest, FullWriteQueueAppliesBackpressure) {
  BlockingTier low;
  auto cache = OpenSmallCache({HostSpec(64, "dram"), InstanceSpec(low.tier)},
                              WriteMode::kWriteThrough, nullptr,
                              /*queue_blocks=*/2);
  StoredRequest a(*cache, 2, 100), b(*cache, 1, 200);
  ASSERT_TRUE(cache->Store(a.tokens, a.views).ok());  // 2 blocks: the queue is full
  low.entered.wait();
  auto st = std::async(std::launch::async, [&] { return cache->Store(b.tokens, b.views); });
  // The Store must still be waiting: nothing it waits on moves until the latch opens.
  EXPECT_EQ(st.wait_for(std::chrono::milliseconds(200)), std::future_status::timeout)
      << "a Store went past a full write queue";
  low.Open();
  ASSERT_EQ(st.wait_for(kPatience), std::future_status::ready);
  EXPECT_EQ(st.get()->stored_blocks, 1u);
  cache->WaitForWrites();
  EXPECT_EQ(low.tier->stats().puts, 3u);
  EXPECT_EQ(cache->stats().write_queue_waits, 1u);
}

// Queued writes pin their blocks in the host tier until written. A queue longer than half the
// host tier (256 blocks here against 8) is cut to half, so a burst meets the queue's
// backpressure before the host fills with pinned blocks; uncut, the third Store below found no
// room at all while the SSD was slow.
TEST(CacheWriterTest, WriteQueueIsCutToHalfTheHostSoABurstWaitsInsteadOfFailing) {
  BlockingTier low;
  auto cache = OpenSmallCache({HostSpec(8, "dram"), InstanceSpec(low.tier)},
                              WriteMode::kWriteThrough, nullptr, /*queue_blocks=*/256);
  StoredRequest a(*cache, 4, 100), b(*cache, 4, 200), c(*cache, 4, 300);
  ASSERT_EQ(cache->Store(a.tokens, a.views)->stored_blocks, 4u);
  low.entered.wait();  // a's write is held: its 4 blocks stay pinned in the host
  auto burst = std::async(std::launch::async, [&] {
    auto sb = cache->Store(b.tokens, b.views);
    auto sc = cache->Store(c.tokens, c.views);
    return std::pair{sb.ok() ? sb->stored_blocks : 0u, sc.ok() ? sc->stored_blocks : 0u};
  });
  EXPECT_EQ(burst.wait_for(std::chrono::milliseconds(200)), std::future_status::timeout)
      << "the burst did not wait for the held write";
  low.Open();
  ASSERT_EQ(burst.wait_for(kPatience), std::future_status::ready);
  const auto [sb, sc] = burst.get();
  EXPECT_EQ(sb, 4u);
  EXPECT_EQ(sc, 4u);
  cache->WaitForWrites();
  EXPECT_EQ(low.tier->stats().puts, 12u);
  EXPECT_GE(cache->stats().write_queue_waits, 1u);
  EXPECT_EQ(LookupAndLoad(*cache, c), 4u);
}

TEST(CacheWriterTest, FailedBackgroundWritesAreCounted) {
  auto low = FaultyTier::Make(SmallLayout(kBt), 64 * SmallLayout(kBt).bytes_per_block(), "ssd");
  low->fail_writes = true;
  Recorder rec;
  auto cache = OpenSmallCache({HostSpec(64, "dram"), InstanceSpec(low)}, WriteMode::kWriteThrough,
                              rec.Callback());
  StoredRequest a(*cache, 3, 100);
  auto st = cache->Store(a.tokens, a.views);
  EXPECT_EQ(st->stored_blocks, 3u);  // the host has them
  cache->WaitForWrites();
  EXPECT_EQ(cache->stats().tiers[1].write_failures, 3u);
  EXPECT_NE(cache->PrometheusText().find("kvtier_tier_write_failures_total{tier=\"ssd\"} 3\n"),
            std::string::npos);
  EXPECT_EQ(rec.Stored(1), 0);
}

// Destroying the Cache drains the queue: writes in flight finish into the lower tier.
TEST(CacheWriterTest, DestructionDrainsWritesInFlight) {
  BlockingTier low;
  auto cache = OpenSmallCache({HostSpec(64, "dram"), InstanceSpec(low.tier)},
                              WriteMode::kWriteThrough, nullptr);
  StoredRequest a(*cache, 2, 100), b(*cache, 3, 200);
  ASSERT_TRUE(cache->Store(a.tokens, a.views).ok());
  low.entered.wait();
  ASSERT_TRUE(cache->Store(b.tokens, b.views).ok());  // queued behind the held Put
  auto gone = std::async(std::launch::async, [&] { cache.reset(); });
  low.Open();
  ASSERT_EQ(gone.wait_for(kPatience), std::future_status::ready);
  EXPECT_EQ(low.tier->stats().puts, 5u);
}

// Promotion of a block loaded from below runs after Load returns, and lands in the host.
TEST(CacheWriterTest, PromotionHappensAfterTheLoad) {
  auto low = FaultyTier::Make(SmallLayout(kBt), 64 * SmallLayout(kBt).bytes_per_block(), "ssd");
  auto cache =
      OpenSmallCache({HostSpec(4, "dram"), InstanceSpec(low)}, WriteMode::kWriteThrough, nullptr);
  StoredRequest a(*cache, 4, 100), b(*cache, 4, 200);
  ASSERT_TRUE(cache->Store(a.tokens, a.views).ok());
  cache->WaitForWrites();  // a's host copy is pinned until the SSD has it
  ASSERT_TRUE(cache->Store(b.tokens, b.views).ok());  // a leaves the host
  cache->WaitForWrites();
  EXPECT_EQ(LookupAndLoad(*cache, a, /*expect_tier=*/1), 4u);
  cache->WaitForWrites();
  auto lk = cache->Lookup(a.tokens);
  EXPECT_EQ(lk->blocks_by_tier[0], 4u);
}

// Load of a block range of one lookup: the tail, without a second lookup.
TEST(CacheWriterTest, LoadsABlockRangeOfALookup) {
  auto cache = OpenSmallCache({HostSpec(64, "dram")}, WriteMode::kWriteThrough, nullptr);
  StoredRequest a(*cache, 6, 100);
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
TEST(CacheWriterTest, WriteBackVictimsCarryTheirChainPositionToAdmission) {
  TierSpec low = HostSpec(64, "dram");
  low.name = "ssd";
  low.admission.min_prefix_tokens = 3 * kBt;
  TierSpec top = HostSpec(4, "dram");
  top.name = "hbm";
  auto cache = OpenSmallCache({top, low}, WriteMode::kWriteBack, nullptr);
  StoredRequest a(*cache, 4, 100), b(*cache, 4, 200);
  ASSERT_TRUE(cache->Store(a.tokens, a.views).ok());
  ASSERT_TRUE(cache->Store(b.tokens, b.views).ok());  // a's 4 blocks are victims
  cache->WaitForWrites();
  CacheStats s = cache->stats();
  EXPECT_EQ(s.tiers[1].rejected, 2u);   // positions 0 and 1: prefixes of 4 and 8 tokens
  EXPECT_EQ(s.tiers[1].tier.puts, 2u);  // positions 2 and 3
}

}  // namespace
}  // namespace kvtier
