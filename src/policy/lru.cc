// LRU: one recency list. With the Cache touching a request's blocks last-to-first, the head
// of a chain is the most recent and the tail is evicted first.
#include "policy/policies.h"

namespace kvtier {
namespace {

class LruPolicy final : public ListPolicyBase {
 public:
  explicit LruPolicy(uint64_t capacity) : ListPolicyBase(capacity) {}
  std::string_view name() const override { return "lru"; }
  void OnInsert(const BlockKey& key, const AccessHint&) override {
    uint32_t n = Lookup(key);
    if (n == kNil)
      NewNode(key, 0);
    else
      MoveToFront(n, 0);
  }
  void OnAccess(const BlockKey& key, const AccessHint& hint) override { OnInsert(key, hint); }
  void OnAccessChain(std::span<const BlockKey> keys, AccessHint hint) override {
    // A prefix hit again before anything else was touched is already the list's head in chain
    // order, where touching it last to first would leave it: a walk instead of n moves.
    uint32_t n = list(0).head;
    size_t i = 0;
    while (i < keys.size() && n != kNil && node(n).key == keys[i]) {
      n = node(n).next;
      ++i;
    }
    if (i < keys.size()) EvictionPolicy::OnAccessChain(keys, hint);
  }
  void OnErase(const BlockKey& key) override {
    uint32_t n = Lookup(key);
    if (n != kNil) FreeNode(n);
  }
  std::optional<BlockKey> PickVictim(
      const std::function<bool(const BlockKey&)>& evictable) override {
    uint32_t n = FindVictim(0, evictable);
    if (n == kNil) return std::nullopt;
    BlockKey k = node(n).key;
    FreeNode(n);
    return k;
  }
  size_t size() const override { return list(0).size; }
};

}  // namespace

std::unique_ptr<EvictionPolicy> MakeLruPolicy(uint64_t capacity_blocks) {
  return std::make_unique<LruPolicy>(capacity_blocks);
}

}  // namespace kvtier
