#include "kvtier/cache.h"

#include "cache/cache_impl.h"

namespace kvtier {
namespace {

std::string TierField(size_t i, const char* field) {
  return "tiers[" + std::to_string(i) + "]." + field;
}

// A lookup's index pins, behind the public PinHandle.
struct IndexPins final : PinHandle::Holder {
  PinSet pins;
};

}  // namespace

std::string_view WriteModeName(WriteMode mode) {
  return mode == WriteMode::kWriteBack ? "write-back" : "write-through";
}

Status CacheOptions::Validate() const {
  KVTIER_RETURN_IF_ERROR(layout.Validate());
  if (tiers.empty()) return Status::InvalidArgument("tiers: at least one tier is needed");
  KVTIER_RETURN_IF_ERROR(events.Validate());
  if (events.media.size() > tiers.size())
    return Status::InvalidArgument("events.media: " + std::to_string(events.media.size()) +
                                   " names for " + std::to_string(tiers.size()) + " tiers");
  if (tiers.size() > static_cast<size_t>(kMaxTiers))
    return Status::InvalidArgument("tiers: at most " + std::to_string(kMaxTiers) + " tiers, got " +
                                   std::to_string(tiers.size()));
  std::set<std::string> names;
  for (size_t i = 0; i < tiers.size(); ++i) {
    const TierSpec& t = tiers[i];
    if (t.instance) {
      if (!(t.instance->layout() == layout))
        return Status::InvalidArgument(TierField(i, "instance") + ": tier '" + t.instance->name() +
                                       "' has layout " + t.instance->layout().ToString() +
                                       ", the cache has " + layout.ToString());
    } else {
      if (t.kind.empty()) return Status::InvalidArgument(TierField(i, "kind") + ": missing");
      if (t.capacity_bytes == 0)
        return Status::InvalidArgument(TierField(i, "capacity_bytes") + ": must be > 0");
      if (t.capacity_bytes < layout.bytes_per_block())
        return Status::InvalidArgument(TierField(i, "capacity_bytes") + ": " +
                                       FormatBytes(t.capacity_bytes) + " holds no block of " +
                                       FormatBytes(layout.bytes_per_block()));
    }
    if (t.threads < 1 || t.threads > 64)
      return Status::InvalidArgument(TierField(i, "threads") + ": must be in 1..64, got " +
                                     std::to_string(t.threads));
    auto probe = MakeEvictionPolicy(t.eviction, 1);
    if (!probe.ok()) return probe.status().WithContext(TierField(i, "eviction"));
    KVTIER_RETURN_IF_ERROR(t.admission.Validate().WithContext(TierField(i, "admission")));
    if (i == 0 && !t.admission.admits_all())
      return Status::InvalidArgument(TierField(i, "admission") + ": " + kFirstTierAdmits);
    std::string name = t.instance ? t.instance->name() : (t.name.empty() ? t.kind : t.name);
    if (!names.insert(name).second)
      return Status::InvalidArgument(TierField(i, "name") + ": '" + name +
                                     "' is used twice; give each tier its own name");
  }
  if (write_queue_blocks > (1u << 20))
    return Status::InvalidArgument("write_queue_blocks: at most 1048576, got " +
                                   std::to_string(write_queue_blocks));
  return Status::Ok();
}

Result<LookupResult> Cache::Impl::LookupKeys(std::span<const BlockKey> keys,
                                             const RequestOptions& request,
                                             std::vector<uint64_t>* checksums) {
  const uint64_t t0 = MonotonicNs();
  LookupResult r;
  r.block_tokens = options_.layout.block_tokens;
  r.keys.assign(keys.begin(), keys.end());
  MatchResult m;
  m.checksums = checksums;
  std::vector<uint16_t> reuse;
  if (count_reuse_) m.reuse = &reuse;
  auto held = std::make_unique<IndexPins>();
  index_.MatchAndPin(keys, &m, &held->pins);
  if (!held->pins.empty()) r.pins = PinHandle(std::move(held));
  uint32_t hit = m.any_prefix;
  std::vector<TierMask> masks = std::move(m.masks);

  // Shared tiers may hold blocks another replica stored: ask them beyond the local prefix.
  if (hit < keys.size()) {
    for (auto& st : tiers_) {
      if (st->caps.authoritative || hit >= keys.size()) continue;
      std::span<const BlockKey> rest = keys.subspan(hit);
      std::unique_ptr<bool[]> found(new bool[rest.size()]);
      if (!st->tier->Exists(rest, std::span<bool>(found.get(), rest.size())).ok()) continue;
      uint32_t extra = 0;
      while (extra < rest.size() && found[extra]) ++extra;
      if (extra == 0) continue;
      for (uint32_t j = 0; j < extra; ++j) {
        // Found in a shared tier: resident there for this Cache from now on.
        Emit(KvEvent::Type::kStored, rest[j], st->index, index_.AddTier(rest[j], st->index, 0));
        masks.push_back(TierMask{1} << st->index);
      }
      hit += extra;
    }
  }

  r.hit_blocks = hit;
  // Missed blocks that were refused below and have left: reused after all.
  if (ghosts_ && hit < keys.size()) ghosts_->CountMisses(keys.subspan(hit));
  if (checksums) checksums->resize(hit, 0);  // a shared tier's extra blocks: none indexed
  r.source.resize(hit);
  for (uint32_t i = 0; i < hit; ++i) {
    // The fastest tier holding the block.
    int src = -1;
    for (auto& st : tiers_) {
      if (!(masks[i] & (TierMask{1} << st->index))) continue;
      src = st->index;
      break;
    }
    r.source[i] = static_cast<int8_t>(src);
    ++r.blocks_by_tier[src];
  }
  // One atomic add per tier, not per block.
  for (auto& st : tiers_) {
    if (r.blocks_by_tier[st->index] > 0)
      st->hit_blocks.fetch_add(r.blocks_by_tier[st->index], std::memory_order_relaxed);
  }

  // A hit refreshes recency: last to first, so a chain's head ends most recent.
  AccessHint hint;
  hint.session_id = request.session_id;
  hint.now_s = MonotonicSeconds();
  for (auto& st : tiers_) {
    if (!st->caps.managed_by_cache) continue;
    const TierMask bit = TierMask{1} << st->index;
    MutexLock lock(&st->mu);
    if (m.tier_prefix[st->index] >= hit) {  // the whole prefix: one call
      st->policy->OnAccessChain(keys.first(hit), hint);
      continue;
    }
    for (uint32_t i = hit; i-- > 0;) {
      if (!(masks[i] & bit)) continue;
      hint.position = i;
      st->policy->OnAccess(keys[i], hint);
    }
  }

  // Write-through: blocks a lower tier refused for too little reuse go down once they have it.
  if (!reuse.empty() && options_.write_mode == WriteMode::kWriteThrough)
    QueueReused(keys, masks, reuse, uint64_t{keys.size()} * options_.layout.block_tokens,
                request.session_id);

  lookups_.fetch_add(1, std::memory_order_relaxed);
  lookup_blocks_.fetch_add(keys.size(), std::memory_order_relaxed);
  hit_blocks_.fetch_add(hit, std::memory_order_relaxed);
  lookup_latency_.Record(MonotonicNs() - t0);
  return r;
}

void Cache::Impl::DropBlock(TierState& st, const BlockKey& key) {
  const BlockKey k[1] = {key};
  uint64_t change = 0;
  if (st.caps.managed_by_cache) {
    {
      MutexLock lock(&st.mu);
      change = index_.RemoveTier(key, st.index);
      if (!change) return;
      st.policy->OnErase(key);
      st.positions.Erase(key);
      ++st.reserved;  // its slot stays occupied until the Erase below
    }
    (void)st.tier->Erase(k);
    MutexLock lock(&st.mu);
    --st.reserved;
  } else {
    change = index_.RemoveTier(key, st.index);
    (void)st.tier->Erase(k);
  }
  Emit(KvEvent::Type::kRemoved, key, st.index, change);
}

Status Cache::Impl::CheckLoad(const char* op, const LookupResult& lookup, uint32_t first,
                              std::span<const MutableBlock> dst) const {
  const uint64_t block_bytes = options_.layout.bytes_per_block();
  if (uint64_t{first} + dst.size() > lookup.hit_blocks)
    return Status::InvalidArgument(std::string(op) + ": blocks " + std::to_string(first) + ".." +
                                   std::to_string(uint64_t{first} + dst.size()) +
                                   " asked of a lookup of " + std::to_string(lookup.hit_blocks) +
                                   " hit blocks");
  for (size_t i = 0; i < dst.size(); ++i)
    if (dst[i].size() != block_bytes)
      return Status::InvalidArgument(std::string(op) + ": buffer " + std::to_string(i) + " has " +
                                     std::to_string(dst[i].size()) + " bytes, a block has " +
                                     std::to_string(block_bytes));
  return Status::Ok();
}

Result<LoadResult> Cache::Impl::Load(const LookupResult& lookup, uint32_t first,
                                     std::span<const MutableBlock> dst, bool promote_now,
                                     bool count) {
  const uint64_t t0 = MonotonicNs();
  const uint64_t block_bytes = options_.layout.bytes_per_block();
  KVTIER_RETURN_IF_ERROR(CheckLoad("Load", lookup, first, dst));
  LoadResult r;
  r.block_status.assign(dst.size(), Status::Ok());
  const size_t n = dst.size();
  // Block i of dst is block first + i of the lookup.
  auto key_of = [&](size_t i) -> const BlockKey& { return lookup.keys[first + i]; };
  auto source_of = [&](size_t i) { return lookup.source[first + i]; };

  // One batched Get per source tier.
  std::vector<uint32_t> idx;
  std::vector<BlockKey> keys;
  std::vector<MutableBlock> bufs;
  std::vector<Status> res;
  std::vector<bool> done(n, false);
  for (auto& st : tiers_) {
    idx.clear();
    for (uint32_t i = 0; i < n; ++i)
      if (source_of(i) == st->index) idx.push_back(i);
    if (idx.empty()) continue;
    keys.clear();
    bufs.clear();
    for (uint32_t i : idx) {
      keys.push_back(key_of(i));
      bufs.push_back(dst[i]);
    }
    res.assign(idx.size(), Status::Ok());
    Status call = st->tier->Get(keys, bufs, res);
    for (size_t j = 0; j < idx.size(); ++j) {
      Status s = call.ok() ? res[j] : call;
      r.block_status[idx[j]] = s;
      done[idx[j]] = s.ok();
    }
  }

  // Verify what came from outside the process, then retry failures from other tiers.
  for (uint32_t i = 0; i < n; ++i) {
    const int src = source_of(i);
    if (done[i] && options_.verify_checksums && tiers_[src]->cache_verifies) {
      IndexEntry e;
      if (index_.Get(key_of(i), &e) && e.checksum != 0 && Checksum64(dst[i]) != e.checksum) {
        tiers_[src]->corruptions.fetch_add(1, std::memory_order_relaxed);
        r.block_status[i] = Status::Corruption("tier '" + tiers_[src]->tier->name() + "': block " +
                                               key_of(i).ToHex() + " failed its checksum");
        done[i] = false;
      }
    }
    if (done[i]) continue;
    // A block that failed here is gone from that tier: keep the index honest.
    if (r.block_status[i].code() == StatusCode::kCorruption ||
        r.block_status[i].code() == StatusCode::kNotFound) {
      if (r.block_status[i].code() == StatusCode::kCorruption && !tiers_[src]->cache_verifies)
        tiers_[src]->corruptions.fetch_add(1, std::memory_order_relaxed);
      DropBlock(*tiers_[src], key_of(i));
    }
    IndexEntry e;
    if (!index_.Get(key_of(i), &e)) continue;
    for (auto& st : tiers_) {
      if (st->index == src || !(e.tiers & (TierMask{1} << st->index))) continue;
      const BlockKey k[1] = {key_of(i)};
      const MutableBlock b[1] = {dst[i]};
      Status s[1];
      if (!st->tier->Get(k, b, s).ok() || !s[0].ok()) continue;
      if (options_.verify_checksums && st->cache_verifies && e.checksum != 0 &&
          Checksum64(dst[i]) != e.checksum)
        continue;
      r.block_status[i] = Status::Ok();
      done[i] = true;
      break;
    }
  }

  while (r.loaded_blocks < n && done[r.loaded_blocks]) ++r.loaded_blocks;
  r.bytes = uint64_t{r.loaded_blocks} * block_bytes;

  PromoteLoaded(std::span<const BlockKey>(lookup.keys).subspan(first, n),
                std::span<const int8_t>(lookup.source).subspan(first, n), first, dst,
                r.loaded_blocks, lookup.hit_tokens(), promote_now);
  if (count) {
    load_failed_blocks_.fetch_add(n - r.loaded_blocks, std::memory_order_relaxed);
    loads_.fetch_add(1, std::memory_order_relaxed);
    load_latency_.Record(MonotonicNs() - t0);
  }
  return r;
}

Result<LoadResult> Cache::Impl::LoadVisit(const LookupResult& lookup, uint32_t first, uint32_t n,
                                          std::span<const MutableBlock> scratch,
                                          const KvCache::BlockVisitor& visit) {
  const uint64_t t0 = MonotonicNs();
  const uint64_t bb = options_.layout.bytes_per_block();
  LoadResult r;
  r.block_status.assign(n, Status::Ok());
  // Only the first tier lends: blocks from below are promoted into it from scratch (Load). A
  // tier whose reads the cache verifies is copied, so the checksum is of the bytes delivered.
  Tier* lender = !tiers_.empty() && !tiers_[0]->cache_verifies ? tiers_[0]->tier.get() : nullptr;
  auto lent_here = [&](uint32_t i) { return lender && lookup.source[first + i] == 0; };
  const uint32_t run_max = static_cast<uint32_t>(scratch.size());
  uint32_t i = 0;
  bool stop = false;
  while (i < n && !stop) {
    uint32_t j = i;
    while (j < n && j - i < run_max && lent_here(j) == lent_here(i)) ++j;
    if (lent_here(i)) {
      const uint32_t run = j - i;
      uint32_t lent = 0;
      auto use = [&](std::span<const std::byte* const> at) {
        for (; lent < at.size() && at[lent] != nullptr; ++lent)
          visit(i + lent, ConstBlock(at[lent], bb));
      };
      if (!lender->Lend(std::span<const BlockKey>(lookup.keys).subspan(first + i, run), use)) {
        lender = nullptr;  // the tier does not lend: copy from here on
        continue;
      }
      i += lent;
      if (lent == run) continue;
      j = i + 1;  // block i left the tier since the lookup: Load finds it below, or fails it
    }
    auto part = Load(lookup, first + i, scratch.first(j - i), /*promote_now=*/false,
                     /*count=*/false);
    if (!part.ok()) return part.status();
    for (uint32_t k = 0; k < j - i; ++k) r.block_status[i + k] = part->block_status[k];
    for (uint32_t k = 0; k < part->loaded_blocks; ++k) visit(i + k, scratch[k]);
    stop = part->loaded_blocks < j - i;
    i += part->loaded_blocks;
  }
  r.loaded_blocks = i;
  for (uint32_t k = i; k < n && r.block_status[k].ok(); ++k)
    r.block_status[k] = Status::Unavailable("LoadVisit: stopped at block " + std::to_string(i));
  r.bytes = uint64_t{i} * bb;
  load_failed_blocks_.fetch_add(n - i, std::memory_order_relaxed);
  loads_.fetch_add(1, std::memory_order_relaxed);
  load_latency_.Record(MonotonicNs() - t0);
  return r;
}

void Cache::Impl::PromoteLoaded(std::span<const BlockKey> keys, std::span<const int8_t> source,
                                uint32_t first, std::span<const MutableBlock> dst, uint32_t loaded,
                                uint64_t hit_tokens, bool promote_now) {
  // Promote blocks that came from below into the first tier: in the background (re-read from
  // their tier, off the caller's path) when writes are asynchronous.
  if (!options_.promote_on_load || loaded == 0) return;
  TierState* top = tiers_[0].get();
  WriteJob job;
  for (uint32_t i = 0; i < loaded; ++i) {
    if (source[i] == top->index) continue;
    IndexEntry e;
    if (index_.Get(keys[i], &e) && (e.tiers & (TierMask{1} << top->index))) continue;
    job.batch.Add(keys[i], dst[i], e.checksum, first + i, hit_tokens, 0);
    job.from.push_back(source[i]);
  }
  if (job.batch.size() == 0) return;
  job.batch.now_s = MonotonicSeconds();
  job.first_target = job.last_target = top->index;
  if (!async_ || promote_now) {
    std::fill(job.from.begin(), job.from.end(), int8_t{-1});  // read from dst, here
    std::vector<WriteJob> jobs;
    jobs.push_back(std::move(job));
    RunJobs(jobs);
    return;
  }
  job.promotion = true;
  job.pins = index_.Pin(job.batch.keys);
  std::fill(job.batch.blocks.begin(), job.batch.blocks.end(), ConstBlock());
  // Promotion is an optimisation: a full queue drops it rather than delay the caller.
  if (!Enqueue(std::move(job), /*wait=*/false))
    promotions_dropped_.fetch_add(1, std::memory_order_relaxed);
}

void Cache::Impl::NotifySession(uint64_t session_id, SessionEvent event) {
  const double now = MonotonicSeconds();
  for (auto& st : tiers_) {
    MutexLock lock(&st->mu);
    if (st->policy) st->policy->OnSessionEvent(session_id, event, now);
  }
}

CacheStats Cache::Impl::Stats() const {
  CacheStats s;
  for (const auto& st : tiers_) {
    CacheStats::PerTier t;
    t.name = st->tier->name();
    t.kind = st->tier->kind();
    t.tier = st->tier->stats();
    t.resident_blocks = t.tier.resident_blocks;
    t.hit_blocks = st->hit_blocks.load(std::memory_order_relaxed);
    t.evictions = st->evictions.load(std::memory_order_relaxed);
    t.writebacks = st->writebacks.load(std::memory_order_relaxed);
    t.rejected = st->rejected.load(std::memory_order_relaxed);
    t.admitted = st->admitted.load(std::memory_order_relaxed);
    t.skipped_prefix = st->skipped_prefix.load(std::memory_order_relaxed);
    t.skipped_reuse = st->skipped_reuse.load(std::memory_order_relaxed);
    t.corruptions = st->corruptions.load(std::memory_order_relaxed);
    t.write_failures = st->write_failures.load(std::memory_order_relaxed);
    t.declined_blocks = st->declined.load(std::memory_order_relaxed);
    s.tiers.push_back(std::move(t));
  }
  s.lookups = lookups_.load(std::memory_order_relaxed);
  s.lookup_blocks = lookup_blocks_.load(std::memory_order_relaxed);
  s.hit_blocks = hit_blocks_.load(std::memory_order_relaxed);
  s.loads = loads_.load(std::memory_order_relaxed);
  s.load_failed_blocks = load_failed_blocks_.load(std::memory_order_relaxed);
  s.stores = stores_.load(std::memory_order_relaxed);
  s.stored_blocks = stored_blocks_.load(std::memory_order_relaxed);
  s.write_queue_waits = writer_ ? writer_->waits() : 0;
  s.promotions_dropped = promotions_dropped_.load(std::memory_order_relaxed);
  s.write_through_dropped_blocks = write_through_dropped_.load(std::memory_order_relaxed);
  s.lookup_latency_ns = lookup_latency_.Take();
  s.load_latency_ns = load_latency_.Take();
  s.store_latency_ns = store_latency_.Take();
  return s;
}

// --- Cache: thin forwarding and argument checks ---

Result<std::unique_ptr<Cache>> Cache::Open(CacheOptions options) {
  KVTIER_RETURN_IF_ERROR(options.Validate());
  auto impl = std::make_unique<Impl>(std::move(options));
  KVTIER_RETURN_IF_ERROR(impl->OpenTiers());
  KVTIER_RETURN_IF_ERROR(impl->OpenEvents());
  return std::unique_ptr<Cache>(new Cache(std::move(impl)));
}

Cache::Cache(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Cache::~Cache() = default;

const KvLayout& Cache::layout() const { return impl_->options_.layout; }
int Cache::num_tiers() const { return static_cast<int>(impl_->tiers_.size()); }
Tier& Cache::tier(int index) { return *impl_->tiers_.at(index)->tier; }
BlockKey Cache::Root(const RequestOptions& request) const { return impl_->Root(request); }

Result<LookupResult> Cache::LookupKeys(std::span<const BlockKey> keys,
                                       const RequestOptions& request) {
  return impl_->LookupKeys(keys, request);
}

Result<LoadResult> Cache::Load(const LookupResult& lookup, uint32_t first,
                               std::span<const MutableBlock> dst) {
  return impl_->Load(lookup, first, dst);
}

Result<LoadResult> Cache::LoadVisit(const LookupResult& lookup, uint32_t first, uint32_t n,
                                    std::span<const MutableBlock> scratch,
                                    const BlockVisitor& visit) {
  KVTIER_RETURN_IF_ERROR(CheckVisit(lookup, first, n, scratch));
  return impl_->LoadVisit(lookup, first, n, scratch, visit);
}

Result<std::unique_ptr<LayerwiseLoad>> Cache::LoadLayerwise(const LookupResult& lookup,
                                                            uint32_t first,
                                                            std::span<const MutableBlock> dst) {
  return impl_->LoadLayerwise(lookup, first, dst);
}

void Cache::WaitForWrites() { impl_->WaitForWrites(); }

Result<StoreResult> Cache::StoreKeys(std::span<const BlockKey> keys,
                                     std::span<const ConstBlock> blocks, uint32_t first_block,
                                     const RequestOptions& request) {
  return impl_->StoreKeys(keys, blocks, first_block, request);
}

bool Cache::WantsEngineHashes() const { return impl_->WantsEngineHashes(); }

void Cache::NoteDeclined(std::span<const uint32_t> blocks_by_tier) {
  for (size_t t = 0; t < blocks_by_tier.size() && t < impl_->tiers_.size(); ++t) {
    if (blocks_by_tier[t] > 0)
      impl_->tiers_[t]->declined.fetch_add(blocks_by_tier[t], std::memory_order_relaxed);
  }
}

void Cache::NotifySession(uint64_t session_id, SessionEvent event) {
  impl_->NotifySession(session_id, event);
}

CacheStats Cache::stats() const { return impl_->Stats(); }

}  // namespace kvtier
