// AsyncStore: an engine's stores, off its critical path, for any KvCache (a Cache in process
// or a daemon's Client): one bounded queue and one thread per cache, for every binding.
//
//   AsyncStore saves(cache);                    // one per KvCache; outlived by the cache
//   bool queued = saves.Submit(std::move(batch), done);   // returns at once
//   saves.WaitFor(keys, timeout);               // before a lookup that needs those blocks
//
// A step copies its new blocks into buffers it owns and submits them as one batch (a StoreJob
// per request); the thread stores the batches in order while the engine computes on, and calls
// done with one result per job. The queue holds at most max_batches batches: past that, Submit
// refuses the batch and counts it (a later miss, never unbounded memory or a stalled step).
// A lookup that needs blocks still queued waits for exactly those (WaitFor): queued batches up
// to the last that holds one are stored by the waiter itself, so it never waits on a thread the
// scheduler holds back (the thread may run at SCHED_IDLE); a batch the thread is storing
// already, it waits for with the thread lifted to the normal policy until no one waits.
//
// Thread-safety: every method may be called from any thread. done runs on the thread that
// stored the batch (the store thread, a waiter in WaitFor, or the destructor), never under a
// lock of the AsyncStore; it may Submit again. On the store thread it runs at the normal
// policy, not SCHED_IDLE, where the thread may switch (root, or an RLIMIT_NICE that allows it).
#ifndef KVTIER_ASYNC_STORE_H_
#define KVTIER_ASYNC_STORE_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kvtier/block_key.h"
#include "kvtier/events.h"
#include "kvtier/kv_cache.h"
#include "kvtier/status.h"
#include "kvtier/tier.h"

namespace kvtier {

// One request's blocks of a batch: keys[i] <-> blocks[i], chain positions first_block...
struct StoreJob {
  std::vector<BlockKey> keys;
  // Borrowed: each stays valid and unchanged until the batch's done has run.
  std::vector<ConstBlock> blocks;
  uint32_t first_block = 0;
  std::string tenant;   // empty: the cache's default
  std::string lora_id;  // empty: the cache's default
  uint64_t session_id = 0;
  std::vector<EngineBlockHashes> engine_hashes;  // one per block, or empty
};

// One result per job of the batch, in order (a job's store error as its status).
using StoreDone = std::function<void(std::vector<Result<StoreResult>>& results)>;

struct AsyncStoreOptions {
  // Batches queued or being stored at most; Submit refuses more.
  size_t max_batches = 64;
  // The store thread's priority. kIdle: SCHED_IDLE, it runs on CPU time no other thread wants
  // (an engine leaves some at every step; a waiter stores what it needs itself). kNice: nice
  // level `nice` (a level below the process's own needs privilege and is left as it is).
  enum class Priority { kInherit, kNice, kIdle };
  Priority priority = Priority::kIdle;
  int nice = 10;
};

struct AsyncStoreStats {
  uint64_t submitted_batches = 0;
  uint64_t stored_batches = 0;     // done has run
  uint64_t stored_by_waiters = 0;  // of those, stored by a WaitFor caller
  uint64_t dropped_batches = 0;    // refused: the queue was full (or the store was closed)
  uint64_t dropped_blocks = 0;
  uint64_t pending_batches = 0;  // queued or being stored now
};

// Every field by its stat name ("async.dropped_blocks", ...): the one list the C API's
// kvtier_cache_stat and Python's stats() report.
std::vector<std::pair<std::string, uint64_t>> AsyncStoreFields(const AsyncStoreStats& s);

class AsyncStore {
 public:
  explicit AsyncStore(KvCache& cache, AsyncStoreOptions options = {});
  // Close(), then joins the thread.
  ~AsyncStore();
  AsyncStore(const AsyncStore&) = delete;
  AsyncStore& operator=(const AsyncStore&) = delete;

  // Queues batch; done runs once it is stored. False: the queue is full or closed, nothing was
  // queued, done never runs (counted in dropped_batches/dropped_blocks). InvalidArgument-like
  // mistakes (a job whose keys and blocks differ in number) fail that job's result, not Submit.
  bool Submit(std::vector<StoreJob> batch, StoreDone done);

  // Waits until no key of keys is queued or being stored. Queued batches up to the last one
  // holding such a key are stored by the caller; timeout bounds only the wait for batches other
  // threads are storing. False: it ran out first.
  bool WaitFor(std::span<const BlockKey> keys, std::chrono::milliseconds timeout);
  // Waits until nothing is queued or being stored; false when timeout ran out first.
  bool WaitIdle(std::chrono::milliseconds timeout);
  // Stores what is queued (on the caller's thread, if the store thread has not), then refuses
  // every later Submit. Idempotent.
  void Close();

  AsyncStoreStats stats() const;
  // The store thread's Linux thread id (0 until it has started) and CPU time so far.
  int thread_id() const;
  double thread_cpu_seconds() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvtier

#endif  // KVTIER_ASYNC_STORE_H_
