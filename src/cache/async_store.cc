// AsyncStore: the one background store queue of every binding (C++, C, Python, the engine
// connectors), over any KvCache.
#include "kvtier/async_store.h"

#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <deque>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "common/mutex.h"

namespace kvtier {
namespace {

void LowerPriority(const AsyncStoreOptions& o) {
  if (o.priority == AsyncStoreOptions::Priority::kIdle) {
    sched_param p{};
    (void)pthread_setschedparam(pthread_self(), SCHED_IDLE, &p);
  } else if (o.priority == AsyncStoreOptions::Priority::kNice) {
    const auto tid = static_cast<id_t>(gettid());
    errno = 0;
    const int now = getpriority(PRIO_PROCESS, tid);
    // Raising priority needs privilege; a level the thread may not take is left as it is.
    if (o.nice > now || (errno == 0 && geteuid() == 0))
      (void)setpriority(PRIO_PROCESS, tid, o.nice);
  }
}

}  // namespace

class AsyncStore::Impl {
 public:
  Impl(KvCache& cache, AsyncStoreOptions options)
      : cache_(cache), lane_(cache.OpenStoreLane()), options_(options) {
    if (options_.max_batches == 0) options_.max_batches = 1;
    thread_ = std::thread([this] { Run(); });
  }

  ~Impl() {
    Close();
    {
      MutexLock lock(&mu_);
      stop_ = true;
      cv_.SignalAll();
    }
    thread_.join();
  }

  bool Submit(std::vector<StoreJob> batch, StoreDone done) {
    {
      MutexLock lock(&mu_);
      if (closed_ || queue_.size() + in_flight_ >= options_.max_batches) {
        ++stats_.dropped_batches;
        for (const StoreJob& j : batch) stats_.dropped_blocks += j.keys.size();
        return false;
      }
      ++stats_.submitted_batches;
      for (const StoreJob& j : batch)
        for (const BlockKey& k : j.keys) ++pending_[k];
      queue_.push_back(Item{std::move(batch), std::move(done)});
    }
    // Outside the lock: the woken thread's first act is to take it.
    cv_.SignalAll();
    return true;
  }

  bool WaitFor(std::span<const BlockKey> keys, std::chrono::milliseconds timeout) {
    const auto deadline = MonotonicNow() + timeout;
    mu_.Lock();
    bool done = true, lifting = false;
    std::unordered_set<BlockKey> want;  // built once, and only when something is pending
    while (AnyPending(keys)) {
      if (want.empty()) want.insert(keys.begin(), keys.end());
      if (QueuedHolds(want)) {
        Item item = Take();
        mu_.Unlock();
        Store(item, /*by_waiter=*/true);
        mu_.Lock();
        continue;
      }
      // The batch is in the store thread's hands. At SCHED_IDLE on busy CPUs (an engine's
      // threads spin between steps) each of its wakeups, a daemon's replies included, would
      // wait for an idle CPU while the engine's scheduler waits on it: it runs at the normal
      // policy while anyone waits.
      if (!lifting) lifting = Lift();
      if (!cv_.WaitUntil(&mu_, deadline) && MonotonicNow() >= deadline) {
        done = !AnyPending(keys);
        break;
      }
    }
    if (lifting) Drop();
    mu_.Unlock();
    return done;
  }

  bool WaitIdle(std::chrono::milliseconds timeout) {
    const auto deadline = MonotonicNow() + timeout;
    MutexLock lock(&mu_);
    while (!queue_.empty() || in_flight_ > 0)
      if (!cv_.WaitUntil(&mu_, deadline) && MonotonicNow() >= deadline)
        return queue_.empty() && in_flight_ == 0;
    return true;
  }

  void Close() {
    mu_.Lock();
    closed_ = true;
    // What is queued is stored here, not dropped: a caller's done runs for every batch it got
    // true for, and its buffers are free afterwards.
    while (!queue_.empty()) {
      Item item = Take();
      mu_.Unlock();
      Store(item, /*by_waiter=*/false);
      mu_.Lock();
    }
    while (in_flight_ > 0) cv_.Wait(&mu_);
    mu_.Unlock();
  }

  AsyncStoreStats stats() const {
    MutexLock lock(&mu_);
    AsyncStoreStats s = stats_;
    s.pending_batches = queue_.size() + in_flight_;
    return s;
  }

  int thread_id() const { return tid_.load(std::memory_order_acquire); }

  double thread_cpu_seconds() {
    clockid_t clock;
    timespec ts{};
    if (pthread_getcpuclockid(thread_.native_handle(), &clock) != 0 ||
        clock_gettime(clock, &ts) != 0)
      return 0;
    return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
  }

 private:
  struct Item {
    std::vector<StoreJob> batch;
    StoreDone done;
  };

  void Run() {
    (void)pthread_setname_np(pthread_self(), "kvtier-store");
    tid_.store(static_cast<int>(gettid()), std::memory_order_release);
    LowerPriority(options_);
    mu_.Lock();
    for (;;) {
      while (queue_.empty() && !stop_) cv_.Wait(&mu_);
      if (queue_.empty()) break;
      Item item = Take();
      mu_.Unlock();
      Store(item, /*by_waiter=*/false);
      mu_.Lock();
    }
    mu_.Unlock();
  }

  bool AnyPending(std::span<const BlockKey> keys) const KVTIER_REQUIRES(mu_) {
    if (pending_.empty()) return false;
    for (const BlockKey& k : keys)
      if (pending_.count(k)) return true;
    return false;
  }

  // Whether a queued (not yet taken) batch holds one of want: one pass over the queue's keys.
  bool QueuedHolds(const std::unordered_set<BlockKey>& want) const KVTIER_REQUIRES(mu_) {
    for (const Item& item : queue_)
      for (const StoreJob& j : item.batch)
        for (const BlockKey& k : j.keys)
          if (want.count(k)) return true;
    return false;
  }

  // The store thread at the normal policy until every Lift has its Drop: its done callbacks
  // and WaitFor callers. Only from SCHED_IDLE, and where the thread may switch back (root, or
  // an RLIMIT_NICE that allows it); false (no Drop owed) otherwise.
  bool Lift() KVTIER_REQUIRES(mu_) {
    const int tid = tid_.load(std::memory_order_acquire);  // 0 until the thread has started
    if (options_.priority != AsyncStoreOptions::Priority::kIdle || tid == 0) return false;
    sched_param p{};
    if (lifts_ == 0 && sched_setscheduler(tid, SCHED_OTHER, &p) != 0) return false;
    ++lifts_;
    return true;
  }
  void Drop() KVTIER_REQUIRES(mu_) {
    sched_param p{};
    if (--lifts_ == 0)
      (void)sched_setscheduler(tid_.load(std::memory_order_acquire), SCHED_IDLE, &p);
  }

  Item Take() KVTIER_REQUIRES(mu_) {
    ++in_flight_;
    Item item = std::move(queue_.front());
    queue_.pop_front();
    return item;
  }

  // Stores one batch taken off the queue (in_flight_ counts it) and runs its done.
  void Store(Item& item, bool by_waiter) KVTIER_EXCLUDES(mu_) {
    std::vector<Result<StoreResult>> results;
    results.reserve(item.batch.size());
    for (const StoreJob& j : item.batch) {
      if (j.keys.size() != j.blocks.size()) {
        results.push_back(Status::InvalidArgument("AsyncStore: a job has " +
                                                  std::to_string(j.keys.size()) + " keys and " +
                                                  std::to_string(j.blocks.size()) + " blocks"));
        continue;
      }
      RequestOptions rq;
      rq.tenant = j.tenant;
      rq.lora_id = j.lora_id;
      rq.session_id = j.session_id;
      rq.engine_hashes = j.engine_hashes;
      // The thread stores through its lane; a waiter, at its own priority, through the cache.
      KvCache& to = by_waiter || !lane_ ? cache_ : *lane_;
      results.push_back(to.StoreKeys(j.keys, j.blocks, j.first_block, rq));
    }
    std::vector<BlockKey> keys;
    for (const StoreJob& j : item.batch) keys.insert(keys.end(), j.keys.begin(), j.keys.end());
    if (item.done) {
      // A callback may take a lock the engine's thread waits on (Python's GIL): at SCHED_IDLE
      // on a busy CPU it would hold it until that CPU had nothing else to run (measured: vLLM's
      // step held 36-68 ms). It runs at the normal policy where the thread may switch back.
      bool lifted = false;
      if (!by_waiter) {
        MutexLock lock(&mu_);
        lifted = Lift();
      }
      item.done(results);
      if (lifted) {
        MutexLock lock(&mu_);
        Drop();
      }
    }
    item = Item{};  // the caller's captures go before a waiter sees the batch done
    MutexLock lock(&mu_);
    for (const BlockKey& k : keys) {
      auto it = pending_.find(k);
      if (it != pending_.end() && --it->second == 0) pending_.erase(it);
    }
    --in_flight_;
    ++stats_.stored_batches;
    if (by_waiter) ++stats_.stored_by_waiters;
    cv_.SignalAll();
  }

  KvCache& cache_;
  const std::unique_ptr<KvCache> lane_;  // cache_.OpenStoreLane(): the thread's own way in
  AsyncStoreOptions options_;
  mutable Mutex mu_;
  CondVar cv_;
  std::deque<Item> queue_ KVTIER_GUARDED_BY(mu_);
  std::unordered_map<BlockKey, uint32_t> pending_ KVTIER_GUARDED_BY(mu_);
  size_t in_flight_ KVTIER_GUARDED_BY(mu_) = 0;
  int lifts_ KVTIER_GUARDED_BY(mu_) = 0;  // Lift calls not yet dropped
  bool closed_ KVTIER_GUARDED_BY(mu_) = false;
  bool stop_ KVTIER_GUARDED_BY(mu_) = false;
  AsyncStoreStats stats_ KVTIER_GUARDED_BY(mu_);
  std::atomic<int> tid_{0};
  std::thread thread_;
};

std::vector<std::pair<std::string, uint64_t>> AsyncStoreFields(const AsyncStoreStats& s) {
  return {{"async.submitted_batches", s.submitted_batches},
          {"async.stored_batches", s.stored_batches},
          {"async.stored_by_waiters", s.stored_by_waiters},
          {"async.dropped_batches", s.dropped_batches},
          {"async.dropped_blocks", s.dropped_blocks},
          {"async.pending_batches", s.pending_batches}};
}

AsyncStore::AsyncStore(KvCache& cache, AsyncStoreOptions options)
    : impl_(std::make_unique<Impl>(cache, options)) {}
AsyncStore::~AsyncStore() = default;
bool AsyncStore::Submit(std::vector<StoreJob> batch, StoreDone done) {
  return impl_->Submit(std::move(batch), std::move(done));
}
bool AsyncStore::WaitFor(std::span<const BlockKey> keys, std::chrono::milliseconds timeout) {
  return impl_->WaitFor(keys, timeout);
}
bool AsyncStore::WaitIdle(std::chrono::milliseconds timeout) { return impl_->WaitIdle(timeout); }
void AsyncStore::Close() { impl_->Close(); }
AsyncStoreStats AsyncStore::stats() const { return impl_->stats(); }
int AsyncStore::thread_id() const { return impl_->thread_id(); }
double AsyncStore::thread_cpu_seconds() const { return impl_->thread_cpu_seconds(); }

}  // namespace kvtier
