// ARC (Megiddo & Modha, FAST'03): recency list T1 and frequency list T2 with ghosts B1, B2;
// a ghost hit moves the target size p of T1 toward the list that would have kept the block.
// Eviction is on demand (PickVictim), so REPLACE runs there instead of on the miss.
#include "policy/policies.h"

namespace kvtier {
namespace {

class ArcPolicy final : public ListPolicyBase {
 public:
  explicit ArcPolicy(uint64_t capacity)
      : ListPolicyBase(capacity * 2), c_(capacity ? capacity : 1) {}
  std::string_view name() const override { return "arc"; }

  void OnInsert(const BlockKey& key, const AccessHint&) override {
    uint32_t n = Lookup(key);
    if (n == kNil) {
      // A new key: keep |T1|+|B1| <= c and the directory <= 2c.
      if (list(kT1).size + list(kB1).size >= c_ && list(kB1).size > 0) FreeNode(list(kB1).tail);
      while (list(kT1).size + list(kT2).size + list(kB1).size + list(kB2).size >= 2 * c_ &&
             list(kB2).size > 0)
        FreeNode(list(kB2).tail);
      NewNode(key, kT1);
      return;
    }
    const int l = node(n).list;
    if (l == kB1) {
      p_ = std::min<double>(c_, p_ + std::max(1.0, double(list(kB2).size) / list(kB1).size));
    } else if (l == kB2) {
      p_ = std::max(0.0, p_ - std::max(1.0, double(list(kB1).size) / list(kB2).size));
    }
    MoveToFront(n, kT2);
  }
  void OnAccess(const BlockKey& key, const AccessHint& hint) override { OnInsert(key, hint); }
  void OnErase(const BlockKey& key) override {
    uint32_t n = Lookup(key);
    if (n != kNil && (node(n).list == kT1 || node(n).list == kT2)) FreeNode(n);
  }
  std::optional<BlockKey> PickVictim(
      const std::function<bool(const BlockKey&)>& evictable) override {
    bool t1_first = list(kT1).size > 0 && (list(kT1).size > p_ || list(kT2).size == 0);
    int first = t1_first ? kT1 : kT2, second = t1_first ? kT2 : kT1;
    uint32_t n = FindVictim(first, evictable);
    int l = first;
    if (n == kNil) {
      n = FindVictim(second, evictable);
      l = second;
    }
    if (n == kNil) return std::nullopt;
    BlockKey k = node(n).key;
    MoveToFront(n, l == kT1 ? kB1 : kB2);
    return k;
  }
  size_t size() const override { return list(kT1).size + list(kT2).size; }

 private:
  static constexpr int kT1 = 0, kT2 = 1, kB1 = 2, kB2 = 3;
  const uint64_t c_;
  double p_ = 0;
};

}  // namespace

std::unique_ptr<EvictionPolicy> MakeArcPolicy(uint64_t capacity_blocks) {
  return std::make_unique<ArcPolicy>(capacity_blocks);
}

}  // namespace kvtier
