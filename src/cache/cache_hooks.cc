// What the daemon does to a Cache beyond the KvCache calls (src/cache/cache_hooks.h): the shared
// host arena's reservations and commits, flush and drop.
#include <map>

#include <spdlog/spdlog.h>

#include "cache/cache_impl.h"

namespace kvtier {

size_t Cache::Impl::ReserveHost(int partition, size_t n, std::vector<uint32_t>* slots) {
  TierState& st = *tiers_[0];
  auto* host = static_cast<HostTier*>(st.tier.get());
  std::vector<PendingEvent> events;
  std::vector<Victim> victims;
  std::vector<WriteJob> down;
  size_t fit = 0;
  {
    MutexLock lock(&st.mu);
    if (!host->bounded()) {
      fit = MakeRoom(st, n, &victims);
    } else {
      // Tenant bounds: over its max_share a tenant evicts its own blocks first; others are
      // evicted for it only down to their reserved share (counted as they are picked).
      const HostTier::Usage mine = host->usage(partition);
      const uint64_t max = mine.bounds.max_slots;
      const std::function<bool(const BlockKey&)> own = [&](const BlockKey& k) {
        return host->PartitionOf(k) == partition;
      };
      const size_t over = mine.held + n > max ? mine.held + n - max : 0;
      if (over > 0) MakeRoom(st, 0, &victims, &own, over);
      // What it holds once its own victims are gone: room under its max is what it may take.
      const uint64_t held_after = mine.held - std::min<uint64_t>(mine.held, victims.size());
      const size_t want = std::min<uint64_t>(n, max > held_after ? max - held_after : 0);
      std::map<int, uint64_t> picked;
      const std::function<bool(const BlockKey&)> fair = [&](const BlockKey& k) {
        const HostTier::Usage u = host->UsageOf(k);
        if (u.partition == partition) return true;
        if (u.held - picked[u.partition] <= u.bounds.reserved_slots) return false;
        ++picked[u.partition];
        return true;
      };
      fit = want ? MakeRoom(st, want, &victims, &fair) : 0;
    }
    st.reserved += fit;
  }
  EvictOut(st, victims, &events, &down);
  EmitAll(events);
  Dispatch(std::move(down));
  const size_t got = host->ReserveSlots(partition, fit, slots);
  if (got < fit) {  // cannot happen while the policy's size is the tier's occupancy
    MutexLock lock(&st.mu);
    st.reserved -= fit - got;
  }
  return got;
}

void Cache::Impl::TouchHost(std::span<const BlockKey> keys, std::span<const uint32_t> positions,
                            uint64_t session_id) {
  TierState& st = *tiers_[0];
  const double now = MonotonicSeconds();
  const TierMask bit = TierMask{1} << st.index;
  MutexLock lock(&st.mu);
  // Last to first, resident ones only, as Store touches what it finds present.
  for (size_t i = keys.size(); i-- > 0;) {
    IndexEntry e;
    if (index_.Get(keys[i], &e) && (e.tiers & bit))
      st.policy->OnAccess(keys[i], AccessHint{session_id, positions[i], now});
  }
}

void Cache::Impl::UnreserveHost(std::span<const uint32_t> slots) {
  TierState& st = *tiers_[0];
  static_cast<HostTier*>(st.tier.get())->ReleaseSlots(slots);
  MutexLock lock(&st.mu);
  st.reserved -= slots.size();
}

StoreResult Cache::Impl::CommitHost(std::span<const BlockKey> keys, std::span<const uint32_t> slots,
                                    std::span<const uint64_t> checksums, uint32_t first_block,
                                    uint64_t session_id, std::span<EngineBlockHashes> engine) {
  const uint64_t t0 = MonotonicNs();
  // The server pairs them up (one per key or none); a mismatch keeps no hashes.
  (void)KeepEngineHashes(keys, engine);
  TierState& st = *tiers_[0];
  auto* host = static_cast<HostTier*>(st.tier.get());
  StoreResult r;
  std::vector<PendingEvent> events;
  const bool lower = options_.write_mode == WriteMode::kWriteThrough && tiers_.size() > 1;
  const uint64_t prefix_tokens =
      (uint64_t{first_block} + keys.size()) * options_.layout.block_tokens;
  BlockBatch b;
  b.now_s = MonotonicSeconds();
  for (size_t j = 0; j < keys.size(); ++j)
    b.Add(keys[j], ConstBlock(host->SlotPtr(slots[j]), host->block_bytes()), checksums[j],
          first_block + static_cast<uint32_t>(j), prefix_tokens, session_id);
  // Synchronous writes: lower tiers first, from the still-reserved slots: nobody can evict or
  // reuse a reserved slot, so the bytes written down are the bytes committed.
  if (lower && !async_) {
    std::vector<Status> results(keys.size());
    std::vector<WriteJob> down;
    for (size_t t = 1; t < tiers_.size(); ++t) {
      uint32_t stored = 0;
      StoreToTier(*tiers_[t], b, results, &stored, &events, &down);
    }
    RunJobs(down);
  }
  std::unique_ptr<bool[]> published(new bool[keys.size()]);
  host->PublishSlots(keys, slots, std::span<bool>(published.get(), keys.size()));
  {
    MutexLock lock(&st.mu);
    st.reserved -= keys.size();
    for (size_t j = keys.size(); j-- > 0;) {
      st.policy->OnInsert(keys[j], AccessHint{session_id, b.positions[j], b.now_s});
      if (st.tracks_positions) st.positions.Insert(keys[j], b.positions[j]);
      if (!published[j]) {
        ++r.present_blocks;
        continue;
      }
      const uint64_t change = index_.AddTier(keys[j], st.index, checksums[j]);
      events.push_back({KvEvent::Type::kStored, keys[j], st.index, change});
      ++r.stored_blocks;
    }
  }
  EmitAll(events);
  if (lower && async_) {
    // In the background, from tier 0's copy, pinned until written: only what some lower tier
    // admits now (QueueBelow's rule; a lookup hit may queue the rest later, QueueReused).
    const int last = static_cast<int>(tiers_.size()) - 1;
    WriteJob job;
    job.pins = index_.Pin(keys);
    for (size_t j = 0; j < keys.size(); ++j) {
      IndexEntry e;
      if (!index_.Get(keys[j], &e) || !(e.tiers & 1)) continue;   // evicted before the pin
      if ((e.tiers >> 1) == (TierMask{1} << last) - 1) continue;  // every lower tier has it
      if (!WantedBelow(keys[j], 1, last, e.tiers, e.reuse, prefix_tokens)) continue;
      job.batch.Add(keys[j], ConstBlock(), checksums[j], b.positions[j], prefix_tokens, session_id,
                    e.reuse);
      job.from.push_back(0);
    }
    job.pins = index_.Pin(job.batch.keys);
    job.batch.now_s = b.now_s;
    job.first_target = 1;
    job.last_target = last;
    // Never waits for the writer: a commit that waited on a slow SSD or Redis ran past the
    // client's deadline, and the client dropped its leases and stores. A full queue drops the
    // write-through instead (counted): the blocks stay in the arena, unpinned, so they stay
    // evictable and the next reserve finds room (what the queue's cut in OpenTiers is for).
    const size_t n = job.batch.size();
    if (n > 0 && !Enqueue(std::move(job), /*wait=*/false)) {
      write_through_dropped_.fetch_add(n, std::memory_order_relaxed);
      if (write_through_log_.Allow()) {
        spdlog::warn(
            "cache: the write queue is full (lower tiers slower than commits): {} blocks kept in "
            "{} only, not written through (said at most every {} s; counted in "
            "kvtier_write_through_dropped_blocks_total)",
            n, st.tier->name(), LogLimiter::kIntervalS);
      }
    }
  }
  stores_.fetch_add(1, std::memory_order_relaxed);
  stored_blocks_.fetch_add(r.stored_blocks, std::memory_order_relaxed);
  store_latency_.Record(MonotonicNs() - t0);
  return r;
}

uint64_t Cache::Impl::ClearManaged() {
  uint64_t dropped = 0;
  auto evictable = [this](const BlockKey& k) { return !index_.IsPinned(k); };
  for (auto& stp : tiers_) {
    TierState& st = *stp;
    if (!st.caps.managed_by_cache) continue;
    std::vector<BlockKey> gone;
    std::vector<uint64_t> changes;
    {
      MutexLock lock(&st.mu);
      size_t skipped = 0;
      while (skipped < 64) {
        std::optional<BlockKey> victim = st.policy->PickVictim(evictable);
        if (!victim) break;
        const std::optional<uint64_t> change = index_.TryRemoveUnpinned(*victim, st.index);
        if (!change) {
          st.policy->OnInsert(*victim, AccessHint{});
          ++skipped;
          continue;
        }
        st.positions.Erase(*victim);
        gone.push_back(*victim);
        changes.push_back(*change);
      }
      st.reserved += gone.size();  // occupied until erased below
    }
    (void)st.tier->Erase(gone);
    {
      MutexLock lock(&st.mu);
      st.reserved -= gone.size();
    }
    dropped += gone.size();
    EmitRemoved(st, gone, changes);
  }
  // Routers learn of a flush as vLLM's AllBlocksCleared, then what survived it (pinned blocks,
  // the disk and remote tiers) again.
  EmitCleared();
  return dropped;
}

uint64_t Cache::Impl::DropMatching(const std::function<bool(const BlockKey&)>& match,
                                   uint64_t* pinned) {
  std::vector<std::pair<BlockKey, TierMask>> found;
  index_.Select(match, &found);
  // Per tier: unindex under the tier's lock (a managed slot stays counted until erased), then
  // erase and report with no lock held, as everywhere else.
  std::vector<bool> any(found.size(), false), held(found.size(), false);
  for (auto& stp : tiers_) {
    TierState& st = *stp;
    std::vector<BlockKey> gone;
    std::vector<uint64_t> changes;
    if (st.caps.managed_by_cache) {
      MutexLock lock(&st.mu);
      for (size_t i = 0; i < found.size(); ++i) {
        const BlockKey& key = found[i].first;
        if (!(found[i].second & (TierMask{1} << st.index))) continue;
        const std::optional<uint64_t> change = index_.TryRemoveUnpinned(key, st.index);
        if (!change) {
          held[i] = true;
          continue;
        }
        st.policy->OnErase(key);
        st.positions.Erase(key);
        gone.push_back(key);
        changes.push_back(*change);
        any[i] = any[i] || *change != 0;
      }
      st.reserved += gone.size();
    } else {
      for (size_t i = 0; i < found.size(); ++i) {
        const BlockKey& key = found[i].first;
        if (!(found[i].second & (TierMask{1} << st.index))) continue;
        const uint64_t change = index_.RemoveTier(key, st.index);
        if (!change) continue;
        gone.push_back(key);
        changes.push_back(change);
        any[i] = true;
      }
    }
    if (gone.empty()) continue;
    (void)st.tier->Erase(gone);
    if (st.caps.managed_by_cache) {
      MutexLock lock(&st.mu);
      st.reserved -= gone.size();
    }
    EmitRemoved(st, gone, changes);
  }
  uint64_t dropped = 0;
  *pinned = 0;
  for (size_t i = 0; i < found.size(); ++i) {
    dropped += any[i];
    *pinned += held[i];
  }
  return dropped;
}

bool CacheHooks::HasSharedHost(const Cache& cache) {
  if (cache.impl_->tiers_.empty()) return false;
  return cache.impl_->tiers_[0]->tier->shared_arena() != nullptr &&
         cache.impl_->tiers_[0]->caps.managed_by_cache;
}

HostTier& CacheHooks::SharedHost(Cache& cache) {
  return *cache.impl_->tiers_[0]->tier->shared_arena();
}

size_t CacheHooks::Reserve(Cache& cache, int partition, size_t n, std::vector<uint32_t>* slots) {
  return cache.impl_->ReserveHost(partition, n, slots);
}

void CacheHooks::Touch(Cache& cache, std::span<const BlockKey> keys,
                       std::span<const uint32_t> positions, uint64_t session_id) {
  cache.impl_->TouchHost(keys, positions, session_id);
}

void CacheHooks::Unreserve(Cache& cache, std::span<const uint32_t> slots) {
  cache.impl_->UnreserveHost(slots);
}

StoreResult CacheHooks::Commit(Cache& cache, std::span<const BlockKey> keys,
                               std::span<const uint32_t> slots, std::span<const uint64_t> checksums,
                               uint32_t first_block, uint64_t session_id,
                               std::span<EngineBlockHashes> engine) {
  return cache.impl_->CommitHost(keys, slots, checksums, first_block, session_id, engine);
}

Result<LookupResult> CacheHooks::LookupKeys(Cache& cache, std::span<const BlockKey> keys,
                                            const RequestOptions& request,
                                            std::vector<uint64_t>* checksums) {
  return cache.impl_->LookupKeys(keys, request, checksums);
}

void CacheHooks::Checksums(const Cache& cache, std::span<const BlockKey> keys,
                           std::span<uint64_t> out) {
  for (size_t i = 0; i < keys.size(); ++i) {
    IndexEntry e;
    out[i] = cache.impl_->index_.Get(keys[i], &e) ? e.checksum : 0;
  }
}

uint64_t CacheHooks::ClearManaged(Cache& cache) { return cache.impl_->ClearManaged(); }

uint64_t CacheHooks::DropMatching(Cache& cache, const std::function<bool(const BlockKey&)>& match,
                                  uint64_t* pinned) {
  return cache.impl_->DropMatching(match, pinned);
}

Result<LoadResult> CacheHooks::LoadIntoHost(Cache& cache, const LookupResult& lookup,
                                            std::span<const MutableBlock> dst) {
  return cache.impl_->Load(lookup, 0, dst, /*promote_now=*/true);
}

}  // namespace kvtier
