// ReuseGhosts: blocks a lower tier refused for too little reuse (admission's min_reuse),
// remembered after they leave the cache. The index counts a block's reuse only while some tier
// holds it; on agentic traces a block is mostly reused after it left a small DRAM tier, so a
// rule that waited for reuse in DRAM kept out of the SSD exactly the blocks the SSD would have
// served. A lookup that misses a remembered block counts the reuse the index could not see, and
// the block's next store offers it below with that count.
//
// Bounded: the oldest remembered block is forgotten first (it then starts from 0 again).
// Thread-safety: every method may be called from any thread (one mutex, a leaf).
#ifndef KVTIER_SRC_CACHE_REUSE_GHOSTS_H_
#define KVTIER_SRC_CACHE_REUSE_GHOSTS_H_

#include <algorithm>
#include <cstdint>
#include <deque>
#include <span>

#include "common/flat_map.h"
#include "common/mutex.h"
#include "kvtier/block_key.h"

namespace kvtier {

class ReuseGhosts {
 public:
  explicit ReuseGhosts(size_t capacity) : capacity_(std::max<size_t>(capacity, 1)) {}

  // Remembers key (a refused block), keeping the count it has.
  void Remember(const BlockKey& key) KVTIER_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    if (!counts_.Insert(key, 0).second) return;
    order_.push_back(key);
    if (order_.size() > capacity_) {
      counts_.Erase(order_.front());
      order_.pop_front();
    }
  }

  // A lookup missed keys: each remembered one was reused once more.
  void CountMisses(std::span<const BlockKey> keys) KVTIER_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    if (counts_.empty()) return;
    for (const BlockKey& k : keys)
      if (uint16_t* c = counts_.Find(k); c != nullptr && *c < UINT16_MAX) ++*c;
  }

  // The reuse counted for key since it was refused (0 when not remembered).
  uint16_t Count(const BlockKey& key) const KVTIER_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    const uint16_t* c = counts_.Find(key);
    return c ? *c : 0;
  }

 private:
  const size_t capacity_;
  mutable Mutex mu_;
  FlatKeyMap<uint16_t> counts_ KVTIER_GUARDED_BY(mu_);
  std::deque<BlockKey> order_ KVTIER_GUARDED_BY(mu_);
};

}  // namespace kvtier

#endif  // KVTIER_SRC_CACHE_REUSE_GHOSTS_H_
