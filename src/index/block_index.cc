#include <algorithm>
#include <atomic>
#include <cstdint>

#include "common/flat_map.h"
#include "common/mutex.h"
#include "index/block_index.h"

namespace kvtier {
namespace {
// Keys per chunk of Match: the shard locks are taken once per chunk.
constexpr size_t kMatchChunk = 16384;

uint32_t AtomicAdd(uint32_t& v, int32_t delta) {
  return std::atomic_ref<uint32_t>(v).fetch_add(static_cast<uint32_t>(delta),
                                                std::memory_order_relaxed) +
         static_cast<uint32_t>(delta);
}
uint32_t AtomicLoad(const uint32_t& v) {
  return std::atomic_ref<uint32_t>(const_cast<uint32_t&>(v)).load(std::memory_order_relaxed);
}
uint16_t AtomicLoad(const uint16_t& v) {
  return std::atomic_ref<uint16_t>(const_cast<uint16_t&>(v)).load(std::memory_order_relaxed);
}
// One more hit, saturating: returns the count after it. A load and a store, not a locked
// read-modify-write (which cost 6 ns a block, +45% on a 2,000-block lookup): two lookups of one
// block at the same instant may count once, which only delays its admission by a hit.
uint16_t CountReuse(uint16_t& v) {
  std::atomic_ref<uint16_t> r(v);
  const uint16_t cur = r.load(std::memory_order_relaxed);
  if (cur == UINT16_MAX) return cur;
  r.store(static_cast<uint16_t>(cur + 1), std::memory_order_relaxed);
  return static_cast<uint16_t>(cur + 1);
}
}  // namespace

// Invariants: tiers and checksum change only under the exclusive lock; pins and reuse also
// change under the shared lock through atomic_ref (relaxed: they order nothing else, and
// eviction reads them under the exclusive lock, which excludes every shared holder).
// A cache line's multiple: no false sharing between shard locks, and a shift finds a shard.
struct alignas(64) BlockIndex::Shard {
  mutable SharedMutex mu;
  FlatKeyMap<IndexEntry, 3> map KVTIER_GUARDED_BY(mu);
};

namespace {
int RoundShards(int n) {
  int p = 1;
  while (p < n && p < 1024) p *= 2;
  return p;
}
}  // namespace

BlockIndex::BlockIndex(int num_shards)
    : shards_(new Shard[RoundShards(num_shards)]), num_shards_(RoundShards(num_shards)) {}

BlockIndex::~BlockIndex() = default;

BlockIndex::Shard& BlockIndex::ShardOf(const BlockKey& key) const {
  // hi bits pick the shard; the map hashes lo mostly, so the two stay independent.
  return shards_[(key.hi >> 32) & static_cast<uint64_t>(num_shards_ - 1)];
}

uint64_t BlockIndex::AddTier(const BlockKey& key, int tier, uint64_t checksum) {
  Shard& s = ShardOf(key);
  WriterLock lock(&s.mu);
  IndexEntry* e = s.map.Insert(key, IndexEntry{}).first;
  if (checksum) e->checksum = checksum;
  const TierMask bit = TierMask{1} << tier;
  if (e->tiers & bit) return 0;
  e->tiers |= bit;
  return changes_.fetch_add(1, std::memory_order_relaxed) + 1;
}

uint64_t BlockIndex::RemoveTier(const BlockKey& key, int tier) {
  Shard& s = ShardOf(key);
  WriterLock lock(&s.mu);
  IndexEntry* e = s.map.Find(key);
  if (!e) return 0;
  const TierMask bit = TierMask{1} << tier;
  const bool had = (e->tiers & bit) != 0;
  e->tiers &= ~bit;
  if (e->tiers == 0 && e->pins == 0) s.map.Erase(key);
  return had ? changes_.fetch_add(1, std::memory_order_relaxed) + 1 : 0;
}

std::optional<uint64_t> BlockIndex::TryRemoveUnpinned(const BlockKey& key, int tier) {
  Shard& s = ShardOf(key);
  WriterLock lock(&s.mu);
  IndexEntry* e = s.map.Find(key);
  if (!e) return 0;
  if (e->pins > 0) return std::nullopt;
  const TierMask bit = TierMask{1} << tier;
  const bool had = (e->tiers & bit) != 0;
  e->tiers &= ~bit;
  if (e->tiers == 0) s.map.Erase(key);
  return had ? changes_.fetch_add(1, std::memory_order_relaxed) + 1 : 0;
}

bool BlockIndex::Get(const BlockKey& key, IndexEntry* entry) const {
  Shard& s = ShardOf(key);
  ReaderLock lock(&s.mu);
  const IndexEntry* e = s.map.Find(key);
  if (!e) return false;
  // Field by field: pins may be changing under another shared holder.
  entry->tiers = e->tiers;
  entry->checksum = e->checksum;
  entry->pins = AtomicLoad(e->pins);
  entry->reuse = AtomicLoad(e->reuse);
  return true;
}

bool BlockIndex::IsPinned(const BlockKey& key) const {
  Shard& s = ShardOf(key);
  ReaderLock lock(&s.mu);
  const IndexEntry* e = s.map.Find(key);
  return e && AtomicLoad(e->pins) > 0;
}

// Below this many keys a call locks per key; from it on, every shard's lock (ascending, a fixed
// order: no lock cycles) once per chunk, which is cheaper than a lock per key. Returns the index
// of the key at which fn returned false, or keys.size(). Not analysed by -Wthread-safety: it
// holds every shard's lock at once, a run-time count of capabilities the analysis cannot name.
template <typename Fn>
size_t BlockIndex::ForEachShared(std::span<const BlockKey> keys,
                                 Fn&& fn) const KVTIER_NO_THREAD_SAFETY_ANALYSIS {
  Shard* const shards = shards_.get();
  const uint64_t shard_mask = static_cast<uint64_t>(num_shards_ - 1);
  auto map_of = [&](const BlockKey& k) -> const FlatKeyMap<IndexEntry, 3>& {
    return shards[(k.hi >> 32) & shard_mask].map;
  };
  const size_t n = keys.size();
  if (n < static_cast<size_t>(num_shards_) * 4) {
    for (size_t i = 0; i < n; ++i) {
      Shard& s = shards[(keys[i].hi >> 32) & shard_mask];
      ReaderLock lock(&s.mu);
      if (!fn(i, s.map.Find(keys[i]))) return i;
    }
    return n;
  }
  // Keys go in batches: the home slots of the next batch are found and prefetched while this
  // one is probed, each found once. The 1M-token table (2 MiB) does not stay in L2; batches of
  // 8, 32 and 64 were no faster than 16.
  using Map = FlatKeyMap<IndexEntry, 3>;
  constexpr size_t kBatch = 16;
  const Map::Slot* homes[2][kBatch];
  auto find_homes = [&](size_t from, size_t to, const Map::Slot** out) {
    for (size_t i = from; i < to; ++i) {
      out[i - from] = map_of(keys[i]).HomeSlot(keys[i]);
      __builtin_prefetch(out[i - from]);
    }
  };
  for (size_t base = 0; base < n; base += kMatchChunk) {
    const size_t end = std::min(n, base + kMatchChunk);
    for (int s = 0; s < num_shards_; ++s) shards[s].mu.LockShared();
    find_homes(base, std::min(end, base + kBatch), homes[0]);
    size_t stop = end;
    for (size_t b = base, cur = 0; b < end && stop == end; b += kBatch, cur ^= 1) {
      const size_t next = std::min(end, b + kBatch);
      find_homes(next, std::min(end, next + kBatch), homes[cur ^ 1]);
      for (size_t i = b; i < next; ++i) {
        const IndexEntry* e = Map::AtHome(homes[cur][i - b], keys[i]);
        if (!e) [[unlikely]]
          e = map_of(keys[i]).Find(keys[i]);
        if (!fn(i, e)) {
          stop = i;
          break;
        }
      }
    }
    for (int s = num_shards_; s-- > 0;) shards[s].mu.UnlockShared();
    if (stop < end) return stop;
  }
  return n;
}

void BlockIndex::MatchImpl(std::span<const BlockKey> chain, MatchResult* result,
                           PinSet* pins) const {
  result->tier_prefix.fill(0);
  result->masks.resize(chain.size());
  TierMask* masks = result->masks.data();
  uint64_t* sums = nullptr;
  if (result->checksums) {
    result->checksums->resize(chain.size());
    sums = result->checksums->data();
  }
  uint16_t* reuse = nullptr;
  if (result->reuse) {
    result->reuse->resize(chain.size());
    reuse = result->reuse->data();
  }
  // Per key only the mask is kept (a running AND here would carry a dependency through
  // memory from key to key); the per-tier prefixes come from the masks after. Only a pinning
  // match (a lookup) counts a reuse.
  const bool count = pins != nullptr;
  auto visit = [masks, sums, reuse, count](size_t i, const IndexEntry* e) {
    const TierMask m = e ? e->tiers : 0;
    masks[i] = m;
    if (sums && e) sums[i] = e->checksum;
    if (reuse && m != 0) {
      uint16_t& r = const_cast<IndexEntry*>(e)->reuse;
      reuse[i] = count ? CountReuse(r) : AtomicLoad(r);
    }
    return m != 0;
  };
  size_t matched;
  if (pins) {
    matched = ForEachShared(chain, [&](size_t i, const IndexEntry* e) {
      if (!visit(i, e)) return false;
      AtomicAdd(const_cast<IndexEntry*>(e)->pins, 1);
      pins->keys_.push_back(chain[i]);
      return true;
    });
    pins->index_ = const_cast<BlockIndex*>(this);
  } else {
    matched = ForEachShared(chain, visit);
  }
  result->any_prefix = static_cast<uint32_t>(matched);
  result->masks.resize(matched);
  if (sums) result->checksums->resize(matched);
  if (reuse) result->reuse->resize(matched);
  if (matched == 0) return;
  TierMask alive = masks[0];
  for (size_t i = 1; i < matched; ++i) alive &= masks[i];
  for (TierMask a = alive; a; a &= a - 1)
    result->tier_prefix[__builtin_ctz(a)] = result->any_prefix;
  // A tier in the first block but not in every one: its prefix ends at the first block without it.
  for (TierMask broken = masks[0] & ~alive; broken; broken &= broken - 1) {
    const TierMask bit = broken & (~broken + 1);
    const TierMask* gap =
        std::find_if(masks, masks + matched, [&](TierMask m) { return !(m & bit); });
    result->tier_prefix[__builtin_ctz(broken)] = static_cast<uint32_t>(gap - masks);
  }
}

void BlockIndex::Match(std::span<const BlockKey> chain, MatchResult* result) const {
  MatchImpl(chain, result, nullptr);
}

void BlockIndex::MatchAndPin(std::span<const BlockKey> chain, MatchResult* result, PinSet* pins) {
  pins->Release();
  pins->keys_.reserve(chain.size());
  MatchImpl(chain, result, pins);
}

PinSet BlockIndex::Pin(std::span<const BlockKey> keys) {
  PinSet set;
  set.index_ = this;
  set.keys_.reserve(keys.size());
  ForEachShared(keys, [&](size_t i, const IndexEntry* e) {
    if (e) {
      AtomicAdd(const_cast<IndexEntry*>(e)->pins, 1);
      set.keys_.push_back(keys[i]);
    }
    return true;
  });
  return set;
}

void BlockIndex::Unpin(std::span<const BlockKey> keys) {
  // Entries evicted while pinned (no tier left) are dropped once their last pin goes.
  std::vector<BlockKey> orphans;
  ForEachShared(keys, [&](size_t i, const IndexEntry* e) {
    if (e && AtomicAdd(const_cast<IndexEntry*>(e)->pins, -1) == 0 && e->tiers == 0)
      orphans.push_back(keys[i]);
    return true;
  });
  for (const BlockKey& k : orphans) {
    Shard& s = ShardOf(k);
    WriterLock lock(&s.mu);
    IndexEntry* e = s.map.Find(k);
    if (e && e->pins == 0 && e->tiers == 0) s.map.Erase(k);
  }
}

size_t BlockIndex::size() const {
  size_t n = 0;
  for (int i = 0; i < num_shards_; ++i) {
    ReaderLock lock(&shards_[i].mu);
    n += shards_[i].map.size();
  }
  return n;
}

void BlockIndex::Select(const std::function<bool(const BlockKey&)>& match,
                        std::vector<std::pair<BlockKey, TierMask>>* out) const {
  for (int i = 0; i < num_shards_; ++i) {
    ReaderLock lock(&shards_[i].mu);
    shards_[i].map.ForEach([&](const BlockKey& k, const IndexEntry& e) {
      if (e.tiers != 0 && match(k)) out->emplace_back(k, e.tiers);
    });
  }
}

PinSet::PinSet(PinSet&& other) noexcept : index_(other.index_), keys_(std::move(other.keys_)) {
  other.index_ = nullptr;
  other.keys_.clear();
}

PinSet& PinSet::operator=(PinSet&& other) noexcept {
  if (this != &other) {
    Release();
    index_ = other.index_;
    keys_ = std::move(other.keys_);
    other.index_ = nullptr;
    other.keys_.clear();
  }
  return *this;
}

PinSet::~PinSet() { Release(); }

void PinSet::Release() {
  if (index_ && !keys_.empty()) index_->Unpin(keys_);
  keys_.clear();
}

}  // namespace kvtier
