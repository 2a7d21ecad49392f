#include "kvtier/cache.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <set>

#include "cache/cache_hooks.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "index/block_index.h"
#include "tiers/host/host_tier.h"

namespace kvtier {
namespace {

std::string TierField(size_t i, const char* field) {
  return "tiers[" + std::to_string(i) + "]." + field;
}

// A lookup's index pins, behind the public PinHandle.
struct IndexPins final : PinHandle::Holder {
  PinSet pins;
};

// Per-thread scratch for victims moved down on write-back, one per tier: moving a victim
// down can evict from the tier below, recursively, and each level needs its own buffer.
std::vector<std::byte>& VictimBuffer(int tier, size_t bytes) {
  thread_local std::array<std::vector<std::byte>, kMaxTiers> bufs;
  std::vector<std::byte>& buf = bufs[tier];
  if (buf.size() < bytes) buf.resize(bytes);
  return buf;
}

}  // namespace

std::string_view WriteModeName(WriteMode mode) {
  return mode == WriteMode::kWriteBack ? "write-back" : "write-through";
}

Status CacheOptions::Validate() const {
  KVTIER_RETURN_IF_ERROR(layout.Validate());
  if (tiers.empty()) return Status::InvalidArgument("tiers: at least one tier is needed");
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
    std::string name = t.instance ? t.instance->name() : (t.name.empty() ? t.kind : t.name);
    if (!names.insert(name).second)
      return Status::InvalidArgument(TierField(i, "name") + ": '" + name +
                                     "' is used twice; give each tier its own name");
  }
  return Status::Ok();
}

struct TierState {
  int index = 0;
  std::shared_ptr<Tier> tier;
  TierCapabilities caps;
  bool cache_verifies = false;  // verify_on_load and the tier does not verify reads itself
  Mutex mu;  // serialises residency changes of this tier: policy, admission, room, Erase
  std::unique_ptr<EvictionPolicy> policy KVTIER_GUARDED_BY(mu);
  // Blocks given room whose Put is in flight outside mu; they count as occupied.
  size_t reserved KVTIER_GUARDED_BY(mu) = 0;
  AdmissionPolicy admission KVTIER_GUARDED_BY(mu){AdmissionOptions{}};
  std::atomic<uint64_t> hit_blocks{0}, evictions{0}, writebacks{0}, rejected{0}, corruptions{0};
};

class Cache::Impl {
 public:
  explicit Impl(CacheOptions options) : options_(std::move(options)) {
    Namespace ns{options_.model_id, options_.model_revision, options_.layout.fingerprint(),
                 options_.tenant, options_.lora_id};
    default_root_ = ns.Root();
  }

  Status OpenTiers() {
    for (size_t i = 0; i < options_.tiers.size(); ++i) {
      const TierSpec& spec = options_.tiers[i];
      auto st = std::make_unique<TierState>();
      st->index = static_cast<int>(i);
      if (spec.instance) {
        st->tier = spec.instance;
      } else {
        auto made = MakeTier(spec, options_.layout);
        if (!made.ok()) return made.status().WithContext("tiers[" + std::to_string(i) + "]");
        st->tier = std::shared_ptr<Tier>(std::move(made).value());
      }
      st->caps = st->tier->capabilities();
      st->cache_verifies = st->caps.verify_on_load && !st->caps.verifies_reads;
      verify_any_ |= st->cache_verifies;
      {
        MutexLock lock(&st->mu);
        KVTIER_ASSIGN_OR_RETURN(st->policy,
                                MakeEvictionPolicy(spec.eviction, st->tier->capacity_blocks()));
        st->admission = AdmissionPolicy(spec.admission);
      }
      if (!st->caps.managed_by_cache) {
        const int t = st->index;
        st->tier->SetRemovalListener([this, t](std::span<const BlockKey> keys) {
          for (const BlockKey& k : keys) {
            if (index_.RemoveTier(k, t)) Emit(KvEvent::Type::kRemoved, k, t);
          }
        });
      }
      tiers_.push_back(std::move(st));
    }
    return Status::Ok();
  }

  ~Impl() {
    for (auto& st : tiers_)
      if (!st->caps.managed_by_cache) st->tier->SetRemovalListener(nullptr);
  }

  BlockKey Root(const RequestOptions& r) const {
    if (r.tenant.empty() && r.lora_id.empty()) return default_root_;
    Namespace ns{options_.model_id, options_.model_revision, options_.layout.fingerprint(),
                 r.tenant.empty() ? options_.tenant : r.tenant,
                 r.lora_id.empty() ? options_.lora_id : r.lora_id};
    return ns.Root();
  }

  void Emit(KvEvent::Type type, const BlockKey& key, int tier) {
    if (!options_.on_event) return;
    KvEvent e;
    e.seq = seq_.fetch_add(1, std::memory_order_relaxed) + 1;
    e.type = type;
    e.key = key;
    e.tier = tier;
    options_.on_event(e);
  }

  Result<LookupResult> LookupKeys(std::span<const BlockKey> keys, const RequestOptions& request);
  Result<LoadResult> Load(const LookupResult& lookup, std::span<const MutableBlock> dst);
  Result<StoreResult> StoreKeys(std::span<const BlockKey> keys, std::span<const ConstBlock> blocks,
                                uint32_t first_block, const RequestOptions& request);
  void NotifySession(uint64_t session_id, SessionEvent event);
  CacheStats Stats() const;

  // The daemon's hooks (cache_hooks.h); tier 0 is a shared HostTier.
  size_t ReserveHost(size_t n, std::vector<uint32_t>* slots);
  void UnreserveHost(std::span<const uint32_t> slots);
  StoreResult CommitHost(std::span<const BlockKey> keys, std::span<const uint32_t> slots,
                         std::span<const uint64_t> checksums, uint32_t first_block);
  uint64_t ClearManaged();
  uint64_t DropMatching(const std::function<bool(const BlockKey&)>& match, uint64_t* pinned);

  const CacheOptions options_;
  BlockKey default_root_;
  BlockIndex index_;
  std::vector<std::unique_ptr<TierState>> tiers_;
  bool verify_any_ = false;

 private:
  struct PendingEvent {
    KvEvent::Type type;
    BlockKey key;
    int tier;
  };

  // Writes blocks into tier t under its policy. Fills per-block results (OK when resident after
  // the call, whether copied or already there) and counts copies in *stored.
  void StoreToTier(TierState& st, std::span<const BlockKey> keys,
                   std::span<const ConstBlock> blocks, std::span<const uint64_t> checksums,
                   uint64_t prefix_tokens, std::span<Status> results, uint32_t* stored,
                   std::vector<PendingEvent>* events);
  // Frees room for `need` more blocks in a cache-managed tier; returns how many fit.
  size_t MakeRoom(TierState& st, size_t need, std::vector<PendingEvent>* events)
      KVTIER_REQUIRES(st.mu);
  // Puts keys[todo[j]]; returns each one's status (the call's, when the whole call failed).
  std::vector<Status> PutTodo(TierState& st, std::span<const BlockKey> keys,
                              std::span<const ConstBlock> blocks,
                              const std::vector<uint32_t>& todo);
  // Copies the Put statuses into results and records the stored blocks in the index and the
  // events (last to first).
  void Record(TierState& st, std::span<const BlockKey> keys, std::span<const uint64_t> checksums,
              const std::vector<uint32_t>& todo, std::span<const Status> put,
              std::span<Status> results, uint32_t* stored, std::vector<PendingEvent>* events);
  void DropBlock(TierState& st, const BlockKey& key);
  void EmitAll(const std::vector<PendingEvent>& events) {
    for (const PendingEvent& e : events) Emit(e.type, e.key, e.tier);
  }

  std::atomic<uint64_t> seq_{0};

 public:
  std::atomic<uint64_t> lookups_{0}, lookup_blocks_{0}, hit_blocks_{0}, loads_{0},
      load_failed_blocks_{0}, stores_{0}, stored_blocks_{0};
  Histogram lookup_latency_, load_latency_, store_latency_;
};

Result<LookupResult> Cache::Impl::LookupKeys(std::span<const BlockKey> keys,
                                             const RequestOptions& request) {
  const uint64_t t0 = MonotonicNs();
  LookupResult r;
  r.block_tokens = options_.layout.block_tokens;
  r.keys.assign(keys.begin(), keys.end());
  MatchResult m;
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
        index_.AddTier(rest[j], st->index, 0);
        masks.push_back(TierMask{1} << st->index);
      }
      hit += extra;
    }
  }

  r.hit_blocks = hit;
  r.source.resize(hit);
  for (uint32_t i = 0; i < hit; ++i) {
    // The fastest tier holding the bytes; a metadata-only tier when nothing else has it.
    int src = -1;
    for (auto& st : tiers_) {
      if (!(masks[i] & (TierMask{1} << st->index))) continue;
      if (st->caps.stores_bytes) {
        src = st->index;
        break;
      }
      if (src < 0) src = st->index;
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

  lookups_.fetch_add(1, std::memory_order_relaxed);
  lookup_blocks_.fetch_add(keys.size(), std::memory_order_relaxed);
  hit_blocks_.fetch_add(hit, std::memory_order_relaxed);
  lookup_latency_.Record(MonotonicNs() - t0);
  return r;
}

void Cache::Impl::DropBlock(TierState& st, const BlockKey& key) {
  const BlockKey k[1] = {key};
  if (st.caps.managed_by_cache) {
    MutexLock lock(&st.mu);
    if (index_.RemoveTier(key, st.index)) {
      st.policy->OnErase(key);
      (void)st.tier->Erase(k);
    }
  } else {
    index_.RemoveTier(key, st.index);
    (void)st.tier->Erase(k);
  }
  Emit(KvEvent::Type::kRemoved, key, st.index);
}

Result<LoadResult> Cache::Impl::Load(const LookupResult& lookup,
                                     std::span<const MutableBlock> dst) {
  const uint64_t t0 = MonotonicNs();
  const uint64_t block_bytes = options_.layout.bytes_per_block();
  if (dst.size() > lookup.hit_blocks)
    return Status::InvalidArgument("Load: " + std::to_string(dst.size()) +
                                   " buffers for a lookup of " + std::to_string(lookup.hit_blocks) +
                                   " hit blocks");
  for (size_t i = 0; i < dst.size(); ++i)
    if (dst[i].size() != block_bytes)
      return Status::InvalidArgument("Load: buffer " + std::to_string(i) + " has " +
                                     std::to_string(dst[i].size()) + " bytes, a block has " +
                                     std::to_string(block_bytes));
  LoadResult r;
  r.block_status.assign(dst.size(), Status::Ok());
  const size_t n = dst.size();

  // One batched Get per source tier.
  std::vector<uint32_t> idx;
  std::vector<BlockKey> keys;
  std::vector<MutableBlock> bufs;
  std::vector<Status> res;
  std::vector<bool> done(n, false);
  for (auto& st : tiers_) {
    idx.clear();
    for (uint32_t i = 0; i < n; ++i)
      if (lookup.source[i] == st->index) idx.push_back(i);
    if (idx.empty()) continue;
    if (!st->caps.stores_bytes) {
      for (uint32_t i : idx)
        r.block_status[i] = Status::InvalidArgument("tier '" + st->tier->name() +
                                                    "' holds no bytes (metadata only)");
      continue;
    }
    keys.clear();
    bufs.clear();
    for (uint32_t i : idx) {
      keys.push_back(lookup.keys[i]);
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
    const int src = lookup.source[i];
    if (done[i] && options_.verify_checksums && tiers_[src]->cache_verifies) {
      IndexEntry e;
      if (index_.Get(lookup.keys[i], &e) && e.checksum != 0 && Checksum64(dst[i]) != e.checksum) {
        tiers_[src]->corruptions.fetch_add(1, std::memory_order_relaxed);
        r.block_status[i] = Status::Corruption("tier '" + tiers_[src]->tier->name() + "': block " +
                                               lookup.keys[i].ToHex() + " failed its checksum");
        done[i] = false;
      }
    }
    if (done[i]) continue;
    // A block that failed here is gone from that tier: keep the index honest.
    if (r.block_status[i].code() == StatusCode::kCorruption ||
        r.block_status[i].code() == StatusCode::kNotFound) {
      if (r.block_status[i].code() == StatusCode::kCorruption && !tiers_[src]->cache_verifies)
        tiers_[src]->corruptions.fetch_add(1, std::memory_order_relaxed);
      DropBlock(*tiers_[src], lookup.keys[i]);
    }
    IndexEntry e;
    if (!index_.Get(lookup.keys[i], &e)) continue;
    for (auto& st : tiers_) {
      if (st->index == src || !(e.tiers & (TierMask{1} << st->index)) || !st->caps.stores_bytes)
        continue;
      const BlockKey k[1] = {lookup.keys[i]};
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
  load_failed_blocks_.fetch_add(n - r.loaded_blocks, std::memory_order_relaxed);

  // Promote blocks that came from below into the first byte-holding tier.
  if (options_.promote_on_load && r.loaded_blocks > 0) {
    TierState* top = nullptr;
    for (auto& st : tiers_)
      if (st->caps.stores_bytes) {
        top = st.get();
        break;
      }
    if (top) {
      std::vector<BlockKey> pk;
      std::vector<ConstBlock> pb;
      std::vector<uint64_t> pc;
      for (uint32_t i = 0; i < r.loaded_blocks; ++i) {
        if (lookup.source[i] == top->index) continue;
        IndexEntry e;
        if (index_.Get(lookup.keys[i], &e) && (e.tiers & (TierMask{1} << top->index))) continue;
        pk.push_back(lookup.keys[i]);
        pb.push_back(dst[i]);
        pc.push_back(e.checksum);
      }
      if (!pk.empty()) {
        std::vector<Status> ps(pk.size());
        std::vector<PendingEvent> events;
        uint32_t stored = 0;
        StoreToTier(*top, pk, pb, pc, lookup.hit_tokens(), ps, &stored, &events);
        EmitAll(events);
      }
    }
  }
  loads_.fetch_add(1, std::memory_order_relaxed);
  load_latency_.Record(MonotonicNs() - t0);
  return r;
}

size_t Cache::Impl::MakeRoom(TierState& st, size_t need, std::vector<PendingEvent>* events) {
  const uint64_t cap = st.tier->capacity_blocks();
  const uint64_t block_bytes = options_.layout.bytes_per_block();
  auto evictable = [this](const BlockKey& k) { return !index_.IsPinned(k); };
  size_t attempts = 0;
  while (st.policy->size() + st.reserved + need > cap) {
    std::optional<BlockKey> victim = st.policy->PickVictim(evictable);
    if (!victim) break;
    // Read the entry first: removing the last tier drops it, checksum and all.
    IndexEntry e;
    const bool known = index_.Get(*victim, &e);
    if (!index_.TryRemoveUnpinned(*victim, st.index)) {
      // Pinned since the policy looked: it stays resident.
      st.policy->OnInsert(*victim, AccessHint{});
      if (++attempts > 64) break;
      continue;
    }
    const BlockKey k[1] = {*victim};
    if (options_.write_mode == WriteMode::kWriteBack &&
        st.index + 1 < static_cast<int>(tiers_.size()) && st.caps.stores_bytes) {
      TierState& below = *tiers_[st.index + 1];
      const bool already = known && (e.tiers & (TierMask{1} << below.index));
      if (!already) {
        std::vector<std::byte>& buf = VictimBuffer(st.index, block_bytes);
        const MutableBlock b[1] = {MutableBlock(buf.data(), block_bytes)};
        Status s[1];
        if (st.tier->Get(k, b, s).ok() && s[0].ok()) {
          const ConstBlock cb[1] = {ConstBlock(buf.data(), block_bytes)};
          const uint64_t cs[1] = {known ? e.checksum : 0};
          Status ws[1];
          uint32_t stored = 0;
          StoreToTier(below, k, cb, cs, 0, ws, &stored, events);
          if (stored) st.writebacks.fetch_add(1, std::memory_order_relaxed);
        }
      }
    }
    (void)st.tier->Erase(k);
    st.evictions.fetch_add(1, std::memory_order_relaxed);
    events->push_back({KvEvent::Type::kRemoved, *victim, st.index});
  }
  const uint64_t held = st.policy->size() + st.reserved;
  return held >= cap ? 0 : std::min<size_t>(need, cap - held);
}

void Cache::Impl::StoreToTier(TierState& st, std::span<const BlockKey> keys,
                              std::span<const ConstBlock> blocks,
                              std::span<const uint64_t> checksums, uint64_t prefix_tokens,
                              std::span<Status> results, uint32_t* stored,
                              std::vector<PendingEvent>* events) {
  const TierMask bit = TierMask{1} << st.index;
  std::vector<uint32_t> todo;
  {
    MutexLock lock(&st.mu);
    // Last to first: the chain's head ends most recent, so its tail is evicted first.
    for (size_t i = keys.size(); i-- > 0;) {
      IndexEntry e;
      if (index_.Get(keys[i], &e) && (e.tiers & bit)) {
        if (st.caps.managed_by_cache) st.policy->OnAccess(keys[i], AccessHint{});
        results[i] = Status::Ok();
        continue;
      }
      if (!st.admission.Admit(keys[i], prefix_tokens)) {
        st.rejected.fetch_add(1, std::memory_order_relaxed);
        results[i] = Status::ResourceExhausted("tier '" + st.tier->name() + "': not admitted");
        continue;
      }
      todo.push_back(static_cast<uint32_t>(i));
    }
    if (todo.empty()) return;
    // todo is in last-to-first order; the Put goes first to last.
    std::reverse(todo.begin(), todo.end());
    if (st.caps.managed_by_cache) {
      // Room, Put and policy change together: the policy's size is the tier's occupancy.
      const size_t fit = MakeRoom(st, todo.size(), events);
      if (fit < todo.size()) {
        // Keep the head of the chain when room is short.
        TierState* below = options_.write_mode == WriteMode::kWriteBack &&
                                   st.index + 1 < static_cast<int>(tiers_.size())
                               ? tiers_[st.index + 1].get()
                               : nullptr;
        if (below) {
          // Write-back: what cannot stay here would be a victim at once; it goes down directly.
          std::vector<BlockKey> ok;
          std::vector<ConstBlock> ob;
          std::vector<uint64_t> oc;
          for (size_t j = fit; j < todo.size(); ++j) {
            ok.push_back(keys[todo[j]]);
            ob.push_back(blocks[todo[j]]);
            oc.push_back(checksums[todo[j]]);
          }
          std::vector<Status> os(ok.size());
          uint32_t moved = 0;
          StoreToTier(*below, ok, ob, oc, prefix_tokens, os, &moved, events);
          st.writebacks.fetch_add(moved, std::memory_order_relaxed);
          for (size_t j = fit; j < todo.size(); ++j) results[todo[j]] = os[j - fit];
        } else {
          for (size_t j = fit; j < todo.size(); ++j)
            results[todo[j]] = Status::ResourceExhausted(
                "tier '" + st.tier->name() + "': no room (" +
                std::to_string(st.tier->capacity_blocks()) + " blocks, the rest pinned)");
        }
      }
      todo.resize(fit);
      if (todo.empty()) return;
      st.reserved += todo.size();
    }
  }
  // The Put runs outside st.mu: copies into host DRAM (or a self-managed tier's I/O) must not
  // hold up Lookups, Loads and other Stores of this tier. A managed tier's blocks have room
  // reserved above; self-managed tiers (disk, remote) bound themselves.
  std::vector<Status> put = PutTodo(st, keys, blocks, todo);
  if (!st.caps.managed_by_cache) {
    // A block the tier drops at once is a miss on Load, which keeps the index honest.
    Record(st, keys, checksums, todo, put, results, stored, events);
    return;
  }
  // The policy, then the index: a Lookup never finds a block its tier's policy does not hold.
  MutexLock lock(&st.mu);
  st.reserved -= todo.size();
  for (size_t j = todo.size(); j-- > 0;) {
    if (!put[j].ok()) continue;
    AccessHint hint;
    hint.position = todo[j];
    st.policy->OnInsert(keys[todo[j]], hint);
  }
  Record(st, keys, checksums, todo, put, results, stored, events);
}

std::vector<Status> Cache::Impl::PutTodo(TierState& st, std::span<const BlockKey> keys,
                                         std::span<const ConstBlock> blocks,
                                         const std::vector<uint32_t>& todo) {
  std::vector<BlockKey> pk;
  std::vector<ConstBlock> pb;
  pk.reserve(todo.size());
  pb.reserve(todo.size());
  for (uint32_t i : todo) {
    pk.push_back(keys[i]);
    pb.push_back(blocks[i]);
  }
  std::vector<Status> ps(todo.size());
  Status call = st.tier->Put(pk, pb, ps);
  if (!call.ok()) std::fill(ps.begin(), ps.end(), call);
  return ps;
}

void Cache::Impl::Record(TierState& st, std::span<const BlockKey> keys,
                         std::span<const uint64_t> checksums, const std::vector<uint32_t>& todo,
                         std::span<const Status> put, std::span<Status> results, uint32_t* stored,
                         std::vector<PendingEvent>* events) {
  for (size_t j = todo.size(); j-- > 0;) {
    const uint32_t i = todo[j];
    results[i] = put[j];
    if (!put[j].ok()) continue;
    index_.AddTier(keys[i], st.index, checksums[i]);
    ++*stored;
    events->push_back({KvEvent::Type::kStored, keys[i], st.index});
  }
}

Result<StoreResult> Cache::Impl::StoreKeys(std::span<const BlockKey> keys,
                                           std::span<const ConstBlock> blocks, uint32_t first_block,
                                           const RequestOptions&) {
  const uint64_t t0 = MonotonicNs();
  const uint64_t block_bytes = options_.layout.bytes_per_block();
  if (keys.size() != blocks.size())
    return Status::InvalidArgument("Store: " + std::to_string(keys.size()) + " keys but " +
                                   std::to_string(blocks.size()) + " blocks");
  bool any_bytes_tier = false;
  for (auto& st : tiers_) any_bytes_tier |= st->caps.stores_bytes;
  for (size_t i = 0; i < blocks.size(); ++i)
    if (any_bytes_tier && blocks[i].size() != block_bytes)
      return Status::InvalidArgument("Store: block " + std::to_string(i) + " has " +
                                     std::to_string(blocks[i].size()) + " bytes, the layout's " +
                                     "block has " + std::to_string(block_bytes));
  StoreResult r;
  if (keys.empty()) return r;
  std::vector<uint64_t> checksums(keys.size(), 0);
  if (options_.verify_checksums && verify_any_)
    for (size_t i = 0; i < keys.size(); ++i) checksums[i] = Checksum64(blocks[i]);
  const uint64_t prefix_tokens =
      (uint64_t{first_block} + keys.size()) * options_.layout.block_tokens;

  std::vector<uint8_t> ok_anywhere(keys.size(), 0), present(keys.size(), 0);
  for (size_t i = 0; i < keys.size(); ++i) {
    IndexEntry e;
    present[i] = index_.Get(keys[i], &e) && e.tiers != 0;
  }
  std::vector<Status> results(keys.size()), first_failure(keys.size());
  std::vector<PendingEvent> events;
  for (auto& st : tiers_) {
    uint32_t stored = 0;
    StoreToTier(*st, keys, blocks, checksums, prefix_tokens, results, &stored, &events);
    for (size_t i = 0; i < keys.size(); ++i) {
      if (results[i].ok())
        ok_anywhere[i] = 1;
      else if (first_failure[i].ok())
        first_failure[i] = results[i];
    }
    if (options_.write_mode == WriteMode::kWriteBack) break;
  }
  EmitAll(events);
  for (size_t i = 0; i < keys.size(); ++i) {
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

void Cache::Impl::NotifySession(uint64_t session_id, SessionEvent event) {
  const double now = MonotonicSeconds();
  for (auto& st : tiers_) {
    MutexLock lock(&st->mu);
    st->policy->OnSessionEvent(session_id, event, now);
  }
}

CacheStats Cache::Impl::Stats() const {
  CacheStats s;
  for (const auto& st : tiers_) {
    CacheStats::PerTier t;
    t.name = st->tier->name();
    t.kind = st->tier->kind();
    t.tier = st->tier->stats();
    t.resident_blocks = t.tier.used_bytes / st->tier->block_bytes();
    t.hit_blocks = st->hit_blocks.load(std::memory_order_relaxed);
    t.evictions = st->evictions.load(std::memory_order_relaxed);
    t.writebacks = st->writebacks.load(std::memory_order_relaxed);
    t.rejected = st->rejected.load(std::memory_order_relaxed);
    t.corruptions = st->corruptions.load(std::memory_order_relaxed);
    s.tiers.push_back(std::move(t));
  }
  s.lookups = lookups_.load(std::memory_order_relaxed);
  s.lookup_blocks = lookup_blocks_.load(std::memory_order_relaxed);
  s.hit_blocks = hit_blocks_.load(std::memory_order_relaxed);
  s.loads = loads_.load(std::memory_order_relaxed);
  s.load_failed_blocks = load_failed_blocks_.load(std::memory_order_relaxed);
  s.stores = stores_.load(std::memory_order_relaxed);
  s.stored_blocks = stored_blocks_.load(std::memory_order_relaxed);
  s.lookup_latency_ns = lookup_latency_.Take();
  s.load_latency_ns = load_latency_.Take();
  s.store_latency_ns = store_latency_.Take();
  return s;
}

size_t Cache::Impl::ReserveHost(size_t n, std::vector<uint32_t>* slots) {
  TierState& st = *tiers_[0];
  auto* host = static_cast<HostTier*>(st.tier.get());
  std::vector<PendingEvent> events;
  size_t fit = 0;
  {
    MutexLock lock(&st.mu);
    fit = MakeRoom(st, n, &events);
    st.reserved += fit;
  }
  EmitAll(events);
  const size_t got = host->ReserveSlots(fit, slots);
  if (got < fit) {  // cannot happen while the policy's size is the tier's occupancy
    MutexLock lock(&st.mu);
    st.reserved -= fit - got;
  }
  return got;
}

void Cache::Impl::UnreserveHost(std::span<const uint32_t> slots) {
  TierState& st = *tiers_[0];
  static_cast<HostTier*>(st.tier.get())->ReleaseSlots(slots);
  MutexLock lock(&st.mu);
  st.reserved -= slots.size();
}

StoreResult Cache::Impl::CommitHost(std::span<const BlockKey> keys, std::span<const uint32_t> slots,
                                    std::span<const uint64_t> checksums, uint32_t first_block) {
  const uint64_t t0 = MonotonicNs();
  TierState& st = *tiers_[0];
  auto* host = static_cast<HostTier*>(st.tier.get());
  StoreResult r;
  std::vector<PendingEvent> events;
  // Lower tiers first, from the still-reserved slots: nobody can evict or reuse a reserved
  // slot, so the bytes written down are the bytes committed.
  if (options_.write_mode == WriteMode::kWriteThrough && tiers_.size() > 1) {
    std::vector<ConstBlock> blocks;
    for (uint32_t s : slots)
      blocks.emplace_back(host->arena() + host->SlotOffset(s), host->block_bytes());
    const uint64_t prefix_tokens =
        (uint64_t{first_block} + keys.size()) * options_.layout.block_tokens;
    std::vector<Status> results(keys.size());
    for (size_t t = 1; t < tiers_.size(); ++t) {
      uint32_t stored = 0;
      StoreToTier(*tiers_[t], keys, blocks, checksums, prefix_tokens, results, &stored, &events);
    }
  }
  std::unique_ptr<bool[]> published(new bool[keys.size()]);
  host->PublishSlots(keys, slots, std::span<bool>(published.get(), keys.size()));
  {
    MutexLock lock(&st.mu);
    st.reserved -= keys.size();
    for (size_t j = keys.size(); j-- > 0;) {
      AccessHint hint;
      hint.position = first_block + j;
      st.policy->OnInsert(keys[j], hint);
      if (!published[j]) {
        ++r.present_blocks;
        continue;
      }
      index_.AddTier(keys[j], st.index, checksums[j]);
      events.push_back({KvEvent::Type::kStored, keys[j], st.index});
      ++r.stored_blocks;
    }
  }
  EmitAll(events);
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
    std::vector<PendingEvent> events;
    {
      MutexLock lock(&st.mu);
      size_t skipped = 0;
      while (skipped < 64) {
        std::optional<BlockKey> victim = st.policy->PickVictim(evictable);
        if (!victim) break;
        if (!index_.TryRemoveUnpinned(*victim, st.index)) {
          st.policy->OnInsert(*victim, AccessHint{});
          ++skipped;
          continue;
        }
        const BlockKey k[1] = {*victim};
        (void)st.tier->Erase(k);
        ++dropped;
        events.push_back({KvEvent::Type::kRemoved, *victim, st.index});
      }
    }
    EmitAll(events);
  }
  return dropped;
}

uint64_t Cache::Impl::DropMatching(const std::function<bool(const BlockKey&)>& match,
                                   uint64_t* pinned) {
  std::vector<std::pair<BlockKey, TierMask>> found;
  index_.Select(match, &found);
  uint64_t dropped = 0;
  *pinned = 0;
  for (const auto& [key, mask] : found) {
    bool any = false, held = false;
    for (auto& stp : tiers_) {
      TierState& st = *stp;
      if (!(mask & (TierMask{1} << st.index))) continue;
      const BlockKey k[1] = {key};
      if (st.caps.managed_by_cache) {
        MutexLock lock(&st.mu);
        if (!index_.TryRemoveUnpinned(key, st.index)) {
          held |= index_.IsPinned(key);
          continue;
        }
        st.policy->OnErase(key);
        (void)st.tier->Erase(k);
      } else {
        if (!index_.RemoveTier(key, st.index)) continue;
        (void)st.tier->Erase(k);
      }
      any = true;
      Emit(KvEvent::Type::kRemoved, key, st.index);
    }
    dropped += any;
    *pinned += held;
  }
  return dropped;
}

bool CacheHooks::HasSharedHost(const Cache& cache) {
  if (cache.impl_->tiers_.empty()) return false;
  auto* host = dynamic_cast<HostTier*>(cache.impl_->tiers_[0]->tier.get());
  return host != nullptr && host->arena_fd() >= 0 && cache.impl_->tiers_[0]->caps.managed_by_cache;
}

HostTier& CacheHooks::SharedHost(Cache& cache) {
  return *static_cast<HostTier*>(cache.impl_->tiers_[0]->tier.get());
}

size_t CacheHooks::Reserve(Cache& cache, size_t n, std::vector<uint32_t>* slots) {
  return cache.impl_->ReserveHost(n, slots);
}

void CacheHooks::Unreserve(Cache& cache, std::span<const uint32_t> slots) {
  cache.impl_->UnreserveHost(slots);
}

StoreResult CacheHooks::Commit(Cache& cache, std::span<const BlockKey> keys,
                               std::span<const uint32_t> slots, std::span<const uint64_t> checksums,
                               uint32_t first_block) {
  return cache.impl_->CommitHost(keys, slots, checksums, first_block);
}

uint64_t CacheHooks::ClearManaged(Cache& cache) { return cache.impl_->ClearManaged(); }

uint64_t CacheHooks::DropMatching(Cache& cache, const std::function<bool(const BlockKey&)>& match,
                                  uint64_t* pinned) {
  return cache.impl_->DropMatching(match, pinned);
}

// --- Cache: thin forwarding and argument checks ---

Result<std::unique_ptr<Cache>> Cache::Open(CacheOptions options) {
  KVTIER_RETURN_IF_ERROR(options.Validate());
  auto impl = std::make_unique<Impl>(std::move(options));
  KVTIER_RETURN_IF_ERROR(impl->OpenTiers());
  return std::unique_ptr<Cache>(new Cache(std::move(impl)));
}

Cache::Cache(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Cache::~Cache() = default;

const KvLayout& Cache::layout() const { return impl_->options_.layout; }
int Cache::num_tiers() const { return static_cast<int>(impl_->tiers_.size()); }
Tier& Cache::tier(int index) { return *impl_->tiers_.at(index)->tier; }
BlockKey Cache::Root(const RequestOptions& request) const { return impl_->Root(request); }

Result<LookupResult> Cache::Lookup(std::span<const TokenId> tokens, const RequestOptions& request) {
  std::vector<BlockKey> keys;
  HashPrefix(impl_->Root(request), impl_->options_.layout.block_tokens, tokens, &keys);
  return impl_->LookupKeys(keys, request);
}

Result<LookupResult> Cache::LookupKeys(std::span<const BlockKey> keys,
                                       const RequestOptions& request) {
  return impl_->LookupKeys(keys, request);
}

Result<LoadResult> Cache::Load(const LookupResult& lookup, std::span<const MutableBlock> dst) {
  return impl_->Load(lookup, dst);
}

Result<StoreResult> Cache::Store(std::span<const TokenId> tokens,
                                 std::span<const ConstBlock> blocks, uint32_t first_block,
                                 const RequestOptions& request) {
  const uint32_t bt = impl_->options_.layout.block_tokens;
  const size_t full = tokens.size() / bt;
  if (uint64_t{first_block} + blocks.size() > full)
    return Status::InvalidArgument("Store: blocks " + std::to_string(first_block) + ".." +
                                   std::to_string(first_block + blocks.size()) + " asked, but " +
                                   std::to_string(tokens.size()) + " tokens make only " +
                                   std::to_string(full) + " full blocks of " + std::to_string(bt));
  std::vector<BlockKey> keys;
  HashPrefix(impl_->Root(request), bt,
             tokens.subspan(0, (uint64_t{first_block} + blocks.size()) * bt), &keys);
  return impl_->StoreKeys(std::span<const BlockKey>(keys).subspan(first_block), blocks, first_block,
                          request);
}

Result<StoreResult> Cache::StoreKeys(std::span<const BlockKey> keys,
                                     std::span<const ConstBlock> blocks, uint32_t first_block,
                                     const RequestOptions& request) {
  return impl_->StoreKeys(keys, blocks, first_block, request);
}

void Cache::NotifySession(uint64_t session_id, SessionEvent event) {
  impl_->NotifySession(session_id, event);
}

CacheStats Cache::stats() const { return impl_->Stats(); }

}  // namespace kvtier
