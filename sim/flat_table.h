// FlatTable: an open-addressing hash table from BlockKey to a uint32 value, and FlatLru: an
// exact LRU over it with an intrusive doubly linked list in a node pool. They are the inner loop
// of the cache-only replay (tens of millions of block touches per second on one core).
//
// Keys are XXH3-128 outputs, already uniform, so the low word is the hash. Linear probing with
// backward-shift deletion (no tombstones); the table doubles at 1/2 load.
//
// Thread-safety: none. Ownership: values only.
#ifndef KVTIER_SIM_FLAT_TABLE_H_
#define KVTIER_SIM_FLAT_TABLE_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kvtier/block_key.h"

namespace kvtier::sim {

class FlatTable {
 public:
  static constexpr uint32_t kNone = UINT32_MAX;

  explicit FlatTable(uint64_t expected = 1024) { Reset(expected); }

  void Reset(uint64_t expected) {
    uint64_t cap = 16;
    while (cap < expected * 2) cap <<= 1;
    slots_.assign(cap, Slot{});
    mask_ = cap - 1;
    size_ = 0;
  }

  // The value stored for key, or kNone.
  uint32_t Find(const BlockKey& key) const {
    for (uint64_t i = key.lo & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.value == kNone) return kNone;
      if (s.key == key) return s.value;
    }
  }

  // Starts loading key's home slot into cache (the inner loops run a few keys ahead).
  void Prefetch(const BlockKey& key) const { __builtin_prefetch(&slots_[key.lo & mask_]); }

  // Inserts or overwrites. value must not be kNone.
  void Put(const BlockKey& key, uint32_t value) {
    if ((size_ + 1) * 2 > slots_.size()) Grow();
    for (uint64_t i = key.lo & mask_;; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (s.value == kNone) {
        s.key = key;
        s.value = value;
        ++size_;
        return;
      }
      if (s.key == key) {
        s.value = value;
        return;
      }
    }
  }

  // Removes key; false when absent.
  bool Erase(const BlockKey& key) {
    uint64_t i = key.lo & mask_;
    for (;; i = (i + 1) & mask_) {
      if (slots_[i].value == kNone) return false;
      if (slots_[i].key == key) break;
    }
    // Backward-shift: pull later entries of the probe run into the hole.
    uint64_t hole = i;
    for (uint64_t j = (i + 1) & mask_;; j = (j + 1) & mask_) {
      Slot& s = slots_[j];
      if (s.value == kNone) break;
      const uint64_t home = s.key.lo & mask_;
      // Move s into the hole unless its home lies cyclically in (hole, j].
      const bool stays = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
      if (!stays) {
        slots_[hole] = s;
        hole = j;
      }
    }
    slots_[hole].value = kNone;
    --size_;
    return true;
  }

  uint64_t size() const { return size_; }
  uint64_t memory_bytes() const { return slots_.size() * sizeof(Slot); }

 private:
  struct Slot {
    BlockKey key;
    uint32_t value = kNone;
  };

  void Grow() {
    std::vector<Slot> old;
    old.swap(slots_);
    slots_.assign(old.size() * 2, Slot{});
    mask_ = slots_.size() - 1;
    size_ = 0;
    for (const Slot& s : old) {
      if (s.value != kNone) Put(s.key, s.value);
    }
  }

  std::vector<Slot> slots_;
  uint64_t mask_ = 0;
  uint64_t size_ = 0;
};

// Exact LRU of at most capacity blocks (unbounded when infinite). Node 0 is the list sentinel:
// nodes_[0].next is the most recent block, nodes_[0].prev the least recent.
class FlatLru {
 public:
  static constexpr uint32_t kNone = FlatTable::kNone;

  FlatLru(uint64_t capacity_blocks, bool infinite)
      : capacity_(capacity_blocks),
        infinite_(infinite),
        table_(infinite ? 1 << 16 : std::min<uint64_t>(capacity_blocks + 1, 1 << 22)) {
    nodes_.reserve(infinite ? 1 << 16 : std::min<uint64_t>(capacity_blocks + 2, 1 << 22));
    nodes_.push_back(Node{BlockKey{}, 0, 0});
  }

  uint32_t Find(const BlockKey& key) const { return table_.Find(key); }
  void Prefetch(const BlockKey& key) const { table_.Prefetch(key); }
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
    table_.Put(key, node);
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
    return table_.memory_bytes() + nodes_.capacity() * sizeof(Node) + free_.capacity() * 4;
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
  FlatTable table_;
  std::vector<Node> nodes_;
  std::vector<uint32_t> free_;
  uint64_t size_ = 0;
};

}  // namespace kvtier::sim

#endif  // KVTIER_SIM_FLAT_TABLE_H_
