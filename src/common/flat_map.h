// FlatKeyMap<V>: open-addressing hash map from BlockKey to a small value, linear probing with
// backward-shift deletion (no tombstones), power-of-two capacity, load factor <= 3/4.
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

template <typename V>
class FlatKeyMap {
 public:
  explicit FlatKeyMap(size_t expected = 16) { Rehash(CapacityFor(expected)); }

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

  void Reserve(size_t n) {
    size_t want = CapacityFor(n);
    if (want > slots_.size()) Rehash(want);
  }

  V* Find(const BlockKey& key) {
    for (size_t i = Home(key);; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (!s.used) return nullptr;
      if (s.key == key) return &s.value;
    }
  }
  const V* Find(const BlockKey& key) const { return const_cast<FlatKeyMap*>(this)->Find(key); }
  bool Contains(const BlockKey& key) const { return Find(key) != nullptr; }

  void Prefetch(const BlockKey& key) const { __builtin_prefetch(&slots_[Home(key)]); }

  // Returns the value slot and whether it was newly inserted (then set to `value`).
  std::pair<V*, bool> Insert(const BlockKey& key, const V& value) {
    if ((size_ + 1) * 4 > slots_.size() * 3) Rehash(slots_.size() * 2);
    for (size_t i = Home(key);; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (!s.used) {
        s.used = true;
        s.key = key;
        s.value = value;
        ++size_;
        return {&s.value, true};
      }
      if (s.key == key) return {&s.value, false};
    }
  }

  bool Erase(const BlockKey& key) {
    size_t i = Home(key);
    for (;; i = (i + 1) & mask_) {
      if (!slots_[i].used) return false;
      if (slots_[i].key == key) break;
    }
    // Backward shift: pull later members of the probe run into the hole.
    for (size_t j = (i + 1) & mask_;; j = (j + 1) & mask_) {
      Slot& sj = slots_[j];
      if (!sj.used) break;
      size_t home = Home(sj.key);
      if (((j - home) & mask_) >= ((j - i) & mask_)) {
        slots_[i] = sj;
        i = j;
      }
    }
    slots_[i].used = false;
    --size_;
    return true;
  }

  void Clear() {
    for (Slot& s : slots_) s.used = false;
    size_ = 0;
  }

  template <typename F>
  void ForEach(F&& f) const {
    for (const Slot& s : slots_)
      if (s.used) f(s.key, s.value);
  }

  size_t MemoryBytes() const { return slots_.capacity() * sizeof(Slot); }

 private:
  struct Slot {
    BlockKey key;
    V value{};
    bool used = false;
  };

  static size_t CapacityFor(size_t n) {
    size_t cap = 16;
    while (cap * 3 < n * 4) cap *= 2;
    return cap;
  }
  size_t Home(const BlockKey& k) const {
    // One multiply of lo: keys are hash outputs already (the index picks shards by hi); the
    // multiply still spreads structured test keys like {0, i}.
    uint64_t h = k.lo * 0x9E3779B97F4A7C15ull;
    return static_cast<size_t>(h >> shift_);
  }
  void Rehash(size_t cap) {
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(cap, Slot{});
    mask_ = cap - 1;
    shift_ = 64 - __builtin_ctzll(cap);
    size_ = 0;
    for (const Slot& s : old)
      if (s.used) Insert(s.key, s.value);
  }

  std::vector<Slot> slots_;
  size_t mask_ = 0;
  int shift_ = 60;
  size_t size_ = 0;
};

}  // namespace kvtier

#endif  // KVTIER_SRC_COMMON_FLAT_MAP_H_
