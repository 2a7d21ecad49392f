// Building blocks of the list-based eviction policies (LRU, S3-FIFO, ARC): a pool of nodes
// threaded on a few intrusive doubly linked lists, and one map from key to node (a FlatIdMap:
// the key lives once, in its node).
//
// Thread-safety: none (policies are serialised by their owner).
#ifndef KVTIER_SRC_POLICY_LIST_POLICY_H_
#define KVTIER_SRC_POLICY_LIST_POLICY_H_

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "common/flat_id_map.h"
#include "kvtier/policy.h"

namespace kvtier {

class ListPolicyBase : public EvictionPolicy {
 protected:
  static constexpr uint32_t kNil = UINT32_MAX;
  static constexpr int kMaxLists = 4;

  struct Node {
    BlockKey key;
    uint32_t prev = kNil;
    uint32_t next = kNil;
    uint8_t list = 0;
    uint8_t freq = 0;
  };
  struct List {
    uint32_t head = kNil;  // most recent
    uint32_t tail = kNil;  // least recent
    size_t size = 0;
  };

  // Reserves for at most 4M keys: a simulated 100 TB tier must not reserve gigabytes up front
  // (the tables still grow past it on demand).
  explicit ListPolicyBase(uint64_t expected_keys)
      : map_(std::min<uint64_t>(expected_keys, kMaxReserve)) {
    nodes_.reserve(std::min<uint64_t>(expected_keys, kMaxReserve));
  }
  static constexpr uint64_t kMaxReserve = uint64_t{1} << 22;

  // Node of key, or kNil.
  uint32_t Lookup(const BlockKey& key) const {
    static_assert(kNil == FlatIdMap::kNone);
    return map_.Find(key, [this](uint32_t n) -> const BlockKey& { return nodes_[n].key; });
  }
  uint32_t NewNode(const BlockKey& key, int list);  // pushed at the head of list
  void FreeNode(uint32_t n);                        // unlinked and unmapped
  void PushFront(uint32_t n, int list);
  void Unlink(uint32_t n);
  void MoveToFront(uint32_t n, int list) {
    Unlink(n);
    PushFront(n, list);
  }
  // From the tail of list, the first node whose key is evictable; kNil if none.
  uint32_t FindVictim(int list, const std::function<bool(const BlockKey&)>& evictable) const;

  Node& node(uint32_t n) { return nodes_[n]; }
  const List& list(int l) const { return lists_[l]; }

 private:
  std::vector<Node> nodes_;
  std::vector<uint32_t> free_nodes_;
  std::array<List, kMaxLists> lists_{};
  FlatIdMap map_;
};

}  // namespace kvtier

#endif  // KVTIER_SRC_POLICY_LIST_POLICY_H_
