// S3-FIFO (Yang et al., SOSP'23): a small probationary FIFO (10%), a main FIFO with lazy
// promotion (a 2-bit frequency, reinserted while > 0), and a ghost FIFO of keys recently
// evicted from the small queue; a ghost hit goes straight to main.
#include "policy/policies.h"

namespace kvtier {
namespace {

class S3FifoPolicy final : public ListPolicyBase {
 public:
  explicit S3FifoPolicy(uint64_t capacity)
      : ListPolicyBase(capacity * 2),
        capacity_(capacity ? capacity : 1),
        small_target_(std::max<uint64_t>(1, capacity_ / 10)) {}
  std::string_view name() const override { return "s3fifo"; }

  void OnInsert(const BlockKey& key, const AccessHint&) override {
    uint32_t n = Lookup(key);
    if (n != kNil && node(n).list != kGhost) {
      Bump(n);
      return;
    }
    if (n != kNil) {  // ghost hit: it was evicted too early
      MoveToFront(n, kMain);
      node(n).freq = 0;
      return;
    }
    NewNode(key, kSmall);
  }
  void OnAccess(const BlockKey& key, const AccessHint& hint) override {
    uint32_t n = Lookup(key);
    if (n == kNil || node(n).list == kGhost) return OnInsert(key, hint);
    Bump(n);
  }
  void OnErase(const BlockKey& key) override {
    uint32_t n = Lookup(key);
    if (n != kNil && node(n).list != kGhost) FreeNode(n);
  }
  std::optional<BlockKey> PickVictim(
      const std::function<bool(const BlockKey&)>& evictable) override {
    // Bounded passes: each reinsertion lowers a frequency, so 4 rounds settle every node.
    for (size_t guard = 0; guard < 4 * (size() + 1); ++guard) {
      bool from_small =
          list(kSmall).size > 0 && (list(kSmall).size >= small_target_ || list(kMain).size == 0);
      int l = from_small ? kSmall : kMain;
      uint32_t n = FindVictim(l, evictable);
      if (n == kNil) {
        l = from_small ? kMain : kSmall;
        n = FindVictim(l, evictable);
        if (n == kNil) return std::nullopt;
      }
      Node& x = node(n);
      if (l == kSmall) {
        if (x.freq > 0) {  // re-used while on probation: promote
          x.freq = 0;
          MoveToFront(n, kMain);
          continue;
        }
        BlockKey k = x.key;
        MoveToFront(n, kGhost);
        TrimGhost();
        return k;
      }
      if (x.freq > 0) {
        --x.freq;
        MoveToFront(n, kMain);
        continue;
      }
      BlockKey k = x.key;
      FreeNode(n);
      return k;
    }
    return std::nullopt;
  }
  size_t size() const override { return list(kSmall).size + list(kMain).size; }

 private:
  static constexpr int kSmall = 0, kMain = 1, kGhost = 2;
  void Bump(uint32_t n) {
    if (node(n).freq < 3) ++node(n).freq;
  }
  void TrimGhost() {
    while (list(kGhost).size > capacity_ - std::min(capacity_ - 1, small_target_))
      FreeNode(list(kGhost).tail);
  }
  const uint64_t capacity_;
  const uint64_t small_target_;
};

}  // namespace

std::unique_ptr<EvictionPolicy> MakeS3FifoPolicy(uint64_t capacity_blocks) {
  return std::make_unique<S3FifoPolicy>(capacity_blocks);
}

}  // namespace kvtier
