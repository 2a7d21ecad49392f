#include <algorithm>
#include <atomic>

#include "common/flat_map.h"
#include "common/mutex.h"
#include "kvtier/index.h"

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
}  // namespace

// Invariants: tiers and checksum change only under the exclusive lock; pins also change
// under the shared lock through atomic_ref (relaxed: pins order nothing else, and eviction
// reads them under the exclusive lock, which excludes every shared holder).
struct BlockIndex::Shard {
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

void BlockIndex::AddTier(const BlockKey& key, int tier, uint64_t checksum) {
  Shard& s = ShardOf(key);
  WriterLock lock(&s.mu);
  IndexEntry* e = s.map.Insert(key, IndexEntry{}).first;
  e->tiers |= TierMask{1} << tier;
  if (checksum) e->checksum = checksum;
}

bool BlockIndex::RemoveTier(const BlockKey& key, int tier) {
  Shard& s = ShardOf(key);
  WriterLock lock(&s.mu);
  IndexEntry* e = s.map.Find(key);
  if (!e) return false;
  const TierMask bit = TierMask{1} << tier;
  const bool had = (e->tiers & bit) != 0;
  e->tiers &= ~bit;
  if (e->tiers == 0 && e->pins == 0) s.map.Erase(key);
  return had;
}

bool BlockIndex::TryRemoveUnpinned(const BlockKey& key, int tier) {
  Shard& s = ShardOf(key);
  WriterLock lock(&s.mu);
  IndexEntry* e = s.map.Find(key);
  if (!e || e->pins > 0) return false;
  e->tiers &= ~(TierMask{1} << tier);
  if (e->tiers == 0) s.map.Erase(key);
  return true;
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
  return true;
}

bool BlockIndex::IsPinned(const BlockKey& key) const {
  Shard& s = ShardOf(key);
  ReaderLock lock(&s.mu);
  const IndexEntry* e = s.map.Find(key);
  return e && AtomicLoad(e->pins) > 0;
}

// Below this many keys a call locks per key; from it on, every shard's lock (ascending, a fixed
// order: no lock cycles) once per chunk, which is cheaper than a lock per key.
template <typename Fn>
void BlockIndex::ForEachShared(std::span<const BlockKey> keys,
                               Fn&& fn) const KVTIER_NO_THREAD_SAFETY_ANALYSIS {
  Shard* const shards = shards_.get();
  const uint64_t shard_mask = static_cast<uint64_t>(num_shards_ - 1);
  auto shard_of = [&](const BlockKey& k) -> Shard& { return shards[(k.hi >> 32) & shard_mask]; };
  if (keys.size() < static_cast<size_t>(num_shards_) * 4) {
    for (size_t i = 0; i < keys.size(); ++i) {
      Shard& s = shard_of(keys[i]);
      ReaderLock lock(&s.mu);
      if (!fn(i, s.map.Find(keys[i]))) return;
    }
    return;
  }
  bool go = true;
  for (size_t base = 0; base < keys.size() && go; base += kMatchChunk) {
    const size_t end = std::min(keys.size(), base + kMatchChunk);
    for (int i = 0; i < num_shards_; ++i) shards[i].mu.LockShared();
    for (size_t i = base; i < end; ++i) {
      // Four keys ahead: the 1M-token table (2 MiB) does not stay in a shared machine's L2,
      // and a same-time A/B put a long Match 6% faster (medians of 16).
      if (i + 4 < end) shard_of(keys[i + 4]).map.Prefetch(keys[i + 4]);
      if (!fn(i, shard_of(keys[i]).map.Find(keys[i]))) {
        go = false;
        break;
      }
    }
    for (int i = num_shards_; i-- > 0;) shards[i].mu.UnlockShared();
  }
}

void BlockIndex::MatchImpl(std::span<const BlockKey> chain, MatchResult* result,
                           PinSet* pins) const {
  result->tier_prefix.fill(0);
  result->any_prefix = 0;
  result->masks.resize(chain.size());
  TierMask* masks = result->masks.data();
  TierMask alive = (TierMask{1} << kMaxTiers) - 1;  // tiers whose prefix is unbroken
  size_t matched = 0;
  ForEachShared(chain, [&](size_t i, const IndexEntry* e) {
    const TierMask m = e ? e->tiers : 0;
    if (m == 0) return false;
    for (TierMask broken = alive & ~m; broken; broken &= broken - 1)
      result->tier_prefix[__builtin_ctz(broken)] = static_cast<uint32_t>(i);
    alive &= m;
    masks[i] = m;
    if (pins) {
      AtomicAdd(const_cast<IndexEntry*>(e)->pins, 1);
      pins->keys_.push_back(chain[i]);
    }
    matched = i + 1;
    return true;
  });
  result->any_prefix = static_cast<uint32_t>(matched);
  result->masks.resize(matched);
  for (TierMask a = alive; a; a &= a - 1)
    result->tier_prefix[__builtin_ctz(a)] = result->any_prefix;
  if (pins) pins->index_ = const_cast<BlockIndex*>(this);
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
