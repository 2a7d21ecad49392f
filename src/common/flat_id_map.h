// FlatIdMap: an open-addressing hash map from BlockKey to a 32-bit id, for owners that already
// keep each key in a pool indexed by that id (a policy's nodes). A slot is 8 bytes {32 bits of
// the key's hash, id} instead of FlatKeyMap's key + value (24 bytes for a uint32_t value): the
// key is read from the owner's pool only when the hash bits match. Linear probing with
// backward-shift deletion, power-of-two capacity, load factor at most 3/4. The slot's hash bits
// are also its home (capacity is at most 2^32), so growing and deleting never read the pool.
//
// Thread-safety: none; callers lock.
#ifndef KVTIER_SRC_COMMON_FLAT_ID_MAP_H_
#define KVTIER_SRC_COMMON_FLAT_ID_MAP_H_

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "kvtier/block_key.h"

namespace kvtier {

class FlatIdMap {
 public:
  static constexpr uint32_t kNone = UINT32_MAX;  // no id; never stored

  explicit FlatIdMap(size_t expected = 16) { Rehash(CapacityFor(expected)); }
  size_t size() const { return size_; }

  // The id whose key_of(id) == key, or kNone.
  template <typename KeyOf>
  uint32_t Find(const BlockKey& key, const KeyOf& key_of) const {
    const uint32_t h = Hash(key);
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.id == kNone) return kNone;
      if (s.hash == h && key_of(s.id) == key) return s.id;
    }
  }
  // Adds key -> id; the caller knows key is absent and id != kNone.
  void Insert(const BlockKey& key, uint32_t id) {
    if ((size_ + 1) * 4 > slots_.size() * 3) Rehash(slots_.size() * 2);
    Place(Slot{Hash(key), id});
    ++size_;
  }
  // Removes the entry of id, which maps key; false when there is none.
  bool Erase(const BlockKey& key, uint32_t id) {
    size_t i = Hash(key) & mask_;
    for (;; i = (i + 1) & mask_) {
      if (slots_[i].id == kNone) return false;
      if (slots_[i].id == id) break;
    }
    // Backward shift: pull later members of the probe run into the hole.
    for (size_t j = (i + 1) & mask_;; j = (j + 1) & mask_) {
      const Slot& sj = slots_[j];
      if (sj.id == kNone) break;
      const size_t home = sj.hash & mask_;
      if (((j - home) & mask_) >= ((j - i) & mask_)) {
        slots_[i] = sj;
        i = j;
      }
    }
    slots_[i] = Slot{};
    --size_;
    return true;
  }
  size_t MemoryBytes() const { return slots_.capacity() * sizeof(Slot); }

 private:
  struct Slot {
    uint32_t hash = 0;
    uint32_t id = kNone;
  };
  // As FlatKeyMap::Home: keys are hash outputs already.
  static uint32_t Hash(const BlockKey& k) { return static_cast<uint32_t>(k.lo ^ k.hi); }
  static size_t CapacityFor(size_t n) {
    size_t cap = 16;
    while (cap * 3 < n * 4) cap *= 2;
    return cap;
  }
  void Place(Slot s) {
    for (size_t i = s.hash & mask_;; i = (i + 1) & mask_) {
      if (slots_[i].id == kNone) {
        slots_[i] = s;
        return;
      }
    }
  }
  void Rehash(size_t cap) {
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(cap, Slot{});
    mask_ = cap - 1;
    for (const Slot& s : old)
      if (s.id != kNone) Place(s);
  }

  std::vector<Slot> slots_;
  size_t mask_ = 0;
  size_t size_ = 0;
};

}  // namespace kvtier

#endif  // KVTIER_SRC_COMMON_FLAT_ID_MAP_H_
