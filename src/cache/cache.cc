#include "kvtier/cache.h"

#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <set>
#include <thread>

#include "cache/cache_hooks.h"
#include "common/clock.h"
#include "common/flat_map.h"
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
  if (write_queue_blocks > (1u << 20))
    return Status::InvalidArgument("write_queue_blocks: at most 1048576, got " +
                                   std::to_string(write_queue_blocks));
  return Status::Ok();
}

// Lock order. A thread holds at most one TierState::mu at a time, and takes BlockIndex's shard
// locks (inside BlockIndex calls) only under it or under no lock, never the reverse.
// writer_mu_ is a leaf: never held together with a TierState::mu. No tier call (Put, Get,
// Erase, Exists) and no on_event callback runs under any Cache lock: the write path reserves
// room under TierState::mu, moves bytes without it, then commits under it again.
struct TierState {
  int index = 0;
  std::shared_ptr<Tier> tier;
  TierCapabilities caps;
  bool cache_verifies = false;  // verify_on_load and the tier does not verify reads itself
  // Write-back with a tier below: victims carry their chain position down.
  bool tracks_positions = false;
  Mutex mu;  // serialises residency changes of this tier: policy, admission, room
  std::unique_ptr<EvictionPolicy> policy KVTIER_GUARDED_BY(mu);
  // Slots not in the policy that still count as occupied: blocks given room whose Put is in
  // flight, and blocks taken out of the policy whose Erase is in flight (both outside mu).
  size_t reserved KVTIER_GUARDED_BY(mu) = 0;
  AdmissionPolicy admission KVTIER_GUARDED_BY(mu){AdmissionOptions{}};
  FlatKeyMap<uint32_t> positions KVTIER_GUARDED_BY(mu);  // key -> chain position (write-back)
  std::atomic<uint64_t> hit_blocks{0}, evictions{0}, writebacks{0}, rejected{0}, corruptions{0},
      write_failures{0};
};

// Blocks on their way into a tier. blocks[i] may be empty until a background job reads it.
struct BlockBatch {
  std::vector<BlockKey> keys;
  std::vector<ConstBlock> blocks;
  std::vector<uint64_t> checksums;
  std::vector<uint32_t> positions;      // chain position: the policy's hint
  std::vector<uint64_t> prefix_tokens;  // the prefix length admission judges
  std::vector<uint64_t> sessions;
  double now_s = 0;

  size_t size() const { return keys.size(); }
  void Add(const BlockKey& key, ConstBlock block, uint64_t checksum, uint32_t position,
           uint64_t prefix, uint64_t session) {
    keys.push_back(key);
    blocks.push_back(block);
    checksums.push_back(checksum);
    positions.push_back(position);
    prefix_tokens.push_back(prefix);
    sessions.push_back(session);
  }
  void Append(const BlockBatch& o) {
    for (size_t i = 0; i < o.size(); ++i)
      Add(o.keys[i], o.blocks[i], o.checksums[i], o.positions[i], o.prefix_tokens[i],
          o.sessions[i]);
  }
};

// A victim taken out of a tier's policy and index under its lock; erased (and, in write-back,
// read for the tier below) after the lock is dropped.
struct Victim {
  BlockKey key;
  uint64_t checksum = 0;
  uint32_t position = 0;
  bool below_has = false;  // the tier below holds it already
};

// Writes for tiers [first_target, last_target], run by the background writer (or by the caller
// once its locks are dropped, when CacheOptions::write_queue_blocks is 0). Block i's bytes are
// in `staged` when from[i] < 0; otherwise they are read from tier from[i], where `pins` keeps
// them resident until the job is done.
struct WriteJob {
  BlockBatch batch;
  std::vector<int8_t> from;
  std::unique_ptr<std::byte[]> staged;  // size() blocks
  PinSet pins;
  int first_target = 0;
  int last_target = 0;
  int victims_of = -1;     // write-back: the blocks left this tier; count writebacks there
  bool promotion = false;  // a miss on re-reading the source is not a failure

  // Makes room for n blocks of block_bytes.
  void Stage(size_t n, uint64_t block_bytes) { staged.reset(new std::byte[n * block_bytes]); }
  std::byte* Slot(size_t i, uint64_t block_bytes) { return staged.get() + i * block_bytes; }
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
      st->tracks_positions = options_.write_mode == WriteMode::kWriteBack &&
                             i + 1 < options_.tiers.size() && st->caps.managed_by_cache;
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
      if (top_ < 0 && st->caps.stores_bytes) top_ = st->index;
      tiers_.push_back(std::move(st));
    }
    if (top_ < 0) top_ = static_cast<int>(tiers_.size()) - 1;
    async_ = options_.write_queue_blocks > 0;
    if (async_) writer_ = std::thread([this] { WriterLoop(); });
    return Status::Ok();
  }

  ~Impl() {
    // Drain: every queued write finishes before the tiers go.
    if (writer_.joinable()) {
      {
        MutexLock lock(&writer_mu_);
        stop_ = true;
      }
      work_cv_.notify_all();
      writer_.join();
    }
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
  // promote_now: promotion runs in this thread before returning (the daemon's staging,
  // where the host copy is what the client reads), else in the background when async.
  Result<LoadResult> Load(const LookupResult& lookup, uint32_t first,
                          std::span<const MutableBlock> dst, bool promote_now = false);
  Result<StoreResult> StoreKeys(std::span<const BlockKey> keys, std::span<const ConstBlock> blocks,
                                uint32_t first_block, const RequestOptions& request);
  void NotifySession(uint64_t session_id, SessionEvent event);
  CacheStats Stats() const;
  void Flush() KVTIER_EXCLUDES(writer_mu_);

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

  // Writes b's blocks into tier st under its policy. Fills per-block results (OK when resident
  // after the call, whether copied or already there) and counts copies in *stored. Write-back
  // victims of st, and blocks that did not fit in it, come back in *down for the tier below.
  // Takes st.mu itself; the caller holds no Cache lock.
  void StoreToTier(TierState& st, const BlockBatch& b, std::span<Status> results, uint32_t* stored,
                   std::vector<PendingEvent>* events, std::vector<WriteJob>* down)
      KVTIER_EXCLUDES(st.mu, writer_mu_);
  // Takes victims out of a cache-managed tier's policy and index until `need` more blocks fit
  // (they count in st.reserved until EvictOut erases them); returns how many fit.
  size_t MakeRoom(TierState& st, size_t need, std::vector<Victim>* victims) KVTIER_REQUIRES(st.mu);
  // Erases victims from st outside st.mu, after reading those the tier below lacks into one
  // write-back job (*down). The reservation that made room for them covers their slots.
  void EvictOut(TierState& st, const std::vector<Victim>& victims,
                std::vector<PendingEvent>* events, std::vector<WriteJob>* down)
      KVTIER_EXCLUDES(st.mu, writer_mu_);
  // Puts b.keys[todo[j]]; returns each one's status (the call's, when the whole call failed).
  std::vector<Status> PutTodo(TierState& st, const BlockBatch& b,
                              const std::vector<uint32_t>& todo);
  // Copies the Put statuses into results and records the stored blocks in the index and the
  // events (last to first).
  void Record(TierState& st, const BlockBatch& b, const std::vector<uint32_t>& todo,
              std::span<const Status> put, std::span<Status> results, uint32_t* stored,
              std::vector<PendingEvent>* events);
  void DropBlock(TierState& st, const BlockKey& key);
  void EmitAll(const std::vector<PendingEvent>& events) {
    for (const PendingEvent& e : events) Emit(e.type, e.key, e.tier);
  }
  // Queues jobs for the writer (waiting while the queue is full), or runs them here when
  // writes are synchronous or this is the writer's own thread.
  void Dispatch(std::vector<WriteJob> jobs) KVTIER_EXCLUDES(writer_mu_);
  // Queues a job. wait=false: gives up (false) instead of waiting for room.
  bool Enqueue(WriteJob job, bool wait) KVTIER_EXCLUDES(writer_mu_);
  // Runs jobs: reads what is not staged, then one Put per target tier for all jobs that share
  // their targets.
  void RunJobs(std::vector<WriteJob>& jobs) KVTIER_EXCLUDES(writer_mu_);
  void WriterLoop() KVTIER_EXCLUDES(writer_mu_);
  // Waits on cv until done(); the caller holds writer_mu_ through `held`.
  template <typename Done>
  void WaitLocked(std::condition_variable& cv, MutexLock& held,
                  Done done) KVTIER_NO_THREAD_SAFETY_ANALYSIS {
    (void)held;
    std::unique_lock<std::mutex> ul(writer_mu_.native(), std::adopt_lock);
    while (!done()) cv.wait(ul);
    ul.release();  // the MutexLock still owns the mutex
  }
  bool InWriter() const { return async_ && std::this_thread::get_id() == writer_.get_id(); }
  // Counts failures of a background write in the target tier's stats (never lost silently).
  void CountFailures(TierState& st, std::span<const Status> results);

  std::atomic<uint64_t> seq_{0};
  int top_ = -1;  // the first byte-holding tier: the only one written on the caller's path
  bool async_ = false;

  Mutex writer_mu_;
  std::condition_variable work_cv_;   // a job was queued, or stopping
  std::condition_variable space_cv_;  // the queue shrank, or became idle
  std::deque<WriteJob> queue_ KVTIER_GUARDED_BY(writer_mu_);
  size_t queued_blocks_ KVTIER_GUARDED_BY(writer_mu_) = 0;  // queued or being written
  size_t busy_jobs_ KVTIER_GUARDED_BY(writer_mu_) = 0;      // queued or being written
  bool stop_ KVTIER_GUARDED_BY(writer_mu_) = false;
  std::thread writer_;

 public:
  std::atomic<uint64_t> lookups_{0}, lookup_blocks_{0}, hit_blocks_{0}, loads_{0},
      load_failed_blocks_{0}, stores_{0}, stored_blocks_{0}, write_queue_waits_{0},
      promotions_dropped_{0};
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
    {
      MutexLock lock(&st.mu);
      if (!index_.RemoveTier(key, st.index)) return;
      st.policy->OnErase(key);
      st.positions.Erase(key);
      ++st.reserved;  // its slot stays occupied until the Erase below
    }
    (void)st.tier->Erase(k);
    MutexLock lock(&st.mu);
    --st.reserved;
  } else {
    index_.RemoveTier(key, st.index);
    (void)st.tier->Erase(k);
  }
  Emit(KvEvent::Type::kRemoved, key, st.index);
}

Result<LoadResult> Cache::Impl::Load(const LookupResult& lookup, uint32_t first,
                                     std::span<const MutableBlock> dst, bool promote_now) {
  const uint64_t t0 = MonotonicNs();
  const uint64_t block_bytes = options_.layout.bytes_per_block();
  if (uint64_t{first} + dst.size() > lookup.hit_blocks)
    return Status::InvalidArgument("Load: blocks " + std::to_string(first) + ".." +
                                   std::to_string(uint64_t{first} + dst.size()) +
                                   " asked of a lookup of " + std::to_string(lookup.hit_blocks) +
                                   " hit blocks");
  for (size_t i = 0; i < dst.size(); ++i)
    if (dst[i].size() != block_bytes)
      return Status::InvalidArgument("Load: buffer " + std::to_string(i) + " has " +
                                     std::to_string(dst[i].size()) + " bytes, a block has " +
                                     std::to_string(block_bytes));
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
    if (!st->caps.stores_bytes) {
      for (uint32_t i : idx)
        r.block_status[i] = Status::InvalidArgument("tier '" + st->tier->name() +
                                                    "' holds no bytes (metadata only)");
      continue;
    }
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
      if (st->index == src || !(e.tiers & (TierMask{1} << st->index)) || !st->caps.stores_bytes)
        continue;
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
  load_failed_blocks_.fetch_add(n - r.loaded_blocks, std::memory_order_relaxed);

  // Promote blocks that came from below into the first byte-holding tier: in the background
  // (re-read from their tier, off the caller's path) when writes are asynchronous.
  if (options_.promote_on_load && r.loaded_blocks > 0 && tiers_[top_]->caps.stores_bytes) {
    TierState* top = tiers_[top_].get();
    WriteJob job;
    for (uint32_t i = 0; i < r.loaded_blocks; ++i) {
      if (source_of(i) == top->index) continue;
      IndexEntry e;
      if (index_.Get(key_of(i), &e) && (e.tiers & (TierMask{1} << top->index))) continue;
      job.batch.Add(key_of(i), dst[i], e.checksum, first + i, lookup.hit_tokens(), 0);
      job.from.push_back(source_of(i));
    }
    if (job.batch.size() > 0) {
      job.batch.now_s = MonotonicSeconds();
      job.first_target = job.last_target = top->index;
      if (!async_ || promote_now) {
        std::fill(job.from.begin(), job.from.end(), int8_t{-1});  // read from dst, here
        std::vector<WriteJob> jobs;
        jobs.push_back(std::move(job));
        RunJobs(jobs);
      } else {
        job.promotion = true;
        job.pins = index_.Pin(job.batch.keys);
        std::fill(job.batch.blocks.begin(), job.batch.blocks.end(), ConstBlock());
        // Promotion is an optimisation: a full queue drops it rather than delay the caller.
        if (!Enqueue(std::move(job), /*wait=*/false))
          promotions_dropped_.fetch_add(1, std::memory_order_relaxed);
      }
    }
  }
  loads_.fetch_add(1, std::memory_order_relaxed);
  load_latency_.Record(MonotonicNs() - t0);
  return r;
}

size_t Cache::Impl::MakeRoom(TierState& st, size_t need, std::vector<Victim>* victims) {
  const uint64_t cap = st.tier->capacity_blocks();
  const TierMask below_bit = st.index + 1 < kMaxTiers ? TierMask{1} << (st.index + 1) : 0;
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
    Victim v;
    v.key = *victim;
    v.checksum = known ? e.checksum : 0;
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
                          st.index + 1 < static_cast<int>(tiers_.size()) && st.caps.stores_bytes;
  std::vector<BlockKey> keys;
  keys.reserve(victims.size());
  for (const Victim& v : victims) keys.push_back(v.key);
  if (write_back) {
    // One Get for the victims the tier below lacks; they go down as one batch.
    WriteJob job;
    std::vector<BlockKey> gk;
    std::vector<uint32_t> gi;
    for (uint32_t i = 0; i < victims.size(); ++i)
      if (!victims[i].below_has) {
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
        job.batch.Add(v.key, out[j], v.checksum, v.position,
                      (uint64_t{v.position} + 1) * options_.layout.block_tokens, 0);
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
  for (const Victim& v : victims) events->push_back({KvEvent::Type::kRemoved, v.key, st.index});
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
      if (!st.admission.Admit(b.keys[i], b.prefix_tokens[i])) {
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
      const size_t fit = MakeRoom(st, todo.size(), &victims);
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
                      b.sessions[i]);
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
    index_.AddTier(b.keys[i], st.index, b.checksums[i]);
    ++*stored;
    events->push_back({KvEvent::Type::kStored, b.keys[i], st.index});
  }
}

void Cache::Impl::CountFailures(TierState& st, std::span<const Status> results) {
  uint64_t failed = 0;
  // A refusal (admission, no room) is the tier's policy, counted as rejected; not a failure.
  for (const Status& s : results) failed += !s.ok() && s.code() != StatusCode::kResourceExhausted;
  if (failed) st.write_failures.fetch_add(failed, std::memory_order_relaxed);
}

void Cache::Impl::RunJobs(std::vector<WriteJob>& jobs) {
  const uint64_t bb = options_.layout.bytes_per_block();
  // Read what is not staged: one Get per job and source tier.
  for (WriteJob& job : jobs) {
    const size_t n = job.batch.size();
    bool any = false;
    for (int8_t f : job.from) any |= f >= 0;
    if (!any) continue;
    if (!job.staged) job.Stage(n, bb);
    std::vector<bool> keep(n, true);
    for (auto& st : tiers_) {
      std::vector<uint32_t> idx;
      for (uint32_t i = 0; i < n; ++i)
        if (job.from[i] == st->index) idx.push_back(i);
      if (idx.empty()) continue;
      std::vector<BlockKey> gk;
      std::vector<MutableBlock> out;
      for (uint32_t i : idx) {
        gk.push_back(job.batch.keys[i]);
        out.emplace_back(job.Slot(i, bb), bb);
      }
      std::vector<Status> gs(idx.size());
      const Status call = st->tier->Get(gk, out, gs);
      for (size_t j = 0; j < idx.size(); ++j) {
        const uint32_t i = idx[j];
        Status s = call.ok() ? gs[j] : call;
        if (s.ok() && options_.verify_checksums && st->cache_verifies &&
            job.batch.checksums[i] != 0 && Checksum64(out[j]) != job.batch.checksums[i])
          s = Status::Corruption("block failed its checksum");
        if (s.ok()) {
          job.batch.blocks[i] = ConstBlock(job.Slot(i, bb), bb);
          continue;
        }
        keep[i] = false;
        // A promotion's source may have dropped the block since; a pinned copy may not.
        if (!(job.promotion && s.code() == StatusCode::kNotFound))
          tiers_[job.first_target]->write_failures.fetch_add(1, std::memory_order_relaxed);
      }
    }
    BlockBatch kept;
    kept.now_s = job.batch.now_s;
    for (uint32_t i = 0; i < n; ++i)
      if (keep[i])
        kept.Add(job.batch.keys[i], job.batch.blocks[i], job.batch.checksums[i],
                 job.batch.positions[i], job.batch.prefix_tokens[i], job.batch.sessions[i]);
    job.batch = std::move(kept);
  }
  // Jobs with the same targets become one batch: one Put per tier.
  std::vector<bool> taken(jobs.size(), false);
  for (size_t a = 0; a < jobs.size(); ++a) {
    if (taken[a]) continue;
    BlockBatch batch;
    batch.now_s = jobs[a].batch.now_s;
    for (size_t c = a; c < jobs.size(); ++c) {
      if (taken[c] || jobs[c].first_target != jobs[a].first_target ||
          jobs[c].last_target != jobs[a].last_target || jobs[c].victims_of != jobs[a].victims_of)
        continue;
      taken[c] = true;
      batch.Append(jobs[c].batch);
    }
    if (batch.size() == 0) continue;
    for (int t = jobs[a].first_target; t <= jobs[a].last_target; ++t) {
      TierState& st = *tiers_[t];
      std::vector<Status> results(batch.size());
      std::vector<PendingEvent> events;
      std::vector<WriteJob> down;
      uint32_t stored = 0;
      StoreToTier(st, batch, results, &stored, &events, &down);
      CountFailures(st, results);
      if (jobs[a].victims_of >= 0)
        tiers_[jobs[a].victims_of]->writebacks.fetch_add(stored, std::memory_order_relaxed);
      EmitAll(events);
      // Victims of a background write cascade here, in the same thread.
      if (!down.empty()) RunJobs(down);
    }
  }
  // The jobs' pins go with them: the source copies may be evicted again.
  jobs.clear();
}

void Cache::Impl::Dispatch(std::vector<WriteJob> jobs) {
  if (jobs.empty()) return;
  if (!async_ || InWriter()) {
    RunJobs(jobs);
    return;
  }
  for (WriteJob& job : jobs) Enqueue(std::move(job), /*wait=*/true);
}

bool Cache::Impl::Enqueue(WriteJob job, bool wait) {
  const size_t n = job.batch.size();
  const size_t cap = options_.write_queue_blocks;
  {
    MutexLock lock(&writer_mu_);
    // A job larger than the whole queue goes in once the queue is empty.
    auto room = [&]() KVTIER_NO_THREAD_SAFETY_ANALYSIS {
      return queued_blocks_ == 0 || queued_blocks_ + n <= cap;
    };
    if (!room()) {
      if (!wait) return false;
      write_queue_waits_.fetch_add(1, std::memory_order_relaxed);
      WaitLocked(space_cv_, lock, room);
    }
    queued_blocks_ += n;
    ++busy_jobs_;
    queue_.push_back(std::move(job));
  }
  work_cv_.notify_one();
  return true;
}

void Cache::Impl::WriterLoop() {
  // Background priority: woken by a Store on a busy core, the writer took that core and ran
  // its copies before the Store could return (measured: +2..20 ms on a 32-block Store of a
  // loaded 2-core machine). SCHED_BATCH and nice 10 leave the core to the caller; a writer
  // that falls behind is bounded by the queue's backpressure. Failure leaves it as it was.
  sched_param sp{};
  (void)pthread_setschedparam(pthread_self(), SCHED_BATCH, &sp);
  (void)setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), 10);
  for (;;) {
    std::vector<WriteJob> jobs;
    size_t blocks = 0;
    {
      MutexLock lock(&writer_mu_);
      WaitLocked(work_cv_, lock,
                 [this]() KVTIER_NO_THREAD_SAFETY_ANALYSIS { return !queue_.empty() || stop_; });
      if (queue_.empty()) return;  // stopping, and drained
      // Everything queued becomes one batch.
      while (!queue_.empty()) {
        blocks += queue_.front().batch.size();
        jobs.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
    }
    const size_t njobs = jobs.size();
    RunJobs(jobs);
    {
      MutexLock lock(&writer_mu_);
      queued_blocks_ -= blocks;
      busy_jobs_ -= njobs;
    }
    space_cv_.notify_all();
  }
}

void Cache::Impl::Flush() {
  if (!async_) return;
  MutexLock lock(&writer_mu_);
  WaitLocked(space_cv_, lock,
             [this]() KVTIER_NO_THREAD_SAFETY_ANALYSIS { return busy_jobs_ == 0; });
}

Result<StoreResult> Cache::Impl::StoreKeys(std::span<const BlockKey> keys,
                                           std::span<const ConstBlock> blocks, uint32_t first_block,
                                           const RequestOptions& request) {
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

  std::vector<uint8_t> ok_anywhere(n, 0), present(n, 0);
  for (size_t i = 0; i < n; ++i) {
    IndexEntry e;
    present[i] = index_.Get(keys[i], &e) && e.tiers != 0;
  }
  std::vector<Status> results(n), first_failure(n);
  std::vector<PendingEvent> events;
  std::vector<WriteJob> down;
  const bool write_back = options_.write_mode == WriteMode::kWriteBack;
  // Asynchronous write-through: the caller writes up to the first byte-holding tier.
  const int last_sync = write_back ? 0 : (async_ ? top_ : static_cast<int>(tiers_.size()) - 1);
  for (int t = 0; t <= last_sync; ++t) {
    uint32_t stored = 0;
    StoreToTier(*tiers_[t], b, results, &stored, &events, &down);
    for (size_t i = 0; i < n; ++i) {
      if (results[i].ok())
        ok_anywhere[i] = 1;
      else if (first_failure[i].ok())
        first_failure[i] = results[i];
    }
  }
  EmitAll(events);
  Dispatch(std::move(down));

  if (!write_back && last_sync + 1 < static_cast<int>(tiers_.size())) {
    // The rest goes down in the background, from the top tier's copy (pinned there until
    // written) or, for a block the top tier did not take, from a staged copy.
    const int top = last_sync;
    const TierMask top_bit = TierMask{1} << top;
    TierMask lower = 0;
    for (size_t t = top + 1; t < tiers_.size(); ++t) lower |= TierMask{1} << t;
    WriteJob job;
    std::vector<uint32_t> idx;
    for (uint32_t i = 0; i < n; ++i) {
      IndexEntry e;
      if (index_.Get(keys[i], &e) && (e.tiers & lower) == lower) {
        ok_anywhere[i] = 1;  // every lower tier has it already
        continue;
      }
      idx.push_back(i);
      job.batch.Add(keys[i], ConstBlock(), checksums[i], b.positions[i], prefix_tokens,
                    request.session_id);
    }
    if (!idx.empty()) {
      job.pins = index_.Pin(job.batch.keys);
      size_t staged = 0;
      std::vector<int8_t> from(idx.size(), -1);
      for (size_t j = 0; j < idx.size(); ++j) {
        IndexEntry e;
        // Pinned now; a block evicted before the pin is staged from the caller's buffer.
        if (tiers_[top]->caps.stores_bytes && index_.Get(keys[idx[j]], &e) && (e.tiers & top_bit))
          from[j] = static_cast<int8_t>(top);
        else
          ++staged;
      }
      if (staged > 0) {
        job.Stage(idx.size(), block_bytes);
        for (size_t j = 0; j < idx.size(); ++j) {
          if (from[j] >= 0 || blocks[idx[j]].empty()) continue;
          std::memcpy(job.Slot(j, block_bytes), blocks[idx[j]].data(), block_bytes);
          job.batch.blocks[j] = ConstBlock(job.Slot(j, block_bytes), block_bytes);
        }
      }
      job.from = std::move(from);
      job.batch.now_s = b.now_s;
      job.first_target = top + 1;
      job.last_target = static_cast<int>(tiers_.size()) - 1;
      for (uint32_t i : idx) ok_anywhere[i] = 1;  // queued: a failure below shows in stats
      Enqueue(std::move(job), /*wait=*/true);
    }
  }

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
    t.write_failures = st->write_failures.load(std::memory_order_relaxed);
    s.tiers.push_back(std::move(t));
  }
  s.lookups = lookups_.load(std::memory_order_relaxed);
  s.lookup_blocks = lookup_blocks_.load(std::memory_order_relaxed);
  s.hit_blocks = hit_blocks_.load(std::memory_order_relaxed);
  s.loads = loads_.load(std::memory_order_relaxed);
  s.load_failed_blocks = load_failed_blocks_.load(std::memory_order_relaxed);
  s.stores = stores_.load(std::memory_order_relaxed);
  s.stored_blocks = stored_blocks_.load(std::memory_order_relaxed);
  s.write_queue_waits = write_queue_waits_.load(std::memory_order_relaxed);
  s.promotions_dropped = promotions_dropped_.load(std::memory_order_relaxed);
  s.lookup_latency_ns = lookup_latency_.Take();
  s.load_latency_ns = load_latency_.Take();
  s.store_latency_ns = store_latency_.Take();
  return s;
}

size_t Cache::Impl::ReserveHost(size_t n, std::vector<uint32_t>* slots) {
  TierState& st = *tiers_[0];
  auto* host = static_cast<HostTier*>(st.tier.get());
  std::vector<PendingEvent> events;
  std::vector<Victim> victims;
  std::vector<WriteJob> down;
  size_t fit = 0;
  {
    MutexLock lock(&st.mu);
    fit = MakeRoom(st, n, &victims);
    st.reserved += fit;
  }
  EvictOut(st, victims, &events, &down);
  EmitAll(events);
  Dispatch(std::move(down));
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
  const bool lower = options_.write_mode == WriteMode::kWriteThrough && tiers_.size() > 1;
  const uint64_t prefix_tokens =
      (uint64_t{first_block} + keys.size()) * options_.layout.block_tokens;
  BlockBatch b;
  b.now_s = MonotonicSeconds();
  for (size_t j = 0; j < keys.size(); ++j)
    b.Add(keys[j], ConstBlock(host->arena() + host->SlotOffset(slots[j]), host->block_bytes()),
          checksums[j], first_block + static_cast<uint32_t>(j), prefix_tokens, 0);
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
      st.policy->OnInsert(keys[j], AccessHint{0, b.positions[j], b.now_s});
      if (st.tracks_positions) st.positions.Insert(keys[j], b.positions[j]);
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
  if (lower && async_) {
    // In the background, from tier 0's copy, pinned until written.
    WriteJob job;
    job.pins = index_.Pin(keys);
    for (size_t j = 0; j < keys.size(); ++j) {
      IndexEntry e;
      if (!index_.Get(keys[j], &e) || !(e.tiers & 1)) continue;  // evicted before the pin
      job.batch.Add(keys[j], ConstBlock(), checksums[j], b.positions[j], prefix_tokens, 0);
      job.from.push_back(0);
    }
    job.batch.now_s = b.now_s;
    job.first_target = 1;
    job.last_target = static_cast<int>(tiers_.size()) - 1;
    if (job.batch.size() > 0) Enqueue(std::move(job), /*wait=*/true);
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
        st.positions.Erase(*victim);
        gone.push_back(*victim);
      }
      st.reserved += gone.size();  // occupied until erased below
    }
    (void)st.tier->Erase(gone);
    {
      MutexLock lock(&st.mu);
      st.reserved -= gone.size();
    }
    dropped += gone.size();
    std::vector<PendingEvent> events;
    for (const BlockKey& k : gone) events.push_back({KvEvent::Type::kRemoved, k, st.index});
    EmitAll(events);
  }
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
    if (st.caps.managed_by_cache) {
      MutexLock lock(&st.mu);
      for (size_t i = 0; i < found.size(); ++i) {
        const BlockKey& key = found[i].first;
        if (!(found[i].second & (TierMask{1} << st.index))) continue;
        if (!index_.TryRemoveUnpinned(key, st.index)) {
          held[i] = held[i] || index_.IsPinned(key);
          continue;
        }
        st.policy->OnErase(key);
        st.positions.Erase(key);
        gone.push_back(key);
        any[i] = true;
      }
      st.reserved += gone.size();
    } else {
      for (size_t i = 0; i < found.size(); ++i) {
        const BlockKey& key = found[i].first;
        if (!(found[i].second & (TierMask{1} << st.index))) continue;
        if (!index_.RemoveTier(key, st.index)) continue;
        gone.push_back(key);
        any[i] = true;
      }
    }
    if (gone.empty()) continue;
    (void)st.tier->Erase(gone);
    if (st.caps.managed_by_cache) {
      MutexLock lock(&st.mu);
      st.reserved -= gone.size();
    }
    std::vector<PendingEvent> events;
    for (const BlockKey& k : gone) events.push_back({KvEvent::Type::kRemoved, k, st.index});
    EmitAll(events);
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

Result<LoadResult> CacheHooks::LoadIntoHost(Cache& cache, const LookupResult& lookup,
                                            std::span<const MutableBlock> dst) {
  return cache.impl_->Load(lookup, 0, dst, /*promote_now=*/true);
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
  return impl_->Load(lookup, 0, dst);
}

Result<LoadResult> Cache::Load(const LookupResult& lookup, uint32_t first,
                               std::span<const MutableBlock> dst) {
  return impl_->Load(lookup, first, dst);
}

void Cache::Flush() { impl_->Flush(); }

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
