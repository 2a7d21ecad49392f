#include "engine/kv_pool.h"

#include <cstdlib>
#include <cstring>
#include <string>

namespace kvtier::engine {

void KvPool::FreeDeleter::operator()(std::byte* p) const { std::free(p); }

KvPool::KvPool(const KvLayout& layout, uint64_t capacity)
    : layout_(layout), capacity_(capacity), block_bytes_(layout.bytes_per_block()) {}

Result<std::unique_ptr<KvPool>> KvPool::Create(const KvLayout& layout, uint64_t capacity_blocks) {
  KVTIER_RETURN_IF_ERROR(layout.Validate());
  if (layout.dtype != DType::kFp32 || layout.attention != AttentionKind::kMha) {
    return Status::InvalidArgument("kv pool: layout must be fp32 mha/gqa, got " +
                                   layout.ToString());
  }
  if (capacity_blocks == 0 || capacity_blocks > (1u << 30)) {
    return Status::InvalidArgument("kv pool: capacity_blocks must be in [1, 2^30], got " +
                                   std::to_string(capacity_blocks));
  }
  std::unique_ptr<KvPool> pool(new KvPool(layout, capacity_blocks));
  const uint64_t bytes = capacity_blocks * pool->block_bytes_;
  void* mem = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (mem == nullptr) {
    return Status::ResourceExhausted("kv pool: cannot allocate " + FormatBytes(bytes));
  }
  std::memset(mem, 0, bytes);  // pre-fault once: page faults stay off the hot path
  pool->arena_.reset(static_cast<std::byte*>(mem));
  pool->slots_.resize(capacity_blocks);
  pool->free_.reserve(capacity_blocks);
  for (uint64_t i = capacity_blocks; i-- > 0;) pool->free_.push_back(static_cast<BlockId>(i));
  pool->stats_.capacity_blocks = capacity_blocks;
  return pool;
}

Result<BlockId> KvPool::Allocate() {
  BlockId id;
  if (!free_.empty()) {
    id = free_.back();
    free_.pop_back();
  } else if (!lru_.empty()) {
    id = lru_.front();
    lru_.pop_front();
    Slot& s = slots_[id];
    if (listener_) listener_(s.key, s.position, block(id));
    map_.erase(s.key);
    s.registered = false;
    ++stats_.evictions;
  } else {
    return Status::ResourceExhausted("kv pool: all " + std::to_string(capacity_) +
                                     " blocks are in use");
  }
  slots_[id].refs = 1;
  ++stats_.allocations;
  return id;
}

std::optional<BlockId> KvPool::Find(const BlockKey& key) {
  auto it = map_.find(key);
  if (it == map_.end()) return std::nullopt;
  Slot& s = slots_[it->second];
  if (s.refs++ == 0) lru_.erase(s.lru_it);
  ++stats_.prefix_hits;
  return it->second;
}

void KvPool::Release(BlockId id) {
  Slot& s = slots_[id];
  if (s.refs == 0) return;  // a double release is a caller bug; keep the pool consistent
  if (--s.refs > 0) return;
  if (s.registered) {
    s.lru_it = lru_.insert(lru_.end(), id);
  } else {
    free_.push_back(id);
  }
}

bool KvPool::Register(BlockId id, const BlockKey& key, uint32_t position) {
  Slot& s = slots_[id];
  if (s.registered || map_.count(key) != 0) return false;
  s.registered = true;
  s.key = key;
  s.position = position;
  map_.emplace(key, id);
  if (s.refs == 0) s.lru_it = lru_.insert(lru_.end(), id);
  return true;
}

void KvPool::DropUnreferenced() {
  for (BlockId id : lru_) {
    Slot& s = slots_[id];
    if (listener_) listener_(s.key, s.position, block(id));
    map_.erase(s.key);
    s.registered = false;
    free_.push_back(id);
  }
  lru_.clear();
}

KvPoolStats KvPool::stats() const {
  KvPoolStats s = stats_;
  s.registered = map_.size();
  s.in_use = capacity_ - free_.size() - lru_.size();
  return s;
}

}  // namespace kvtier::engine
