// BlockIndex: key -> the tiers where the block is resident, its pins and its checksum.
//
// Sharded open-addressing tables, one shared_mutex per shard. Match() reads a whole chain under
// shared locks taken once per chunk, so a 1M-token prefix is matched in tens of microseconds;
// lookups never wait on I/O (no tier call is made under an index lock).
//
// Thread-safety: all methods are thread-safe. Ownership: a PinSet keeps its blocks pinned until
// it is destroyed or Release()d; it must not outlive the index.
#ifndef KVTIER_INDEX_BLOCK_INDEX_H_
#define KVTIER_INDEX_BLOCK_INDEX_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "kvtier/block_key.h"
#include "kvtier/tier.h"

namespace kvtier {

using TierMask = uint32_t;  // bit t set: resident in tier t

// 16 bytes, so an index slot (key + entry) is 32 and Match touches two per cache line. A block's
// size is not kept: every block of a Cache has the layout's bytes_per_block().
struct IndexEntry {
  uint16_t tiers = 0;  // a TierMask (kMaxTiers <= 16)
  // Lookups that hit the block (MatchAndPin with MatchResult::reuse set), saturating at 65535:
  // what admission's min_reuse judges. Kept while any tier holds the block. Two lookups at the
  // same instant may count once (block_index.cc, CountReuse).
  uint16_t reuse = 0;
  uint32_t pins = 0;
  uint64_t checksum = 0;  // XXH3-64 of the bytes; 0 = not computed
};

struct MatchResult {
  // tier_prefix[t]: number of leading chain blocks all resident in tier t.
  std::array<uint32_t, kMaxTiers> tier_prefix{};
  // Leading blocks each resident in some tier (the loadable prefix).
  uint32_t any_prefix = 0;
  // masks[i] for i < any_prefix: the tiers holding block i.
  std::vector<TierMask> masks;
  // When set by the caller: (*checksums)[i] for i < any_prefix, read in the same pass.
  std::vector<uint64_t>* checksums = nullptr;
  // When set by the caller of MatchAndPin: each matched block's reuse is counted (one more hit)
  // and (*reuse)[i] for i < any_prefix is the count after it.
  std::vector<uint16_t>* reuse = nullptr;
};
static_assert(kMaxTiers <= 16, "IndexEntry::tiers holds 16 tiers");

class BlockIndex;

// Move-only set of pinned keys. Unpins on destruction.
class PinSet {
 public:
  PinSet() = default;
  PinSet(PinSet&& other) noexcept;
  PinSet& operator=(PinSet&& other) noexcept;
  PinSet(const PinSet&) = delete;
  PinSet& operator=(const PinSet&) = delete;
  ~PinSet();

  void Release();
  size_t size() const { return keys_.size(); }
  bool empty() const { return keys_.empty(); }
  std::span<const BlockKey> keys() const { return keys_; }

 private:
  friend class BlockIndex;
  BlockIndex* index_ = nullptr;
  std::vector<BlockKey> keys_;
};

class BlockIndex {
 public:
  // num_shards is rounded up to a power of two (at most 1024).
  explicit BlockIndex(int num_shards = 64);
  ~BlockIndex();
  BlockIndex(const BlockIndex&) = delete;
  BlockIndex& operator=(const BlockIndex&) = delete;

  // Every change of a tier mask is numbered 1, 2, 3, ... under the key's shard lock, so the
  // numbers of one key's changes follow the order they happened in. The Cache reports each
  // number in exactly one KV event: a consumer may wait for the next one without a gap.
  // Marks key resident in tier (creating the entry). checksum is set when non-zero. Returns the
  // change's number, or 0 when it was resident there already.
  uint64_t AddTier(const BlockKey& key, int tier, uint64_t checksum);
  // A number for a change that is not one key's (the Cache's kCleared event): every change
  // numbered before it is visible to a Select started after it.
  uint64_t TakeChange() { return changes_.fetch_add(1, std::memory_order_relaxed) + 1; }
  // Clears tier from key's mask; drops the entry when no tier and no pin remain.
  // Returns the change's number, or 0 when the key was not resident in that tier.
  uint64_t RemoveTier(const BlockKey& key, int tier);
  // Copy of the entry, or false when absent.
  bool Get(const BlockKey& key, IndexEntry* entry) const;
  bool IsPinned(const BlockKey& key) const;
  // Clears tier from key's mask unless the key is pinned; drops the entry when no tier remains.
  // The eviction primitive: check and removal are atomic. Returns nullopt when the key is
  // pinned (it stays); otherwise the change's number, or 0 when the key was not resident in
  // that tier (nothing changed, no number is taken, and the caller reports no removal).
  std::optional<uint64_t> TryRemoveUnpinned(const BlockKey& key, int tier);

  // Longest resident prefixes of chain, per tier and overall, with the per-block masks.
  void Match(std::span<const BlockKey> chain, MatchResult* result) const;
  // Match that also pins the matched prefix (any_prefix blocks) atomically with the match,
  // replacing whatever *pins held.
  void MatchAndPin(std::span<const BlockKey> chain, MatchResult* result, PinSet* pins);

  // Pins every key of `keys` that has an entry (the returned set holds those). Pinned keys are
  // never evicted by the Cache.
  PinSet Pin(std::span<const BlockKey> keys);

  size_t size() const;

  // Appends to *out every key for which match(key) is true, with its tier mask: a snapshot
  // taken one shard at a time (under that shard's shared lock; match must not call back).
  void Select(const std::function<bool(const BlockKey&)>& match,
              std::vector<std::pair<BlockKey, TierMask>>* out) const;

 private:
  friend class PinSet;
  void Unpin(std::span<const BlockKey> keys);
  void MatchImpl(std::span<const BlockKey> chain, MatchResult* result, PinSet* pins) const;
  // Calls fn(i, entry or nullptr) for keys[i] in order, under the shared lock of the key's
  // shard, until fn returns false; returns that i, or keys.size(). Long spans take every
  // shard's lock once per chunk instead of one lock per key.
  template <typename Fn>
  size_t ForEachShared(std::span<const BlockKey> keys, Fn&& fn) const;

  struct Shard;
  Shard& ShardOf(const BlockKey& key) const;
  std::unique_ptr<Shard[]> shards_;
  const int num_shards_;
  std::atomic<uint64_t> changes_{0};  // taken under a shard's writer lock
};

}  // namespace kvtier

#endif  // KVTIER_INDEX_BLOCK_INDEX_H_
