// Admission below the first tier (issue 30): by reuse (lookup hits) and by request length, in
// write-through (refused at store, written down once reused) and write-back (victims judged
// when they leave), with the counters that say why. Every wait is Cache::WaitForWrites, the
// writer's drain.
#include <gtest/gtest.h>

#include <cstdio>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "kvtier/cache.h"
#include "testing/test_util.h"
#include "workload/synthetic.h"

namespace kvtier {
namespace {

using testing::StoredRequest;
using testing::TempDir;

// A host tier of host_blocks over a disk tier with `admission`, in SmallLayout() blocks.
std::unique_ptr<Cache> OpenHostOverDisk(const std::string& dir, uint64_t host_blocks,
                                        AdmissionOptions admission, WriteMode mode,
                                        uint64_t disk_bytes = 4 << 20) {
  CacheOptions o;
  o.layout = testing::SmallLayout();
  o.model_id = "admission-test";
  o.write_mode = mode;
  const uint64_t bb = o.layout.bytes_per_block();
  TierSpec host;
  host.kind = "host";
  host.capacity_bytes = host_blocks * bb;
  host.params = {{"prefault", "false"}, {"huge_pages", "false"}, {"pin", "false"}};
  TierSpec disk;
  disk.kind = "disk";
  disk.capacity_bytes = disk_bytes;
  disk.admission = admission;
  disk.params = {{"path", dir + "/ssd"},
                 {"io", "sync"},
                 {"direct_io", "false"},
                 {"sync", "none"},
                 {"buffer_bytes", "1MiB"}};
  o.tiers = {host, disk};
  auto c = Cache::Open(o);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(c).value() : nullptr;
}

// How many of r's blocks the disk tier itself holds (asked of the tier, not the index).
size_t OnDisk(Cache& c, const StoredRequest& r) {
  std::unique_ptr<bool[]> found(new bool[r.keys.size()]);
  EXPECT_TRUE(c.tier(1).Exists(r.keys, std::span<bool>(found.get(), r.keys.size())).ok());
  size_t n = 0;
  for (size_t i = 0; i < r.keys.size(); ++i) n += found[i];
  return n;
}

uint32_t Hit(Cache& c, const StoredRequest& r) {
  auto lk = c.Lookup(r.tokens);
  EXPECT_TRUE(lk.ok());
  return lk.ok() ? lk->hit_blocks : 0;
}

TEST(CacheAdmissionTest, MinReuseWritesABlockDownOnItsSecondHitNotAtStore) {
  TempDir dir;
  AdmissionOptions a;
  a.min_reuse = 2;
  auto cache = OpenHostOverDisk(dir.path(), 64, a, WriteMode::kWriteThrough);
  ASSERT_NE(cache, nullptr);
  StoredRequest r(*cache, 4, 100);
  auto st = cache->Store(r.tokens, r.views);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->stored_blocks, 4u);
  cache->WaitForWrites();
  EXPECT_EQ(OnDisk(*cache, r), 0u) << "stored once, never reused: not written down";
  CacheStats s = cache->stats();
  EXPECT_EQ(s.tiers[1].skipped_reuse, 4u);
  EXPECT_EQ(s.tiers[1].admitted, 0u);
  EXPECT_EQ(s.tiers[1].rejected, 4u);
  EXPECT_EQ(s.tiers[1].tier.puts, 0u);

  EXPECT_EQ(Hit(*cache, r), 4u);
  cache->WaitForWrites();
  EXPECT_EQ(OnDisk(*cache, r), 0u) << "one hit is below min_reuse 2";

  EXPECT_EQ(Hit(*cache, r), 4u);
  cache->WaitForWrites();
  EXPECT_EQ(OnDisk(*cache, r), 4u) << "the second hit reaches min_reuse";
  s = cache->stats();
  EXPECT_EQ(s.tiers[1].admitted, 4u);
  EXPECT_EQ(s.tiers[1].skipped_reuse, 4u);  // the refusals at store, not counted again
  EXPECT_EQ(s.tiers[1].tier.puts, 4u);
  EXPECT_EQ(s.tiers[0].admitted, 0u);  // the first tier takes everything, uncounted

  // Later hits find it there: nothing is written again.
  EXPECT_EQ(Hit(*cache, r), 4u);
  cache->WaitForWrites();
  EXPECT_EQ(cache->stats().tiers[1].tier.puts, 4u);
  EXPECT_EQ(cache->stats().write_through_dropped_blocks, 0u);
}

// A prefix of a reused request is reused too: a longer request that hits it counts for it.
TEST(CacheAdmissionTest, ReuseIsCountedPerBlockByEveryLookupThatHitsIt) {
  TempDir dir;
  AdmissionOptions a;
  a.min_reuse = 2;
  auto cache = OpenHostOverDisk(dir.path(), 64, a, WriteMode::kWriteThrough);
  ASSERT_NE(cache, nullptr);
  StoredRequest r(*cache, 6, 100);
  ASSERT_TRUE(cache->Store(r.tokens, r.views).ok());
  StoredRequest head(*cache, 2, 100);  // the same tokens: r's first two blocks
  ASSERT_EQ(head.keys[1], r.keys[1]);
  EXPECT_EQ(Hit(*cache, head), 2u);
  EXPECT_EQ(Hit(*cache, r), 6u);
  cache->WaitForWrites();
  EXPECT_EQ(OnDisk(*cache, head), 2u);  // hit twice
  EXPECT_EQ(OnDisk(*cache, r), 2u);     // the other four once
}

TEST(CacheAdmissionTest, MinPrefixTokensSkipsShortRequestsEvenWhenReused) {
  TempDir dir;
  AdmissionOptions a;
  a.min_reuse = 1;
  a.min_prefix_tokens = 4 * testing::SmallLayout().block_tokens;
  auto cache = OpenHostOverDisk(dir.path(), 64, a, WriteMode::kWriteThrough);
  ASSERT_NE(cache, nullptr);
  StoredRequest short_req(*cache, 2, 100), long_req(*cache, 4, 200);
  ASSERT_TRUE(cache->Store(short_req.tokens, short_req.views).ok());
  ASSERT_TRUE(cache->Store(long_req.tokens, long_req.views).ok());
  cache->WaitForWrites();
  CacheStats s = cache->stats();
  EXPECT_EQ(s.tiers[1].skipped_prefix, 2u);
  EXPECT_EQ(s.tiers[1].skipped_reuse, 4u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(Hit(*cache, short_req), 2u);
    EXPECT_EQ(Hit(*cache, long_req), 4u);
  }
  cache->WaitForWrites();
  EXPECT_EQ(OnDisk(*cache, short_req), 0u) << "reused, but its request is too short";
  EXPECT_EQ(OnDisk(*cache, long_req), 4u);
  s = cache->stats();
  EXPECT_EQ(s.tiers[1].admitted, 4u);
  EXPECT_EQ(s.tiers[1].rejected, s.tiers[1].skipped_prefix + s.tiers[1].skipped_reuse);
}

// Without a rule every block goes down at store, as before.
TEST(CacheAdmissionTest, NoRuleWritesEveryBlockThroughAtStore) {
  TempDir dir;
  auto cache = OpenHostOverDisk(dir.path(), 64, AdmissionOptions{}, WriteMode::kWriteThrough);
  ASSERT_NE(cache, nullptr);
  StoredRequest r(*cache, 4, 100);
  ASSERT_TRUE(cache->Store(r.tokens, r.views).ok());
  cache->WaitForWrites();
  EXPECT_EQ(OnDisk(*cache, r), 4u);
  const CacheStats s = cache->stats();
  EXPECT_EQ(s.tiers[1].admitted, 4u);
  EXPECT_EQ(s.tiers[1].rejected, 0u);
}

TEST(CacheAdmissionTest, WriteBackVictimsGoDownOnlyWhenReusedEnough) {
  TempDir dir;
  AdmissionOptions a;
  a.min_reuse = 1;
  auto cache = OpenHostOverDisk(dir.path(), 4, a, WriteMode::kWriteBack);
  ASSERT_NE(cache, nullptr);
  StoredRequest reused(*cache, 4, 100), once(*cache, 4, 200), last(*cache, 4, 300);
  ASSERT_TRUE(cache->Store(reused.tokens, reused.views).ok());
  EXPECT_EQ(Hit(*cache, reused), 4u);
  ASSERT_TRUE(cache->Store(once.tokens, once.views).ok());  // `reused` leaves the host
  ASSERT_TRUE(cache->Store(last.tokens, last.views).ok());  // `once` leaves the host
  cache->WaitForWrites();
  EXPECT_EQ(OnDisk(*cache, reused), 4u);
  EXPECT_EQ(OnDisk(*cache, once), 0u) << "a victim never hit was written down";
  const CacheStats s = cache->stats();
  EXPECT_EQ(s.tiers[1].admitted, 4u);
  EXPECT_EQ(s.tiers[1].skipped_reuse, 4u);
  EXPECT_EQ(s.tiers[0].writebacks, 4u);
  EXPECT_EQ(s.tiers[0].evictions, 8u);
  // The written-down victims are served from the disk tier.
  auto lk = cache->Lookup(reused.tokens);
  ASSERT_TRUE(lk.ok());
  EXPECT_EQ(lk->blocks_by_tier[1], 4u);
  EXPECT_EQ(Hit(*cache, once), 0u);
}

// A block refused below and then evicted from the host is reused later, when only a miss can
// see it: that miss counts (ReuseGhosts), so its next store writes it down, and the reuse after
// that is served from the disk tier. Both write modes.
TEST(CacheAdmissionTest, AReuseAfterTheBlockLeftTheHostCountsForItsNextStore) {
  for (WriteMode mode : {WriteMode::kWriteThrough, WriteMode::kWriteBack}) {
    SCOPED_TRACE(mode == WriteMode::kWriteThrough ? "write-through" : "write-back");
    TempDir dir;
    AdmissionOptions a;
    a.min_reuse = 1;
    auto cache = OpenHostOverDisk(dir.path(), 4, a, mode);
    ASSERT_NE(cache, nullptr);
    StoredRequest r(*cache, 4, 100), other(*cache, 4, 200), third(*cache, 4, 300);
    ASSERT_TRUE(cache->Store(r.tokens, r.views).ok());
    ASSERT_TRUE(cache->Store(other.tokens, other.views).ok());  // r leaves the host, unwritten
    cache->WaitForWrites();
    EXPECT_EQ(OnDisk(*cache, r), 0u);
    EXPECT_EQ(Hit(*cache, r), 0u) << "r was never written down: its reuse is a miss";
    // Recomputed and stored again: the miss counted as its first reuse, so it goes down now
    // (write-through) or when it leaves the host again (write-back).
    ASSERT_TRUE(cache->Store(r.tokens, r.views).ok());
    cache->WaitForWrites();  // written through: no longer pinned in the host by its write
    ASSERT_TRUE(cache->Store(third.tokens, third.views).ok());  // r leaves the host again
    cache->WaitForWrites();
    EXPECT_EQ(OnDisk(*cache, r), 4u);
    EXPECT_EQ(OnDisk(*cache, other), 0u) << "never reused: never written down";
    auto lk = cache->Lookup(r.tokens);
    ASSERT_TRUE(lk.ok());
    EXPECT_EQ(lk->hit_blocks, 4u);
    EXPECT_EQ(lk->blocks_by_tier[1], 4u);
  }
}

TEST(CacheAdmissionTest, WithoutCountReuseAfterEvictionOnlyHitsCount) {
  TempDir dir;
  AdmissionOptions a;
  a.min_reuse = 1;
  a.count_reuse_after_eviction = false;
  auto cache = OpenHostOverDisk(dir.path(), 4, a, WriteMode::kWriteThrough);
  ASSERT_NE(cache, nullptr);
  StoredRequest r(*cache, 4, 100), other(*cache, 4, 200);
  ASSERT_TRUE(cache->Store(r.tokens, r.views).ok());
  ASSERT_TRUE(cache->Store(other.tokens, other.views).ok());  // r leaves the host, unwritten
  EXPECT_EQ(Hit(*cache, r), 0u);
  ASSERT_TRUE(cache->Store(r.tokens, r.views).ok());
  cache->WaitForWrites();
  EXPECT_EQ(OnDisk(*cache, r), 0u) << "the miss counted although the rule was off";
}

// The second chance never waits for the writer: with it stuck in a disk write and the queue
// full, a lookup that brings blocks to min_reuse returns at once and the write is dropped,
// counted; a later hit queues it again.
TEST(CacheAdmissionTest, AReuseWriteIntoAFullQueueIsDroppedAndCountedNotWaitedFor) {
  const KvLayout l = testing::SmallLayout();
  auto ssd = testing::FaultyTier::Make(l, 64 * l.bytes_per_block(), "ssd");
  std::promise<void> entered, open;
  std::shared_future<void> opened = open.get_future().share();
  std::atomic<bool> first{true};
  ssd->on_put = [&] {
    if (first.exchange(false)) entered.set_value();
    opened.wait();
  };
  TierSpec low = testing::InstanceSpec(ssd);
  low.admission.min_reuse = 1;
  auto cache = testing::OpenSmallCache({testing::HostSpec(64, "dram"), low},
                                       WriteMode::kWriteThrough, nullptr, /*queue_blocks=*/2);
  ASSERT_NE(cache, nullptr);
  StoredRequest stuck(*cache, 2, 100), dropped(*cache, 2, 200);
  ASSERT_TRUE(cache->Store(stuck.tokens, stuck.views).ok());
  ASSERT_TRUE(cache->Store(dropped.tokens, dropped.views).ok());
  EXPECT_EQ(Hit(*cache, stuck), 2u);  // queued: the writer takes it and is held in the Put
  if (entered.get_future().wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
    open.set_value();
    FAIL() << "the hit that reached min_reuse queued no write";
  }
  auto hit = std::async(std::launch::async, [&] { return Hit(*cache, dropped); });
  const bool returned = hit.wait_for(std::chrono::seconds(20)) == std::future_status::ready;
  open.set_value();  // before any check can return: the Cache drains its writer
  ASSERT_TRUE(returned) << "a lookup waited for the writer";
  EXPECT_EQ(hit.get(), 2u);
  cache->WaitForWrites();
  EXPECT_EQ(cache->stats().write_through_dropped_blocks, 2u);
  EXPECT_EQ(ssd->stats().puts, 2u);
  EXPECT_EQ(Hit(*cache, dropped), 2u);  // still lacking, still reused: queued again
  cache->WaitForWrites();
  EXPECT_EQ(ssd->stats().puts, 4u);
  EXPECT_EQ(cache->stats().tiers[1].admitted, 4u);
}

// One seeded synthetic agentic workload replayed through a write-through Cache whose host tier
// cannot hold it, over a disk tier with min_reuse: the bytes written to the disk tier and the
// hit rate. Each request looks up its prompt, loads the hits and stores the rest. The disk tier
// holds ~32K of these blocks (its records take a page each).
struct ReplayFigures {
  uint64_t disk_bytes = 0;
  uint64_t lookup_blocks = 0, hit_blocks = 0;
  uint64_t disk_puts = 0, disk_resident = 0, dropped = 0;
  double hit_rate() const { return lookup_blocks ? double(hit_blocks) / lookup_blocks : 0; }
};

ReplayFigures ReplaySynthetic(uint32_t min_reuse, uint64_t host_blocks, uint64_t requests) {
  TempDir dir;
  AdmissionOptions a;
  a.min_reuse = min_reuse;
  auto cache =
      OpenHostOverDisk(dir.path(), host_blocks, a, WriteMode::kWriteThrough, uint64_t{256} << 20);
  if (!cache) return {};
  workload::SyntheticOptions so;
  so.seed = 30;
  so.requests = requests;
  so.block_tokens = cache->layout().block_tokens;
  so.system_tokens = 256;
  so.first_turn_tokens = 600;
  so.growth_median_tokens = 60;
  so.max_context_tokens = 4000;
  so.compact_to_tokens = 1200;
  so.turns_mean = 12;
  so.subagent_system_tokens = 200;
  so.reuse = 0.8;
  auto stream = workload::MakeSyntheticStream(so);
  EXPECT_TRUE(stream.ok()) << stream.status().ToString();
  if (!stream.ok()) return {};
  const uint64_t bb = cache->layout().bytes_per_block();
  workload::ReplayRequest r;
  std::vector<BlockKey> keys;
  while ((*stream)->Next(&r)) {
    keys.clear();
    BlockKey k = cache->Root();
    for (uint64_t id : r.ids) keys.push_back(k = ChainKeyFromId(k, id));
    RequestOptions rq;
    rq.session_id = r.session;
    auto lk = cache->LookupKeys(keys, rq);
    EXPECT_TRUE(lk.ok());
    if (!lk.ok()) break;
    std::vector<std::byte> buf((keys.size() + 1) * bb);
    std::vector<MutableBlock> dst;
    for (uint32_t i = 0; i < lk->hit_blocks; ++i) dst.emplace_back(buf.data() + i * bb, bb);
    auto ld = cache->Load(*lk, dst);  // promotes what came from the disk
    const uint32_t from = ld.ok() ? ld->loaded_blocks : 0;
    std::vector<ConstBlock> src;
    for (size_t i = from; i < keys.size(); ++i) {
      std::span<std::byte> b(buf.data() + i * bb, bb);
      testing::FillBlock(b, keys[i].lo);
      src.emplace_back(b);
    }
    lk->pins.Release();
    EXPECT_TRUE(cache->StoreKeys(std::span(keys).subspan(from), src, from, rq).ok());
    // A writer that keeps up: the figures do not depend on this machine's scheduling (a full
    // queue drops reuse writes, and which ones depends on when the writer ran).
    cache->WaitForWrites();
  }
  cache->WaitForWrites();
  const CacheStats s = cache->stats();
  return {s.tiers[1].tier.put_bytes,
          s.lookup_blocks,
          s.hit_blocks,
          s.tiers[1].tier.puts,
          s.tiers[1].resident_blocks,
          s.write_through_dropped_blocks};
}

void PrintFigures(uint64_t host_blocks, uint32_t min_reuse, const ReplayFigures& f,
                  const ReplayFigures& base) {
  std::printf(
      "host %6llu blocks, min_reuse %u: disk %9.2f MiB (%5.1f%%), hit rate %6.2f%% (puts %llu, "
      "resident %llu, dropped %llu)\n",
      static_cast<unsigned long long>(host_blocks), min_reuse, f.disk_bytes / 1048576.0,
      base.disk_bytes ? 100.0 * f.disk_bytes / base.disk_bytes : 0, 100 * f.hit_rate(),
      static_cast<unsigned long long>(f.disk_puts),
      static_cast<unsigned long long>(f.disk_resident), static_cast<unsigned long long>(f.dropped));
}

TEST(CacheAdmissionTest, MinReuseTwoWritesFewerBytesToDiskOnASyntheticAgenticWorkload) {
  const ReplayFigures all = ReplaySynthetic(0, 8000, 400);
  const ReplayFigures reused = ReplaySynthetic(2, 8000, 400);
  PrintFigures(8000, 0, all, all);
  PrintFigures(8000, 2, reused, all);
  EXPECT_GT(all.disk_bytes, 0u);
  EXPECT_LT(reused.disk_bytes, all.disk_bytes);
  EXPECT_EQ(reused.lookup_blocks, all.lookup_blocks);  // the same requests
}

// The figures of doc/design.md, "Admission" (about a minute):
//   tests/cache_admission_test --gtest_also_run_disabled_tests --gtest_filter='*Sweep*'
TEST(CacheAdmissionTest, DISABLED_SweepHostSizeAndMinReuse) {
  for (uint64_t host_blocks : {2000u, 8000u, 32000u, 64000u}) {
    const ReplayFigures base = ReplaySynthetic(0, host_blocks, 1500);
    PrintFigures(host_blocks, 0, base, base);
    for (uint32_t r : {1u, 2u})
      PrintFigures(host_blocks, r, ReplaySynthetic(r, host_blocks, 1500), base);
  }
}

}  // namespace
}  // namespace kvtier
