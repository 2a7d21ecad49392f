#include "events/engine_hashes.h"

namespace kvtier::events {

bool EngineHashTable::Put(const BlockKey& key, std::shared_ptr<const EngineBlockHashes> h) {
  Shard& s = ShardOf(key);
  MutexLock lock(&s.mu);
  auto it = s.map.find(key);
  if (it != s.map.end()) {
    it->second = std::move(h);
    return true;
  }
  // Room is checked loosely across shards: two Puts may pass it at once (the bound is soft by
  // at most one block per shard).
  if (size_.load(std::memory_order_relaxed) >= capacity_) {
    dropped_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  s.map.emplace(key, std::move(h));
  size_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

std::shared_ptr<const EngineBlockHashes> EngineHashTable::Get(const BlockKey& key) const {
  if (size() == 0) return nullptr;
  Shard& s = ShardOf(key);
  MutexLock lock(&s.mu);
  auto it = s.map.find(key);
  return it == s.map.end() ? nullptr : it->second;
}

void EngineHashTable::Erase(const BlockKey& key) {
  if (size() == 0) return;
  Shard& s = ShardOf(key);
  MutexLock lock(&s.mu);
  if (s.map.erase(key)) size_.fetch_sub(1, std::memory_order_relaxed);
}

}  // namespace kvtier::events
