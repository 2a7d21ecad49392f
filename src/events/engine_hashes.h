// EngineHashTable: the engine's own hashes (EngineBlockHashes) of the blocks a Cache holds,
// kept while the block is resident in some tier, so that every KV event of the block (stored
// in a tier, removed from it, re-announced after a clear) names it as the engine does.
//
// Bounded by a block count: past it a new block's hashes are refused (counted) and the block is
// announced with kvtier's key. Keys are the Cache's own (tenant-salted), so one tenant's
// hashes never attach to another tenant's block.
//
// Thread-safety: all methods are thread-safe (sharded mutexes).
#ifndef KVTIER_EVENTS_ENGINE_HASHES_H_
#define KVTIER_EVENTS_ENGINE_HASHES_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <unordered_map>

#include "common/mutex.h"
#include "kvtier/block_key.h"
#include "kvtier/events.h"

namespace kvtier::events {

class EngineHashTable {
 public:
  explicit EngineHashTable(uint64_t capacity_blocks) : capacity_(capacity_blocks) {}

  // Keeps h for key (replacing what was there). False, counted in dropped(), when the table
  // is full and key is not in it.
  bool Put(const BlockKey& key, std::shared_ptr<const EngineBlockHashes> h);
  // The hashes kept for key; null when none. Cheap when the table is empty.
  std::shared_ptr<const EngineBlockHashes> Get(const BlockKey& key) const;
  void Erase(const BlockKey& key);

  uint64_t size() const { return size_.load(std::memory_order_relaxed); }
  uint64_t dropped() const { return dropped_.load(std::memory_order_relaxed); }

 private:
  static constexpr size_t kShards = 16;
  struct Shard {
    mutable Mutex mu;
    std::unordered_map<BlockKey, std::shared_ptr<const EngineBlockHashes>, BlockKeyHash> map
        KVTIER_GUARDED_BY(mu);
  };
  Shard& ShardOf(const BlockKey& key) const { return shards_[key.lo % kShards]; }

  const uint64_t capacity_;
  mutable std::array<Shard, kShards> shards_;
  std::atomic<uint64_t> size_{0};
  std::atomic<uint64_t> dropped_{0};
};

}  // namespace kvtier::events

#endif  // KVTIER_EVENTS_ENGINE_HASHES_H_
