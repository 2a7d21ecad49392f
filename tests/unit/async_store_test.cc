// AsyncStore: stores land after Submit returns; a full queue refuses and counts; a waiter stores
// the batches it needs itself; Close stores what is queued; per-job errors; the thread's
// priority.
#include "kvtier/async_store.h"

#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>

#include <future>
#include <thread>

#include "kvtier/cache.h"
#include "testing/test_util.h"

namespace kvtier {
namespace {

using testing::InstanceSpec;
using testing::OpenSmallCache;
using testing::SmallLayout;
using testing::StoredRequest;

constexpr auto kPatience = std::chrono::seconds(30);  // a hang fails instead of blocking CI

StoreJob JobOf(const StoredRequest& r) {
  StoreJob j;
  j.keys = r.keys;
  j.blocks = r.views;
  return j;
}

std::vector<StoreJob> BatchOf(const StoredRequest& r) {
  std::vector<StoreJob> b;
  b.push_back(JobOf(r));
  return b;
}

// A host tier whose Puts wait on a latch the test opens (the first Put says it has started).
struct HeldTier : testing::HeldPutTier {
  HeldTier() : HeldPutTier(SmallLayout(), 256 * 512, "host") {}
};

// A Cache over a HeldTier, and its AsyncStore's options at the caller's priority.
struct HeldCache {
  HeldTier held;
  std::unique_ptr<Cache> cache =
      OpenSmallCache({InstanceSpec(held.tier)}, WriteMode::kWriteThrough);
  static AsyncStoreOptions Inherit(size_t max_batches = 64) {
    AsyncStoreOptions o;
    o.max_batches = max_batches;
    o.priority = AsyncStoreOptions::Priority::kInherit;
    return o;
  }
};

void ExpectHits(KvCache& cache, const std::vector<BlockKey>& keys, uint32_t n) {
  auto hit = cache.LookupKeys(keys);
  ASSERT_TRUE(hit.ok()) << hit.status().ToString();
  EXPECT_EQ(hit->hit_blocks, n);
}

TEST(AsyncStoreTest, StoresAfterSubmitReturnsAndLookupsSeeThemAfterWaitFor) {
  auto cache = OpenSmallCache({testing::HostSpec(64)}, WriteMode::kWriteThrough);
  ASSERT_TRUE(cache);
  AsyncStore saves(*cache);
  StoredRequest r(*cache, 5, 100);
  std::promise<std::vector<Result<StoreResult>>> got;
  ASSERT_TRUE(saves.Submit(BatchOf(r), [&](std::vector<Result<StoreResult>>& results) {
    got.set_value(std::move(results));
  }));
  ASSERT_TRUE(saves.WaitFor(r.keys, kPatience));
  auto results = got.get_future().get();
  ASSERT_EQ(results.size(), 1u);
  ASSERT_TRUE(results[0].ok()) << results[0].status().ToString();
  EXPECT_EQ(results[0]->stored_blocks, 5u);
  ExpectHits(*cache, r.keys, 5);
  EXPECT_TRUE(saves.WaitIdle(kPatience));
  const AsyncStoreStats s = saves.stats();
  EXPECT_EQ(s.submitted_batches, 1u);
  EXPECT_EQ(s.stored_batches, 1u);
  EXPECT_EQ(s.pending_batches, 0u);
  EXPECT_EQ(s.dropped_batches, 0u);
}

TEST(AsyncStoreTest, FullQueueRefusesCountsAndNeverCallsDone) {
  HeldCache h;
  auto& [held, cache] = h;
  ASSERT_TRUE(cache);
  AsyncStore saves(*cache, HeldCache::Inherit(2));
  StoredRequest a(*cache, 2, 1), b(*cache, 2, 2), c(*cache, 3, 3);
  std::atomic<int> done{0};
  auto count = [&](std::vector<Result<StoreResult>>&) { ++done; };
  ASSERT_TRUE(saves.Submit(BatchOf(a), count));
  ASSERT_EQ(held.entered.wait_for(kPatience), std::future_status::ready);  // a is being stored
  ASSERT_TRUE(saves.Submit(BatchOf(b), count));
  EXPECT_FALSE(saves.Submit(BatchOf(c), [&](std::vector<Result<StoreResult>>&) { done += 100; }));
  AsyncStoreStats s = saves.stats();
  EXPECT_EQ(s.dropped_batches, 1u);
  EXPECT_EQ(s.dropped_blocks, 3u);
  EXPECT_EQ(s.pending_batches, 2u);
  held.Open();
  ASSERT_TRUE(saves.WaitIdle(kPatience));
  EXPECT_EQ(done.load(), 2);
  ExpectHits(*cache, c.keys, 0);
}

TEST(AsyncStoreTest, WaiterStoresTheQueuedBatchItNeedsAndTimesOutOnAnotherThreadsOne) {
  HeldCache h;
  auto& [held, cache] = h;
  ASSERT_TRUE(cache);
  AsyncStore saves(*cache, HeldCache::Inherit());
  StoredRequest a(*cache, 2, 1), b(*cache, 2, 2), other(*cache, 2, 3);
  auto none = [](std::vector<Result<StoreResult>>&) {};
  ASSERT_TRUE(saves.Submit(BatchOf(a), none));
  ASSERT_EQ(held.entered.wait_for(kPatience), std::future_status::ready);
  ASSERT_TRUE(saves.Submit(BatchOf(b), none));
  // Keys nobody stores: no wait at all.
  EXPECT_TRUE(saves.WaitFor(other.keys, std::chrono::milliseconds(0)));
  // a is held in the store thread's Put: the wait runs out and says so.
  EXPECT_FALSE(saves.WaitFor(a.keys, std::chrono::milliseconds(50)));
  // b is queued behind a: the waiter stores it on its own thread, once a's Put lets go.
  auto waiter = std::async(std::launch::async, [&] { return saves.WaitFor(b.keys, kPatience); });
  EXPECT_EQ(waiter.wait_for(std::chrono::milliseconds(100)), std::future_status::timeout);
  held.Open();
  ASSERT_EQ(waiter.wait_for(kPatience), std::future_status::ready);
  EXPECT_TRUE(waiter.get());
  ASSERT_TRUE(saves.WaitIdle(kPatience));
  const AsyncStoreStats s = saves.stats();
  EXPECT_EQ(s.stored_batches, 2u);
  EXPECT_EQ(s.stored_by_waiters, 1u);
  ExpectHits(*cache, b.keys, 2);
}

TEST(AsyncStoreTest, CloseStoresWhatIsQueuedThenRefuses) {
  HeldCache h;
  auto& [held, cache] = h;
  ASSERT_TRUE(cache);
  StoredRequest a(*cache, 2, 1), b(*cache, 2, 2), c(*cache, 1, 3);
  std::atomic<int> done{0};
  auto count = [&](std::vector<Result<StoreResult>>&) { ++done; };
  {
    AsyncStore saves(*cache);
    ASSERT_TRUE(saves.Submit(BatchOf(a), count));
    ASSERT_EQ(held.entered.wait_for(kPatience), std::future_status::ready);
    ASSERT_TRUE(saves.Submit(BatchOf(b), count));
    held.Open();
    saves.Close();
    EXPECT_EQ(done.load(), 2);
    EXPECT_FALSE(saves.Submit(BatchOf(c), count));
    EXPECT_EQ(saves.stats().dropped_batches, 1u);
  }
  for (const auto* r : {&a, &b}) ExpectHits(*cache, r->keys, 2);
}

TEST(AsyncStoreTest, ABadJobFailsItsOwnResultOnly) {
  auto cache = OpenSmallCache({testing::HostSpec(64)}, WriteMode::kWriteThrough);
  ASSERT_TRUE(cache);
  AsyncStore saves(*cache);
  StoredRequest good(*cache, 2, 1), bad(*cache, 3, 2);
  std::vector<StoreJob> batch;
  batch.push_back(JobOf(bad));
  batch.back().blocks.pop_back();  // 3 keys, 2 blocks
  batch.push_back(JobOf(good));
  std::promise<std::vector<Result<StoreResult>>> got;
  ASSERT_TRUE(saves.Submit(std::move(batch), [&](std::vector<Result<StoreResult>>& results) {
    got.set_value(std::move(results));
  }));
  auto results = got.get_future().get();
  ASSERT_EQ(results.size(), 2u);
  EXPECT_EQ(results[0].status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(results[0].status().message().find("3 keys and 2 blocks"), std::string::npos);
  ASSERT_TRUE(results[1].ok());
  EXPECT_EQ(results[1]->stored_blocks, 2u);
}

TEST(AsyncStoreTest, TheThreadRunsAtTheAskedPriority) {
  auto cache = OpenSmallCache({testing::HostSpec(64)}, WriteMode::kWriteThrough);
  ASSERT_TRUE(cache);
  AsyncStore idle(*cache);  // the default: SCHED_IDLE
  AsyncStoreOptions o;
  o.priority = AsyncStoreOptions::Priority::kNice;
  o.nice = 19;
  AsyncStore nice(*cache, o);
  // The id is published by the thread itself; a store that has run proves it has started.
  StoredRequest a(*cache, 1, 1), b(*cache, 1, 2);
  auto none = [](std::vector<Result<StoreResult>>&) {};
  ASSERT_TRUE(idle.Submit(BatchOf(a), none));
  ASSERT_TRUE(nice.Submit(BatchOf(b), none));
  ASSERT_TRUE(idle.WaitIdle(kPatience));
  ASSERT_TRUE(nice.WaitIdle(kPatience));
  ASSERT_GT(idle.thread_id(), 0);
  EXPECT_EQ(sched_getscheduler(idle.thread_id()), SCHED_IDLE);
  errno = 0;
  EXPECT_EQ(getpriority(PRIO_PROCESS, static_cast<id_t>(nice.thread_id())), 19);
  EXPECT_GE(idle.thread_cpu_seconds(), 0.0);
}

// Whether this process may move a thread from SCHED_IDLE back to the normal policy (root, or
// an RLIMIT_NICE that allows nice 0).
bool MayLiftIdleThreads() {
  bool ok = false;
  std::thread([&] {
    sched_param p{};
    ok = pthread_setschedparam(pthread_self(), SCHED_IDLE, &p) == 0 &&
         pthread_setschedparam(pthread_self(), SCHED_OTHER, &p) == 0;
  }).join();
  return ok;
}

TEST(AsyncStoreTest, AWaiterLiftsTheIdleStoreThreadItWaitsOnUntilItIsDone) {
  if (!MayLiftIdleThreads())
    GTEST_SKIP() << "this process may not lift a SCHED_IDLE thread (root or RLIMIT_NICE needed)";
  HeldCache h;
  auto& [held, cache] = h;
  ASSERT_TRUE(cache);
  AsyncStore saves(*cache);  // SCHED_IDLE
  StoredRequest a(*cache, 2, 1);
  ASSERT_TRUE(saves.Submit(BatchOf(a), [](std::vector<Result<StoreResult>>&) {}));
  ASSERT_EQ(held.entered.wait_for(kPatience), std::future_status::ready);
  const int tid = saves.thread_id();
  ASSERT_GT(tid, 0);
  EXPECT_EQ(sched_getscheduler(tid), SCHED_IDLE);
  auto waiter = std::async(std::launch::async, [&] { return saves.WaitFor(a.keys, kPatience); });
  const auto deadline = std::chrono::steady_clock::now() + kPatience;
  while (sched_getscheduler(tid) != SCHED_OTHER && std::chrono::steady_clock::now() < deadline)
    std::this_thread::yield();
  EXPECT_EQ(sched_getscheduler(tid), SCHED_OTHER) << "the waited-on store thread stayed idle";
  held.Open();
  ASSERT_EQ(waiter.wait_for(kPatience), std::future_status::ready);
  EXPECT_TRUE(waiter.get());
  EXPECT_EQ(sched_getscheduler(tid), SCHED_IDLE) << "no one waits: back to idle";
  ExpectHits(*cache, a.keys, 2);
}

TEST(AsyncStoreTest, KeysOfMatchesStoreAndRefusesMissingBlocks) {
  auto cache = OpenSmallCache({testing::HostSpec(64)}, WriteMode::kWriteThrough);
  ASSERT_TRUE(cache);
  StoredRequest r(*cache, 4, 7);
  auto keys = cache->KeysOf(r.tokens, 1, 3);
  ASSERT_TRUE(keys.ok());
  EXPECT_EQ(*keys, std::vector<BlockKey>(r.keys.begin() + 1, r.keys.end()));
  auto too_many = cache->KeysOf(r.tokens, 2, 3);
  EXPECT_EQ(too_many.status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvtier
