// Cache::Impl, shared by the files of the Cache core: cache.cc (lookup, load, the facade),
// cache_store.cc (the write path: room, eviction, victims), cache_writer.cc (the background
// writer) and cache_hooks.cc (the daemon's hooks). Private to src/cache.
#ifndef KVTIER_CACHE_CACHE_IMPL_H_
#define KVTIER_CACHE_CACHE_IMPL_H_

#include "kvtier/cache.h"

#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <functional>
#include <set>
#include <thread>
#include <type_traits>

#include "cache/cache_hooks.h"
#include "cache/reuse_ghosts.h"
#include "common/clock.h"
#include "common/flat_map.h"
#include "common/log_limiter.h"
#include "common/mutex.h"
#include "events/engine_hashes.h"
#include "events/kv_event_publisher.h"
#include "index/block_index.h"
#include "tiers/disk/io_engine.h"
#include "tiers/host/host_tier.h"

namespace kvtier {

// Lock order. A thread holds at most one TierState::mu at a time, and takes BlockIndex's shard
// locks (inside BlockIndex calls) only under it or under no lock, never the reverse.
// WriteQueue::mu_ is a leaf: never held together with a TierState::mu. No tier call (Put, Get,
// Erase, Exists) and no on_event callback runs under any Cache lock: the write path reserves
// room under TierState::mu, moves bytes without it, then commits under it again.
struct TierState {
  int index = 0;
  std::shared_ptr<Tier> tier;
  TierCapabilities caps;
  bool cache_verifies = false;  // verify_on_load and the tier does not verify reads itself
  // The daemon's shared arena (a HostTier on a memfd), else null: a resident block's slot never
  // moves there, so a pinned block is read in place rather than copied out (cache_writer.cc).
  HostTier* arena_host = nullptr;
  // Write-back with a tier below: victims carry their chain position down.
  bool tracks_positions = false;
  // Which blocks the tier takes (set at open, read without a lock); tiers below the first only.
  AdmissionOptions admission;
  Mutex mu;  // serialises residency changes of this tier: policy, room
  // Null for a self-managed tier (!caps.managed_by_cache).
  std::unique_ptr<EvictionPolicy> policy KVTIER_GUARDED_BY(mu);
  // Slots not in the policy that still count as occupied: blocks given room whose Put is in
  // flight, and blocks taken out of the policy whose Erase is in flight (both outside mu).
  size_t reserved KVTIER_GUARDED_BY(mu) = 0;
  FlatKeyMap<uint32_t> positions KVTIER_GUARDED_BY(mu);  // key -> chain position (write-back)
  std::atomic<uint64_t> hit_blocks{0}, evictions{0}, writebacks{0}, rejected{0}, corruptions{0},
      write_failures{0}, declined{0};
  // Admission's verdicts (rejected = skipped_prefix + skipped_reuse).
  std::atomic<uint64_t> admitted{0}, skipped_prefix{0}, skipped_reuse{0};
};

// Blocks on their way into a tier. blocks[i] may be empty until a background job reads it.
struct BlockBatch {
  std::vector<BlockKey> keys;
  std::vector<ConstBlock> blocks;
  std::vector<uint64_t> checksums;
  std::vector<uint32_t> positions;      // chain position: the policy's hint
  std::vector<uint64_t> prefix_tokens;  // the prefix length admission judges
  std::vector<uint64_t> sessions;
  // Lookup hits known when queued (a victim's, whose index entry may be gone when it is
  // written); admission takes the larger of this and the index's count.
  std::vector<uint16_t> reuse;
  double now_s = 0;

  size_t size() const { return keys.size(); }
  void Add(const BlockKey& key, ConstBlock block, uint64_t checksum, uint32_t position,
           uint64_t prefix, uint64_t session, uint16_t hits = 0) {
    keys.push_back(key);
    blocks.push_back(block);
    checksums.push_back(checksum);
    positions.push_back(position);
    prefix_tokens.push_back(prefix);
    sessions.push_back(session);
    reuse.push_back(hits);
  }
};

// A victim taken out of a tier's policy and index under its lock; erased (and, in write-back,
// read for the tier below) after the lock is dropped.
struct Victim {
  BlockKey key;
  uint64_t change = 0;  // the index's number for its removal (its event's seq); 0: none
  uint64_t checksum = 0;
  uint32_t position = 0;
  uint16_t reuse = 0;
  bool below_has = false;  // the tier below holds it already
};

// Writes for tiers [first_target, last_target], run by the background writer (or by the caller
// once its locks are dropped, when CacheOptions::write_queue_blocks is 0). Block i's bytes are
// in `staged` when from[i] < 0; otherwise they are read from tier from[i], where `pins` keeps
// them resident until the job is done.
struct WriteJob {
  BlockBatch batch;
  std::vector<int8_t> from;
  // size() blocks, page-aligned: the disk tier writes an aligned block without a bounce copy.
  disk::AlignedBuffer staged;
  PinSet pins;
  int first_target = 0;
  int last_target = 0;
  int victims_of = -1;     // write-back: the blocks left this tier; count writebacks there
  bool promotion = false;  // a miss on re-reading the source is not a failure

  // Makes room for n blocks of block_bytes.
  void Stage(size_t n, uint64_t block_bytes) { staged = disk::AlignedBuffer(n * block_bytes); }
  bool IsStaged() const { return staged.data() != nullptr; }
  std::byte* Slot(size_t i, uint64_t block_bytes) { return staged.data() + i * block_bytes; }
};

// The writer: a queue of WriteJobs bounded in blocks, and the thread that hands everything
// queued to `run` as one batch. It knows nothing of tiers or residency: Cache::Impl::RunJobs
// does the lower-tier I/O, for the in-process Cache and the daemon alike (cache_writer.cc).
class WriteQueue {
 public:
  using Run = std::function<void(std::vector<WriteJob>&)>;
  // Starts the thread; every job queued before destruction runs (the destructor drains).
  WriteQueue(size_t cap_blocks, Run run);
  ~WriteQueue();
  WriteQueue(const WriteQueue&) = delete;
  WriteQueue& operator=(const WriteQueue&) = delete;

  // Queues job; when the queue is full, waits for room (wait) or returns false. A job larger
  // than the whole queue goes in once the queue is empty.
  bool Enqueue(WriteJob job, bool wait) KVTIER_EXCLUDES(mu_);
  // Waits until every job queued so far has run.
  void WaitIdle() KVTIER_EXCLUDES(mu_);
  bool InWriter() const { return std::this_thread::get_id() == thread_.get_id(); }
  uint64_t waits() const { return waits_.load(std::memory_order_relaxed); }  // Enqueues that waited

 private:
  void Loop() KVTIER_EXCLUDES(mu_);

  const size_t cap_;
  const Run run_;
  std::atomic<uint64_t> waits_{0};
  Mutex mu_;          // a leaf: never held with a TierState::mu
  CondVar work_cv_;   // a job was queued, or stopping
  CondVar space_cv_;  // the queue shrank, or became idle
  std::deque<WriteJob> queue_ KVTIER_GUARDED_BY(mu_);
  size_t queued_blocks_ KVTIER_GUARDED_BY(mu_) = 0;  // queued or being written
  size_t busy_jobs_ KVTIER_GUARDED_BY(mu_) = 0;      // queued or being written
  bool stop_ KVTIER_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

class Cache::Impl {
 public:
  explicit Impl(CacheOptions options)
      : options_(std::move(options)), engine_hashes_(options_.events.engine_hash_blocks) {
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
      st->arena_host = st->tier->shared_arena();
      st->tracks_positions = options_.write_mode == WriteMode::kWriteBack &&
                             i + 1 < options_.tiers.size() && st->caps.managed_by_cache;
      verify_any_ |= st->cache_verifies;
      {
        MutexLock lock(&st->mu);
        // A self-managed tier (disk, remote) evicts by itself: no per-block policy table.
        std::unique_ptr<EvictionPolicy> policy;
        KVTIER_ASSIGN_OR_RETURN(policy,
                                MakeEvictionPolicy(spec.eviction, st->tier->capacity_blocks()));
        if (st->caps.managed_by_cache) st->policy = std::move(policy);
      }
      st->admission = spec.admission;
      count_reuse_ |= spec.admission.min_reuse > 0;
      if (!st->caps.managed_by_cache) {
        const int t = st->index;
        st->tier->SetRemovalListener([this, t](std::span<const BlockKey> keys) {
          for (const BlockKey& k : keys) {
            if (const uint64_t c = index_.RemoveTier(k, t)) Emit(KvEvent::Type::kRemoved, k, t, c);
          }
        });
      }
      tiers_.push_back(std::move(st));
    }
    // Write-through: queued writes pin their blocks in the first tier until written. A queue
    // longer than half that tier lets a burst fill it with pinned blocks, and the daemon's next
    // reserve finds no room: cut to half, the queue's backpressure comes first (Store waits;
    // the daemon's commit drops the write-through instead, see CommitHost). (Write-back victims
    // leave the tier staged: they pin nothing there.)
    size_t cap = options_.write_queue_blocks;
    if (cap > 0 && options_.write_mode == WriteMode::kWriteThrough && tiers_.size() > 1 &&
        tiers_[0]->caps.managed_by_cache)
      cap = std::min<size_t>(cap, std::max<uint64_t>(1, tiers_[0]->tier->capacity_blocks() / 2));
    if (count_reuse_) {
      // Room to remember as many refused blocks as the admitting tiers hold, 1M at most.
      uint64_t room = 0;
      for (auto& st : tiers_)
        if (st->admission.min_reuse > 0 && st->admission.count_reuse_after_eviction)
          room += st->tier->capacity_blocks();
      if (room > 0)
        ghosts_ = std::make_unique<ReuseGhosts>(std::min<uint64_t>(room, uint64_t{1} << 20));
    }
    async_ = options_.write_queue_blocks > 0;
    if (async_)
      writer_ =
          std::make_unique<WriteQueue>(cap, [this](std::vector<WriteJob>& jobs) { RunJobs(jobs); });
    return Status::Ok();
  }

  ~Impl() {
    // Drain: every queued write finishes before the tiers go.
    writer_.reset();
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

  // change: the index's number for the change (BlockIndex), so seq follows the index's order
  // even when two threads report their changes in the other order.
  void Emit(KvEvent::Type type, const BlockKey& key, int tier, uint64_t change) {
    if (!Listened() || change == 0) return;  // 0: the index did not change
    KvEvent e;
    e.seq = change;
    e.type = type;
    e.key = key;
    e.tier = tier;
    e.engine = engine_hashes_.Get(key);
    Deliver(e);
    // Gone from every tier: its engine hashes go too (a Store racing with this may then be
    // announced with kvtier's key; it is never announced with another block's hashes).
    if (type == KvEvent::Type::kRemoved && e.engine) {
      IndexEntry entry;
      if (!index_.Get(key, &entry) || entry.tiers == 0) engine_hashes_.Erase(key);
    }
  }
  // Keeps hashes[i] for keys[i] for the blocks' events; call before they are recorded.
  // InvalidArgument when there are hashes but not one per key. H is const EngineBlockHashes
  // (copied) or EngineBlockHashes (moved from: the daemon's decoded reserve).
  template <typename H>
  Status KeepEngineHashes(std::span<const BlockKey> keys, std::span<H> hashes) {
    if (hashes.empty()) return Status::Ok();
    if (hashes.size() != keys.size())
      return Status::InvalidArgument("store: " + std::to_string(hashes.size()) +
                                     " engine hash entries for " + std::to_string(keys.size()) +
                                     " blocks");
    if (!Listened()) return Status::Ok();
    for (size_t i = 0; i < keys.size(); ++i) {
      if (hashes[i].hashes.empty()) continue;
      if constexpr (std::is_const_v<H>) {
        engine_hashes_.Put(keys[i], std::make_shared<const EngineBlockHashes>(hashes[i]));
      } else {
        engine_hashes_.Put(keys[i],
                           std::make_shared<const EngineBlockHashes>(std::move(hashes[i])));
      }
    }
    return Status::Ok();
  }
  bool WantsEngineHashes() const { return Listened(); }
  bool Listened() const { return options_.on_event || publisher_; }
  void Deliver(const KvEvent& e) {
    if (publisher_) publisher_->Add(e);
    if (options_.on_event) options_.on_event(e);
  }
  // Events (cache_events.cc): starts the publisher when options_.events asks for one, then
  // indexes and announces what the disk tier recovered.
  Status OpenEvents();
  // After a clear: one kCleared event with every block still resident.
  void EmitCleared();

  // checksums (when set) gets each hit block's checksum from the index, 0 where none.
  Result<LookupResult> LookupKeys(std::span<const BlockKey> keys, const RequestOptions& request,
                                  std::vector<uint64_t>* checksums = nullptr);
  // promote_now: promotion runs in this thread before returning (the daemon's staging,
  // where the host copy is what the client reads), else in the background when async.
  // count: the call counts as a load in the cache's stats (LoadVisit's inner loads do not).
  Result<LoadResult> Load(const LookupResult& lookup, uint32_t first,
                          std::span<const MutableBlock> dst, bool promote_now = false,
                          bool count = true);
  Result<LoadResult> LoadVisit(const LookupResult& lookup, uint32_t first, uint32_t n,
                               std::span<const MutableBlock> scratch,
                               const KvCache::BlockVisitor& visit);
  // InvalidArgument (prefixed by op) unless blocks [first, first + dst.size()) are hits and
  // every buffer is one block long.
  Status CheckLoad(const char* op, const LookupResult& lookup, uint32_t first,
                   std::span<const MutableBlock> dst) const;
  // Layer-wise loads (cache_layerwise.cc).
  Result<std::unique_ptr<LayerwiseLoad>> LoadLayerwise(const LookupResult& lookup, uint32_t first,
                                                       std::span<const MutableBlock> dst);
  // Queues (or runs) the promotion of loaded blocks [0, loaded) that came from below tier 0.
  // keys and source start at block `first` of the lookup.
  void PromoteLoaded(std::span<const BlockKey> keys, std::span<const int8_t> source, uint32_t first,
                     std::span<const MutableBlock> dst, uint32_t loaded, uint64_t hit_tokens,
                     bool promote_now);
  Result<StoreResult> StoreKeys(std::span<const BlockKey> keys, std::span<const ConstBlock> blocks,
                                uint32_t first_block, const RequestOptions& request);
  void NotifySession(uint64_t session_id, SessionEvent event);
  CacheStats Stats() const;
  void WaitForWrites();

  // The daemon's hooks (cache_hooks.h); tier 0 is a shared HostTier.
  // How many of todo (ascending chain positions of b) a managed tier can usefully hold: those
  // at positions below its capacity in blocks.
  static size_t ChainRoom(const TierState& st, const BlockBatch& b,
                          const std::vector<uint32_t>& todo) {
    const uint64_t cap = st.tier->capacity_blocks();
    size_t n = todo.size();
    while (n > 0 && b.positions[todo[n - 1]] >= cap) --n;
    return n;
  }
  size_t ReserveHost(int partition, size_t n, std::vector<uint32_t>* slots);
  void TouchHost(std::span<const BlockKey> keys, std::span<const uint32_t> positions,
                 uint64_t session_id);
  void UnreserveHost(std::span<const uint32_t> slots);
  StoreResult CommitHost(std::span<const BlockKey> keys, std::span<const uint32_t> slots,
                         std::span<const uint64_t> checksums, uint32_t first_block,
                         uint64_t session_id, std::span<EngineBlockHashes> engine);
  uint64_t ClearManaged();
  uint64_t DropMatching(const std::function<bool(const BlockKey&)>& match, uint64_t* pinned);

  // st's verdict on key, offered with the reuse its caller knows (the batch's, the index's).
  // Refused for too little of it, the block is judged again with what ReuseGhosts counted
  // since it was refused and left (asked only then: an admitted block costs no lookup there).
  AdmissionVerdict Judge(const TierState& st, const BlockKey& key, uint32_t reuse,
                         uint64_t prefix_tokens) const;
  // Judges one block offered to st and counts the verdict there (tiers below the first only;
  // the first admits everything uncounted).
  bool Admit(TierState& st, const BlockKey& key, uint32_t reuse, uint64_t prefix_tokens);
  // Counts verdict v on key at st; a block refused for too little reuse is remembered
  // (ReuseGhosts). Whether it was admitted.
  bool CountVerdict(TierState& st, const BlockKey& key, AdmissionVerdict v);
  // Whether some tier in [first, last] that lacks the block (has: the tiers holding it) would
  // admit it now. When none would, each of them counts its refusal here: the block is not
  // queued. Otherwise each tier judges, and counts, it when the writer offers it.
  bool WantedBelow(const BlockKey& key, int first, int last, TierMask has, uint32_t reuse,
                   uint64_t prefix_tokens);
  // Write-through's second chance: hit blocks [0, reuse.size()) of a lookup that tier 0 holds
  // and a tier below lacks, whose reuse has reached that tier's min_reuse, are queued for it
  // from tier 0 (never waiting: a full queue drops them, counted as write_through_dropped).
  void QueueReused(std::span<const BlockKey> keys, std::span<const TierMask> masks,
                   std::span<const uint16_t> reuse, uint64_t prefix_tokens, uint64_t session_id);

  // Drops key from st (a corrupt or missing block), keeping the index honest.
  void DropBlock(TierState& st, const BlockKey& key);

  const CacheOptions options_;
  BlockKey default_root_;
  // Some tier's admission has min_reuse: lookups count each hit block's reuse in the index.
  bool count_reuse_ = false;
  // Blocks refused below, remembered after they leave: null unless some tier's admission has
  // min_reuse and count_reuse_after_eviction.
  std::unique_ptr<ReuseGhosts> ghosts_;
  BlockIndex index_;
  std::vector<std::unique_ptr<TierState>> tiers_;
  bool verify_any_ = false;
  // Outlives the writer (joined in ~Impl before members go), whose writes it announces.
  std::unique_ptr<events::KvEventPublisher> publisher_;
  events::EngineHashTable engine_hashes_;

 private:
  struct PendingEvent {
    KvEvent::Type type;
    BlockKey key;
    int tier;
    uint64_t change;
  };

  // StoreKeys' steps. InvalidArgument unless keys and blocks pair up, each a block long.
  Status CheckStore(std::span<const BlockKey> keys, std::span<const ConstBlock> blocks) const;
  // The blocks as one batch: checksums (when a tier needs the Cache's), chain positions, the
  // prefix length admission judges, the request's session.
  BlockBatch StoreBatch(std::span<const BlockKey> keys, std::span<const ConstBlock> blocks,
                        uint32_t first_block, const RequestOptions& request) const;
  // Writes b into tiers [0, last_sync] in the caller's thread: marks the blocks some tier took
  // in *ok_anywhere and keeps each other block's first failure; then emits the events and
  // dispatches the write-back jobs that came out of it.
  void StoreInCaller(const BlockBatch& b, int last_sync, std::vector<uint8_t>* ok_anywhere,
                     std::vector<Status>* first_failure);
  // Queues b's blocks that some tier below `top` lacks for the background writer, read from
  // tier top (pinned until written) or staged from b's buffers; marks them in *ok_anywhere.
  void QueueBelow(const BlockBatch& b, int top, std::vector<uint8_t>* ok_anywhere);
  // Writes b's blocks into tier st under its policy. Fills per-block results (OK when resident
  // after the call, whether copied or already there) and counts copies in *stored. Write-back
  // victims of st, and blocks that did not fit in it, come back in *down for the tier below.
  // Takes st.mu itself; the caller holds no Cache lock.
  void StoreToTier(TierState& st, const BlockBatch& b, std::span<Status> results, uint32_t* stored,
                   std::vector<PendingEvent>* events, std::vector<WriteJob>* down)
      KVTIER_EXCLUDES(st.mu);
  // Takes victims out of a cache-managed tier's policy and index until `need` more blocks fit
  // (they count in st.reserved until EvictOut erases them); returns how many fit.
  // Evicts by st's policy until `need` more blocks fit and at least min_victims were taken,
  // only blocks for which allow(key) holds (all when null). Returns how many of need fit.
  size_t MakeRoom(TierState& st, size_t need, std::vector<Victim>* victims,
                  const std::function<bool(const BlockKey&)>* allow = nullptr,
                  size_t min_victims = 0) KVTIER_REQUIRES(st.mu);
  // Erases victims from st outside st.mu, after reading those the tier below lacks into one
  // write-back job (*down). The reservation that made room for them covers their slots.
  void EvictOut(TierState& st, const std::vector<Victim>& victims,
                std::vector<PendingEvent>* events, std::vector<WriteJob>* down)
      KVTIER_EXCLUDES(st.mu);
  // Puts b.keys[todo[j]]; returns each one's status (the call's, when the whole call failed).
  std::vector<Status> PutTodo(TierState& st, const BlockBatch& b,
                              const std::vector<uint32_t>& todo);
  // Copies the Put statuses into results and records the stored blocks in the index and the
  // events (last to first).
  void Record(TierState& st, const BlockBatch& b, const std::vector<uint32_t>& todo,
              std::span<const Status> put, std::span<Status> results, uint32_t* stored,
              std::vector<PendingEvent>* events);
  void EmitRemoved(const TierState& st, std::span<const BlockKey> keys,
                   std::span<const uint64_t> changes) {
    for (size_t i = 0; i < keys.size(); ++i)  // 0: it was not resident there, nothing changed
      if (changes[i]) Emit(KvEvent::Type::kRemoved, keys[i], st.index, changes[i]);
  }
  void EmitAll(const std::vector<PendingEvent>& events) {
    for (const PendingEvent& e : events) Emit(e.type, e.key, e.tier, e.change);
  }
  // Queues jobs for the writer (waiting while the queue is full), or runs them here when
  // writes are synchronous or this is the writer's own thread.
  void Dispatch(std::vector<WriteJob> jobs);
  // Queues a job. wait=false: gives up (false) instead of waiting for room.
  bool Enqueue(WriteJob job, bool wait) { return writer_->Enqueue(std::move(job), wait); }
  // Runs jobs: reads what is not staged, then one Put per target tier for all jobs that share
  // their targets.
  void RunJobs(std::vector<WriteJob>& jobs);
  bool InWriter() const { return writer_ && writer_->InWriter(); }
  // Counts failures of a background write in the target tier's stats (never lost silently).
  void CountFailures(TierState& st, std::span<const Status> results);

  bool async_ = false;  // writer_ exists (write_queue_blocks > 0)
  std::unique_ptr<WriteQueue> writer_;

 public:
  std::atomic<uint64_t> lookups_{0}, lookup_blocks_{0}, hit_blocks_{0}, loads_{0},
      load_failed_blocks_{0}, stores_{0}, stored_blocks_{0}, promotions_dropped_{0},
      write_through_dropped_{0};
  LogLimiter write_through_log_;
  Histogram lookup_latency_, load_latency_, store_latency_;
};

}  // namespace kvtier

#endif  // KVTIER_CACHE_CACHE_IMPL_H_
