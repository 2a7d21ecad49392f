// FlatKeyMap<V>: open-addressing hash map from BlockKey to a small value, linear probing with
// backward-shift deletion (no tombstones), power-of-two capacity, load factor at most
// kMaxLoadEighths/8. The all-zero key marks an empty slot, so a slot is just key + value (an
// IndexEntry slot is 32 B, two per cache line); the zero key itself lives in a side slot.
// Inserts allocate only when the table grows; Reserve() up front makes them allocation-free.
//
// Thread-safety: none; callers lock. Pointers returned by Find/Insert are invalidated by the
// next Insert that grows the table or any Erase.
#ifndef KVTIER_SRC_COMMON_FLAT_MAP_H_
#define KVTIER_SRC_COMMON_FLAT_MAP_H_

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "kvtier/block_key.h"

namespace kvtier {

// kMaxLoadEighths: 6 (3/4) by default. A lookup-heavy map takes 3: linear-probe runs get short
// enough that most lookups end at the home slot, which roughly halves a long Match.
template <typename V, int kMaxLoadEighths = 6>
class FlatKeyMap {
  static_assert(kMaxLoadEighths >= 1 && kMaxLoadEighths <= 7);

 public:
  explicit FlatKeyMap(size_t expected = 16) { Rehash(CapacityFor(expected)); }

  size_t size() const { return size_ + (zero_used_ ? 1 : 0); }
  bool empty() const { return size() == 0; }

  void Reserve(size_t n) {
    size_t want = CapacityFor(n);
    if (want > slots_.size()) Rehash(want);
  }

  V* Find(const BlockKey& key) {
    if (IsEmptyKey(key)) [[unlikely]]
      return zero_used_ ? &zero_value_ : nullptr;
    for (size_t i = Home(key);; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (s.key == key) return &s.value;
      if (IsEmptyKey(s.key)) return nullptr;
    }
  }
  const V* Find(const BlockKey& key) const { return const_cast<FlatKeyMap*>(this)->Find(key); }
  bool Contains(const BlockKey& key) const { return Find(key) != nullptr; }

  // Batched lookups (the index's Match): HomeSlot is two ALU operations and a load, so a caller can
  // prefetch the home slot some keys ahead; AtHome then answers most lookups from it, and Find
  // the rest. Both stay valid only while the table is not changed.
  struct Slot {
    BlockKey key;  // {0, 0}: empty
    V value{};
  };
  const Slot* HomeSlot(const BlockKey& key) const { return &slots_[Home(key)]; }
  // key's value when its home slot holds it; nullptr means "ask Find".
  static const V* AtHome(const Slot* home, const BlockKey& key) {
    return home->key == key && !IsEmptyKey(key) ? &home->value : nullptr;
  }

  // Returns the value slot and whether it was newly inserted (then set to `value`).
  std::pair<V*, bool> Insert(const BlockKey& key, const V& value) {
    if (IsEmptyKey(key)) [[unlikely]] {
      if (zero_used_) return {&zero_value_, false};
      zero_used_ = true;
      zero_value_ = value;
      return {&zero_value_, true};
    }
    if ((size_ + 1) * 8 > slots_.size() * kMaxLoadEighths) Rehash(slots_.size() * 2);
    for (size_t i = Home(key);; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (IsEmptyKey(s.key)) {
        s.key = key;
        s.value = value;
        ++size_;
        return {&s.value, true};
      }
      if (s.key == key) return {&s.value, false};
    }
  }

  bool Erase(const BlockKey& key) {
    if (IsEmptyKey(key)) [[unlikely]] {
      const bool had = zero_used_;
      zero_used_ = false;
      zero_value_ = V{};
      return had;
    }
    size_t i = Home(key);
    for (;; i = (i + 1) & mask_) {
      if (IsEmptyKey(slots_[i].key)) return false;
      if (slots_[i].key == key) break;
    }
    // Backward shift: pull later members of the probe run into the hole.
    for (size_t j = (i + 1) & mask_;; j = (j + 1) & mask_) {
      Slot& sj = slots_[j];
      if (IsEmptyKey(sj.key)) break;
      size_t home = Home(sj.key);
      if (((j - home) & mask_) >= ((j - i) & mask_)) {
        slots_[i] = sj;
        i = j;
      }
    }
    slots_[i] = Slot{};
    --size_;
    return true;
  }

  void Clear() {
    for (Slot& s : slots_) s = Slot{};
    size_ = 0;
    zero_used_ = false;
    zero_value_ = V{};
  }

  template <typename F>
  void ForEach(F&& f) const {
    if (zero_used_) f(BlockKey{}, zero_value_);
    for (const Slot& s : slots_)
      if (!IsEmptyKey(s.key)) f(s.key, s.value);
  }

  size_t MemoryBytes() const { return slots_.capacity() * sizeof(Slot); }

 private:
  static bool IsEmptyKey(const BlockKey& k) { return (k.lo | k.hi) == 0; }
  static size_t CapacityFor(size_t n) {
    size_t cap = 16;
    while (cap * kMaxLoadEighths < n * 8) cap *= 2;
    return cap;
  }
  // Low bits of lo ^ hi: keys are hash outputs already, so no multiply (it was a fifth of a long
  // Match's per-key work); folding in hi spreads structured keys that vary in one half only,
  // like {0, i} or {i, constant}. The index picks shards by hi's upper half, above these bits.
  size_t Home(const BlockKey& k) const { return static_cast<size_t>(k.lo ^ k.hi) & mask_; }
  void Rehash(size_t cap) {
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(cap, Slot{});
    mask_ = cap - 1;
    size_ = 0;
    for (const Slot& s : old)
      if (!IsEmptyKey(s.key)) Insert(s.key, s.value);
  }

  std::vector<Slot> slots_;
  size_t mask_ = 0;
  size_t size_ = 0;  // keys in slots_ (the zero key is counted apart)
  bool zero_used_ = false;
  V zero_value_{};
};

}  // namespace kvtier

#endif  // KVTIER_SRC_COMMON_FLAT_MAP_H_
