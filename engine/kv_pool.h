// KvPool: the reference engine's paged KV block pool, its stand-in for HBM (host memory; not a
// Tier, see below). It is capacity-bounded: a fixed arena of blocks, each one contiguous block
// across layers in kvtier's KvLayout (see include/kvtier/layout.h):
//   for layer l: K[block_tokens][num_kv_heads][head_dim] then V (same shape), fp32.
// Attention reads K and V straight from these blocks (paged attention), and Cache::Load writes
// loaded blocks straight into them, so a block moves between the pool and a tier in one copy.
//
// Why a pool of its own and not a Tier: a Tier only copies bytes in and out (Put/Get), while the
// engine must address its KV in place. The pool keeps a prefix map (key -> block) of its full,
// canonical blocks so a returning prefix that is still resident costs nothing, and evicts
// unreferenced ones in LRU order when it needs room, telling an eviction listener (write-back).
//
// Thread-safety: none; one engine thread owns the pool. Ownership: the pool owns the arena;
// spans it returns are valid until the pool is destroyed.
#ifndef KVTIER_ENGINE_KV_POOL_H_
#define KVTIER_ENGINE_KV_POOL_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "kvtier/block_key.h"
#include "kvtier/layout.h"
#include "kvtier/status.h"
#include "kvtier/tier.h"

namespace kvtier::engine {

using BlockId = uint32_t;

struct KvPoolStats {
  uint64_t allocations = 0;
  uint64_t evictions = 0;    // registered blocks dropped to make room
  uint64_t prefix_hits = 0;  // blocks found by Find()
  uint64_t registered = 0;   // blocks in the prefix map now
  uint64_t in_use = 0;       // blocks with a reference
  uint64_t capacity_blocks = 0;
};

class KvPool {
 public:
  // Called with a registered block that is about to be reused: its key, chain position and
  // bytes (valid only during the call).
  using EvictionListener = std::function<void(const BlockKey&, uint32_t position, ConstBlock)>;

  // InvalidArgument for a bad layout (fp32 MHA only) or zero capacity; the arena is
  // allocated and pre-faulted here, never on the hot path.
  static Result<std::unique_ptr<KvPool>> Create(const KvLayout& layout, uint64_t capacity_blocks);

  const KvLayout& layout() const { return layout_; }
  uint64_t capacity_blocks() const { return capacity_; }
  uint64_t block_bytes() const { return block_bytes_; }

  // A free block with one reference, evicting the least recently released registered block
  // when none is free. ResourceExhausted when every block is referenced.
  Result<BlockId> Allocate();
  // The registered block holding key, with one more reference; nullopt when absent.
  std::optional<BlockId> Find(const BlockKey& key);
  // Drops one reference. An unregistered block with no reference is free again; a registered
  // one stays cached, most recently used.
  void Release(BlockId id);
  // Publishes a full, canonical block under key (chain position for write-back). False (and
  // nothing changes) when the key is already registered to another block or id already has one.
  bool Register(BlockId id, const BlockKey& key, uint32_t position);
  // Drops every registered block that has no reference (a cold pool, for measurements),
  // telling the eviction listener about each.
  void DropUnreferenced();

  MutableBlock block(BlockId id) {
    return {arena_.get() + uint64_t{id} * block_bytes_, block_bytes_};
  }
  float* K(BlockId id, uint32_t layer) {
    return reinterpret_cast<float*>(arena_.get() + uint64_t{id} * block_bytes_ +
                                    uint64_t{layer} * layout_.layer_bytes());
  }
  float* V(BlockId id, uint32_t layer) {
    return reinterpret_cast<float*>(reinterpret_cast<std::byte*>(K(id, layer)) +
                                    layout_.v_offset_in_layer());
  }

  void SetEvictionListener(EvictionListener listener) { listener_ = std::move(listener); }
  KvPoolStats stats() const;

 private:
  struct Slot {
    uint32_t refs = 0;
    bool registered = false;
    BlockKey key;
    uint32_t position = 0;
    std::list<BlockId>::iterator lru_it;
  };
  struct FreeDeleter {
    void operator()(std::byte* p) const;
  };

  KvPool(const KvLayout& layout, uint64_t capacity);

  KvLayout layout_;
  uint64_t capacity_;
  uint64_t block_bytes_;
  std::unique_ptr<std::byte[], FreeDeleter> arena_;
  std::vector<Slot> slots_;
  std::vector<BlockId> free_;
  std::list<BlockId> lru_;  // registered, unreferenced; front = oldest
  std::unordered_map<BlockKey, BlockId, BlockKeyHash> map_;
  EvictionListener listener_;
  KvPoolStats stats_;
};

}  // namespace kvtier::engine

#endif  // KVTIER_ENGINE_KV_POOL_H_
