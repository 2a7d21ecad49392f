// The Cache's write path: room and admission under a tier's lock, eviction and write-back
// victims after it, and Store itself.
#include <array>

#include "cache/cache_impl.h"

namespace kvtier {

AdmissionVerdict Cache::Impl::Judge(const TierState& st, const BlockKey& key, uint32_t reuse,
                                    uint64_t prefix_tokens) const {
  const AdmissionVerdict v = JudgeAdmission(st.admission, reuse, prefix_tokens);
  if (v != AdmissionVerdict::kSkipReuse || !ghosts_ || !st.admission.count_reuse_after_eviction)
    return v;
  return JudgeAdmission(st.admission, std::max<uint32_t>(reuse, ghosts_->Count(key)),
                        prefix_tokens);
}

bool Cache::Impl::Admit(TierState& st, const BlockKey& key, uint32_t reuse,
                        uint64_t prefix_tokens) {
  if (st.index == 0) return true;
  return CountVerdict(st, key, Judge(st, key, reuse, prefix_tokens));
}

bool Cache::Impl::CountVerdict(TierState& st, const BlockKey& key, AdmissionVerdict v) {
  switch (v) {
    case AdmissionVerdict::kAdmit:
      st.admitted.fetch_add(1, std::memory_order_relaxed);
      return true;
    case AdmissionVerdict::kSkipPrefix:
      st.skipped_prefix.fetch_add(1, std::memory_order_relaxed);
      break;
    case AdmissionVerdict::kSkipReuse:
      st.skipped_reuse.fetch_add(1, std::memory_order_relaxed);
      // Remembered, so that a lookup missing it after it has left counts its reuse.
      if (ghosts_ && st.admission.count_reuse_after_eviction) ghosts_->Remember(key);
      break;
  }
  st.rejected.fetch_add(1, std::memory_order_relaxed);
  return false;
}

bool Cache::Impl::WantedBelow(const BlockKey& key, int first, int last, TierMask has,
                              uint32_t reuse, uint64_t prefix_tokens) {
  // Each tier lacking the block judged once: a refusal everywhere is then counted as judged.
  std::array<AdmissionVerdict, kMaxTiers> verdict{};
  for (int t = first; t <= last; ++t) {
    if (has & (TierMask{1} << t)) continue;
    verdict[t] = Judge(*tiers_[t], key, reuse, prefix_tokens);
    if (verdict[t] == AdmissionVerdict::kAdmit) return true;
  }
  for (int t = first; t <= last; ++t)
    if (!(has & (TierMask{1} << t))) (void)CountVerdict(*tiers_[t], key, verdict[t]);
  return false;
}

size_t Cache::Impl::MakeRoom(TierState& st, size_t need, std::vector<Victim>* victims,
                             const std::function<bool(const BlockKey&)>* allow,
                             size_t min_victims) {
  const uint64_t cap = st.tier->capacity_blocks();
  const TierMask below_bit = st.index + 1 < kMaxTiers ? TierMask{1} << (st.index + 1) : 0;
  auto evictable = [this, allow](const BlockKey& k) {
    return !index_.IsPinned(k) && (allow == nullptr || (*allow)(k));
  };
  size_t attempts = 0;
  const size_t first = victims->size();
  while (st.policy->size() + st.reserved + need > cap || victims->size() - first < min_victims) {
    std::optional<BlockKey> victim = st.policy->PickVictim(evictable);
    if (!victim) break;
    // Read the entry first: removing the last tier drops it, checksum and all.
    IndexEntry e;
    const bool known = index_.Get(*victim, &e);
    const std::optional<uint64_t> change = index_.TryRemoveUnpinned(*victim, st.index);
    if (!change) {
      // Pinned since the policy looked: it stays resident.
      st.policy->OnInsert(*victim, AccessHint{});
      if (++attempts > 64) break;
      continue;
    }
    Victim v;
    v.key = *victim;
    v.change = *change;
    v.checksum = known ? e.checksum : 0;
    v.reuse = known ? e.reuse : 0;
    v.below_has = known && (e.tiers & below_bit);
    if (const uint32_t* p = st.positions.Find(*victim)) {
      v.position = *p;
      st.positions.Erase(*victim);
    }
    victims->push_back(v);
  }
  const uint64_t held = st.policy->size() + st.reserved;
  return held >= cap ? 0 : std::min<size_t>(need, cap - held);
}

void Cache::Impl::EvictOut(TierState& st, const std::vector<Victim>& victims,
                           std::vector<PendingEvent>* events, std::vector<WriteJob>* down) {
  if (victims.empty()) return;
  const uint64_t bb = options_.layout.bytes_per_block();
  const bool write_back = options_.write_mode == WriteMode::kWriteBack &&
                          st.index + 1 < static_cast<int>(tiers_.size());
  std::vector<BlockKey> keys;
  keys.reserve(victims.size());
  for (const Victim& v : victims) keys.push_back(v.key);
  if (write_back) {
    // One Get for the victims the tier below lacks and admits; they go down as one batch.
    WriteJob job;
    std::vector<BlockKey> gk;
    std::vector<uint32_t> gi;
    const int next = st.index + 1;
    auto prefix_of = [&](const Victim& v) {
      return (uint64_t{v.position} + 1) * options_.layout.block_tokens;
    };
    for (uint32_t i = 0; i < victims.size(); ++i)
      if (!victims[i].below_has &&
          WantedBelow(victims[i].key, next, next, 0, victims[i].reuse, prefix_of(victims[i]))) {
        gk.push_back(victims[i].key);
        gi.push_back(i);
      }
    if (!gk.empty()) {
      job.Stage(gk.size(), bb);
      std::vector<MutableBlock> out;
      for (size_t j = 0; j < gk.size(); ++j) out.emplace_back(job.Slot(j, bb), bb);
      std::vector<Status> gs(gk.size());
      const Status call = st.tier->Get(gk, out, gs);
      for (size_t j = 0; j < gk.size(); ++j) {
        const Victim& v = victims[gi[j]];
        if (!call.ok() || !gs[j].ok()) continue;  // gone already: nothing to move
        job.batch.Add(v.key, out[j], v.checksum, v.position, prefix_of(v), 0, v.reuse);
        job.from.push_back(-1);
      }
      if (job.batch.size() > 0) {
        job.batch.now_s = MonotonicSeconds();
        job.first_target = job.last_target = st.index + 1;
        job.victims_of = st.index;
        down->push_back(std::move(job));
      }
    }
  }
  (void)st.tier->Erase(keys);
  st.evictions.fetch_add(victims.size(), std::memory_order_relaxed);
  for (const Victim& v : victims)
    if (v.change) events->push_back({KvEvent::Type::kRemoved, v.key, st.index, v.change});
}

void Cache::Impl::StoreToTier(TierState& st, const BlockBatch& b, std::span<Status> results,
                              uint32_t* stored, std::vector<PendingEvent>* events,
                              std::vector<WriteJob>* down) {
  const TierMask bit = TierMask{1} << st.index;
  std::vector<uint32_t> todo, overflow;
  std::vector<Victim> victims;
  {
    MutexLock lock(&st.mu);
    // Last to first: the chain's head ends most recent, so its tail is evicted first.
    for (size_t i = b.size(); i-- > 0;) {
      IndexEntry e;
      if (index_.Get(b.keys[i], &e) && (e.tiers & bit)) {
        if (st.caps.managed_by_cache)
          st.policy->OnAccess(b.keys[i], AccessHint{b.sessions[i], b.positions[i], b.now_s});
        results[i] = Status::Ok();
        continue;
      }
      if (!Admit(st, b.keys[i], std::max(b.reuse[i], e.reuse), b.prefix_tokens[i])) {
        results[i] = Status::ResourceExhausted("tier '" + st.tier->name() + "': not admitted");
        continue;
      }
      todo.push_back(static_cast<uint32_t>(i));
    }
    if (todo.empty()) return;
    // todo is in last-to-first order; the Put goes first to last.
    std::reverse(todo.begin(), todo.end());
    if (st.caps.managed_by_cache) {
      // Block p helps only with blocks 0..p-1 resident: positions past the tier's capacity
      // are refused, so the store never evicts the prefix it extends for them.
      const size_t fit = MakeRoom(st, ChainRoom(st, b, todo), &victims);
      // Keep the head of the chain when room is short.
      overflow.assign(todo.begin() + static_cast<ptrdiff_t>(fit), todo.end());
      todo.resize(fit);
      // Room for the Put, which also covers the victims until they are erased.
      st.reserved += todo.size();
    }
  }
  EvictOut(st, victims, events, down);
  if (!overflow.empty()) {
    const bool below = options_.write_mode == WriteMode::kWriteBack &&
                       st.index + 1 < static_cast<int>(tiers_.size());
    if (below) {
      // Write-back: what cannot stay here would be a victim at once; it goes down directly.
      const uint64_t bb = options_.layout.bytes_per_block();
      const TierMask below_bit = TierMask{1} << (st.index + 1);
      WriteJob job;
      job.Stage(overflow.size(), bb);
      for (size_t j = 0; j < overflow.size(); ++j) {
        const uint32_t i = overflow[j];
        results[i] = Status::Ok();  // handed to the tier below
        IndexEntry e;
        if (index_.Get(b.keys[i], &e) && (e.tiers & below_bit)) continue;  // there already
        ConstBlock block;
        if (!b.blocks[i].empty()) {
          std::memcpy(job.Slot(j, bb), b.blocks[i].data(), bb);
          block = ConstBlock(job.Slot(j, bb), bb);
        }
        job.batch.Add(b.keys[i], block, b.checksums[i], b.positions[i], b.prefix_tokens[i],
                      b.sessions[i], b.reuse[i]);
        job.from.push_back(-1);
      }
      job.batch.now_s = b.now_s;
      job.first_target = job.last_target = st.index + 1;
      job.victims_of = st.index;
      if (job.batch.size() > 0) down->push_back(std::move(job));
    } else {
      for (uint32_t i : overflow)
        results[i] = Status::ResourceExhausted("tier '" + st.tier->name() + "': no room (" +
                                               std::to_string(st.tier->capacity_blocks()) +
                                               " blocks, the rest pinned)");
    }
  }
  if (todo.empty()) return;
  // The Put runs outside st.mu: copies into host DRAM (or a self-managed tier's I/O) must not
  // hold up Lookups, Loads and other Stores of this tier. A managed tier's blocks have room
  // reserved above; self-managed tiers (disk, remote) bound themselves.
  std::vector<Status> put = PutTodo(st, b, todo);
  if (!st.caps.managed_by_cache) {
    // A block the tier drops at once is a miss on Load, which keeps the index honest.
    Record(st, b, todo, put, results, stored, events);
    return;
  }
  // The policy, then the index: a Lookup never finds a block its tier's policy does not hold.
  MutexLock lock(&st.mu);
  st.reserved -= todo.size();
  for (size_t j = todo.size(); j-- > 0;) {
    if (!put[j].ok()) continue;
    const uint32_t i = todo[j];
    st.policy->OnInsert(b.keys[i], AccessHint{b.sessions[i], b.positions[i], b.now_s});
    if (st.tracks_positions) st.positions.Insert(b.keys[i], b.positions[i]);
  }
  Record(st, b, todo, put, results, stored, events);
}

std::vector<Status> Cache::Impl::PutTodo(TierState& st, const BlockBatch& b,
                                         const std::vector<uint32_t>& todo) {
  std::vector<BlockKey> pk;
  std::vector<ConstBlock> pb;
  pk.reserve(todo.size());
  pb.reserve(todo.size());
  for (uint32_t i : todo) {
    pk.push_back(b.keys[i]);
    pb.push_back(b.blocks[i]);
  }
  std::vector<Status> ps(todo.size());
  Status call = st.tier->Put(pk, pb, ps);
  if (!call.ok()) std::fill(ps.begin(), ps.end(), call);
  return ps;
}

void Cache::Impl::Record(TierState& st, const BlockBatch& b, const std::vector<uint32_t>& todo,
                         std::span<const Status> put, std::span<Status> results, uint32_t* stored,
                         std::vector<PendingEvent>* events) {
  for (size_t j = todo.size(); j-- > 0;) {
    const uint32_t i = todo[j];
    results[i] = put[j];
    if (!put[j].ok()) continue;
    const uint64_t change = index_.AddTier(b.keys[i], st.index, b.checksums[i]);
    ++*stored;
    events->push_back({KvEvent::Type::kStored, b.keys[i], st.index, change});
  }
}

void Cache::Impl::CountFailures(TierState& st, std::span<const Status> results) {
  uint64_t failed = 0;
  // A refusal (admission, no room) is the tier's policy, counted as rejected; not a failure.
  for (const Status& s : results) failed += !s.ok() && s.code() != StatusCode::kResourceExhausted;
  if (failed) st.write_failures.fetch_add(failed, std::memory_order_relaxed);
}

Status Cache::Impl::CheckStore(std::span<const BlockKey> keys,
                               std::span<const ConstBlock> blocks) const {
  const uint64_t block_bytes = options_.layout.bytes_per_block();
  if (keys.size() != blocks.size())
    return Status::InvalidArgument("Store: " + std::to_string(keys.size()) + " keys but " +
                                   std::to_string(blocks.size()) + " blocks");
  for (size_t i = 0; i < blocks.size(); ++i)
    if (blocks[i].size() != block_bytes)
      return Status::InvalidArgument("Store: block " + std::to_string(i) + " has " +
                                     std::to_string(blocks[i].size()) + " bytes, the layout's " +
                                     "block has " + std::to_string(block_bytes));
  return Status::Ok();
}

BlockBatch Cache::Impl::StoreBatch(std::span<const BlockKey> keys,
                                   std::span<const ConstBlock> blocks, uint32_t first_block,
                                   const RequestOptions& request) const {
  const size_t n = keys.size();
  std::vector<uint64_t> checksums(n, 0);
  if (options_.verify_checksums && verify_any_)
    for (size_t i = 0; i < n; ++i) checksums[i] = Checksum64(blocks[i]);
  const uint64_t prefix_tokens = (uint64_t{first_block} + n) * options_.layout.block_tokens;
  BlockBatch b;
  b.now_s = MonotonicSeconds();
  for (size_t i = 0; i < n; ++i)
    b.Add(keys[i], blocks[i], checksums[i], first_block + static_cast<uint32_t>(i), prefix_tokens,
          request.session_id);
  return b;
}

void Cache::Impl::StoreInCaller(const BlockBatch& b, int last_sync,
                                std::vector<uint8_t>* ok_anywhere,
                                std::vector<Status>* first_failure) {
  const size_t n = b.size();
  std::vector<Status> results(n);
  std::vector<PendingEvent> events;
  std::vector<WriteJob> down;
  for (int t = 0; t <= last_sync; ++t) {
    uint32_t stored = 0;
    StoreToTier(*tiers_[t], b, results, &stored, &events, &down);
    for (size_t i = 0; i < n; ++i) {
      if (results[i].ok())
        (*ok_anywhere)[i] = 1;
      else if ((*first_failure)[i].ok())
        (*first_failure)[i] = results[i];
    }
  }
  EmitAll(events);
  Dispatch(std::move(down));
}

void Cache::Impl::QueueBelow(const BlockBatch& b, int top, std::vector<uint8_t>* ok_anywhere) {
  // The rest goes down in the background, from the top tier's copy (pinned there until
  // written) or, for a block the top tier did not take, from a staged copy.
  const uint64_t block_bytes = options_.layout.bytes_per_block();
  const TierMask top_bit = TierMask{1} << top;
  TierMask lower = 0;
  for (size_t t = top + 1; t < tiers_.size(); ++t) lower |= TierMask{1} << t;
  const int last = static_cast<int>(tiers_.size()) - 1;
  WriteJob job;
  std::vector<uint32_t> idx;
  for (uint32_t i = 0; i < b.size(); ++i) {
    IndexEntry e;
    if (index_.Get(b.keys[i], &e) && (e.tiers & lower) == lower) {
      (*ok_anywhere)[i] = 1;  // every lower tier has it already
      continue;
    }
    // Refused below now: no copy queued (a lookup hit may queue it later, QueueReused, or,
    // once it has left, a lookup that misses it counts toward its next store: ReuseGhosts).
    const uint16_t reuse = std::max(b.reuse[i], e.reuse);
    if (!WantedBelow(b.keys[i], top + 1, last, e.tiers, reuse, b.prefix_tokens[i])) continue;
    idx.push_back(i);
    job.batch.Add(b.keys[i], ConstBlock(), b.checksums[i], b.positions[i], b.prefix_tokens[i],
                  b.sessions[i], reuse);
  }
  if (idx.empty()) return;
  job.pins = index_.Pin(job.batch.keys);
  size_t staged = 0;
  std::vector<int8_t> from(idx.size(), -1);
  for (size_t j = 0; j < idx.size(); ++j) {
    IndexEntry e;
    // Pinned now; a block evicted before the pin is staged from the caller's buffer.
    if (index_.Get(b.keys[idx[j]], &e) && (e.tiers & top_bit))
      from[j] = static_cast<int8_t>(top);
    else
      ++staged;
  }
  if (staged > 0) {
    job.Stage(idx.size(), block_bytes);
    for (size_t j = 0; j < idx.size(); ++j) {
      if (from[j] >= 0 || b.blocks[idx[j]].empty()) continue;
      std::memcpy(job.Slot(j, block_bytes), b.blocks[idx[j]].data(), block_bytes);
      job.batch.blocks[j] = ConstBlock(job.Slot(j, block_bytes), block_bytes);
    }
  }
  job.from = std::move(from);
  job.batch.now_s = b.now_s;
  job.first_target = top + 1;
  job.last_target = last;
  for (uint32_t i : idx) (*ok_anywhere)[i] = 1;  // queued: a failure below shows in stats
  Enqueue(std::move(job), /*wait=*/true);
}

void Cache::Impl::QueueReused(std::span<const BlockKey> keys, std::span<const TierMask> masks,
                              std::span<const uint16_t> reuse, uint64_t prefix_tokens,
                              uint64_t session_id) {
  const int last = static_cast<int>(tiers_.size()) - 1;
  WriteJob job;
  for (uint32_t i = 0; i < reuse.size(); ++i) {
    if (!(masks[i] & 1)) continue;  // not in tier 0: nothing to copy down from
    bool reached = false;
    for (int t = 1; t <= last && !reached; ++t) {
      const AdmissionOptions& a = tiers_[t]->admission;
      reached = a.min_reuse > 0 && !(masks[i] & (TierMask{1} << t)) && reuse[i] >= a.min_reuse &&
                prefix_tokens >= a.min_prefix_tokens;
    }
    if (!reached) continue;
    job.batch.Add(keys[i], ConstBlock(), 0, i, prefix_tokens, session_id, reuse[i]);
    job.from.push_back(0);
  }
  const size_t n = job.batch.size();
  if (n == 0) return;
  // Pinned in tier 0 until written (the lookup's own pins hold them until then).
  job.pins = index_.Pin(job.batch.keys);
  job.batch.now_s = MonotonicSeconds();
  job.first_target = 1;
  job.last_target = last;
  if (!async_) {  // no writer (write_queue_blocks: 0): written here, as Store writes
    std::vector<WriteJob> jobs;
    jobs.push_back(std::move(job));
    RunJobs(jobs);
    return;
  }
  if (!Enqueue(std::move(job), /*wait=*/false))
    write_through_dropped_.fetch_add(n, std::memory_order_relaxed);
}

Result<StoreResult> Cache::Impl::StoreKeys(std::span<const BlockKey> keys,
                                           std::span<const ConstBlock> blocks, uint32_t first_block,
                                           const RequestOptions& request) {
  const uint64_t t0 = MonotonicNs();
  KVTIER_RETURN_IF_ERROR(CheckStore(keys, blocks));
  KVTIER_RETURN_IF_ERROR(KeepEngineHashes(keys, request.engine_hashes));
  StoreResult r;
  if (keys.empty()) return r;
  const size_t n = keys.size();
  const BlockBatch b = StoreBatch(keys, blocks, first_block, request);
  std::vector<uint8_t> ok_anywhere(n, 0), present(n, 0);
  for (size_t i = 0; i < n; ++i) {
    IndexEntry e;
    present[i] = index_.Get(keys[i], &e) && e.tiers != 0;
  }
  std::vector<Status> first_failure(n);
  const bool write_back = options_.write_mode == WriteMode::kWriteBack;
  // Asynchronous write-through: the caller writes the first tier only.
  const int last_sync = write_back || async_ ? 0 : static_cast<int>(tiers_.size()) - 1;
  StoreInCaller(b, last_sync, &ok_anywhere, &first_failure);
  if (!write_back && last_sync + 1 < static_cast<int>(tiers_.size()))
    QueueBelow(b, last_sync, &ok_anywhere);

  for (size_t i = 0; i < n; ++i) {
    if (!ok_anywhere[i]) {
      ++r.failed_blocks;
      if (r.first_error.ok()) r.first_error = first_failure[i];
    } else if (present[i]) {
      ++r.present_blocks;
    } else {
      ++r.stored_blocks;
    }
  }
  stores_.fetch_add(1, std::memory_order_relaxed);
  stored_blocks_.fetch_add(r.stored_blocks, std::memory_order_relaxed);
  store_latency_.Record(MonotonicNs() - t0);
  return r;
}

}  // namespace kvtier
