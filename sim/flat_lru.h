// FlatLru: an exact LRU over a FlatKeyMap with an intrusive doubly linked list in a node pool,
// the inner loop of the cache-only replay (tens of millions of block touches per second on one
// core). ReplayMap: the key table the replay uses elsewhere (sets and dense ids).
//
// Thread-safety: none. Ownership: values only.
#ifndef KVTIER_SIM_FLAT_LRU_H_
#define KVTIER_SIM_FLAT_LRU_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/flat_map.h"
#include "kvtier/block_key.h"

namespace kvtier::sim {

// Doubles at 1/2 load: the replay's tables are probed far more often than they change.
template <typename V>
using ReplayMap = FlatKeyMap<V, 4>;

// Exact LRU of at most capacity blocks (unbounded when infinite). Node 0 is the list sentinel:
// nodes_[0].next is the most recent block, nodes_[0].prev the least recent.
class FlatLru {
 public:
  static constexpr uint32_t kNone = UINT32_MAX;

  FlatLru(uint64_t capacity_blocks, bool infinite)
      : capacity_(capacity_blocks),
        infinite_(infinite),
        table_(infinite ? 1 << 16 : std::min<uint64_t>(capacity_blocks + 1, 1 << 22)) {
    nodes_.reserve(infinite ? 1 << 16 : std::min<uint64_t>(capacity_blocks + 2, 1 << 22));
    nodes_.push_back(Node{BlockKey{}, 0, 0});
  }

  // key's node, or kNone.
  uint32_t Find(const BlockKey& key) const {
    const uint32_t* node = table_.Find(key);
    return node ? *node : kNone;
  }
  // Starts loading key's home slot (the inner loops run a few keys ahead).
  void Prefetch(const BlockKey& key) const { __builtin_prefetch(table_.HomeSlot(key)); }
  void PrefetchNode(uint32_t node) const {
    if (node != kNone) __builtin_prefetch(&nodes_[node]);
  }
  // Whether node (from an earlier Find) still holds key: it may have been evicted and reused.
  bool Holds(uint32_t node, const BlockKey& key) const {
    return node != kNone && nodes_[node].prev != kFree && nodes_[node].key == key;
  }

  void Touch(uint32_t node) {
    Unlink(node);
    LinkFront(node);
  }

  // Inserts key (absent) as the most recent block, then evicts least recent blocks while more
  // than capacity are held. Returns the number evicted.
  uint32_t Insert(const BlockKey& key) {
    uint32_t node;
    if (!free_.empty()) {
      node = free_.back();
      free_.pop_back();
      nodes_[node].key = key;
    } else {
      node = static_cast<uint32_t>(nodes_.size());
      nodes_.push_back(Node{key, 0, 0});
    }
    LinkFront(node);
    table_.Insert(key, node);
    ++size_;
    uint32_t evicted = 0;
    while (!infinite_ && size_ > capacity_) {
      const uint32_t victim = nodes_[0].prev;
      Unlink(victim);
      table_.Erase(nodes_[victim].key);
      nodes_[victim].prev = kFree;
      free_.push_back(victim);
      --size_;
      ++evicted;
    }
    return evicted;
  }

  uint64_t size() const { return size_; }
  uint64_t memory_bytes() const {
    return table_.MemoryBytes() + nodes_.capacity() * sizeof(Node) + free_.capacity() * 4;
  }

 private:
  static constexpr uint32_t kFree = UINT32_MAX - 1;
  struct Node {
    BlockKey key;
    uint32_t prev;
    uint32_t next;
  };

  void Unlink(uint32_t n) {
    Node& node = nodes_[n];
    nodes_[node.prev].next = node.next;
    nodes_[node.next].prev = node.prev;
  }
  void LinkFront(uint32_t n) {
    const uint32_t first = nodes_[0].next;
    nodes_[n].prev = 0;
    nodes_[n].next = first;
    nodes_[first].prev = n;
    nodes_[0].next = n;
  }

  uint64_t capacity_;
  bool infinite_;
  ReplayMap<uint32_t> table_;
  std::vector<Node> nodes_;
  std::vector<uint32_t> free_;
  uint64_t size_ = 0;
};

}  // namespace kvtier::sim

#endif  // KVTIER_SIM_FLAT_LRU_H_
