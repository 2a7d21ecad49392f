// The internals of ReplayTimed (sim/timed_replay.h): the simulated tiers, devices and sessions,
// and TimedReplay, the discrete-event run over them. Internal to sim/.
//
// Thread-safety: one TimedReplay per run, used by one thread.
#ifndef KVTIER_SIM_TIMED_REPLAY_IMPL_H_
#define KVTIER_SIM_TIMED_REPLAY_IMPL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <queue>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "sim/cache_compare.h"
#include "sim/cache_replay.h"
#include "sim/cost_model.h"
#include "sim/flat_lru.h"
#include "sim/timed_replay.h"

namespace kvtier::sim::timed {

// One tier of block sizes with its own policy.
class SimTier {
 public:
  SimTier(std::string name, uint64_t capacity_blocks, std::unique_ptr<EvictionPolicy> policy)
      : name_(std::move(name)),
        capacity_(capacity_blocks),
        policy_(std::move(policy)),
        present_(std::min<uint64_t>(capacity_blocks + 1, 1 << 20)) {}

  bool Contains(const BlockKey& k) const { return present_.Contains(k); }
  void Touch(const BlockKey& k, const AccessHint& h) { policy_->OnAccess(k, h); }
  // Inserts (or touches) k; appends what had to leave to *evicted.
  void Put(const BlockKey& k, const AccessHint& h, std::vector<BlockKey>* evicted) {
    if (Contains(k)) {
      policy_->OnAccess(k, h);
      return;
    }
    present_.Insert(k, 1);
    policy_->OnInsert(k, h);
    while (present_.size() > capacity_) {
      auto v = policy_->PickVictim(kAny);
      if (!v) break;
      present_.Erase(*v);
      evicted->push_back(*v);
    }
    peak_ = std::max(peak_, present_.size());
  }
  void Event(uint64_t session, SessionEvent e, double now) {
    policy_->OnSessionEvent(session, e, now);
  }
  uint64_t size() const { return present_.size(); }
  uint64_t capacity() const { return capacity_; }
  uint64_t peak() const { return peak_; }
  const std::string& name() const { return name_; }

 private:
  static inline const std::function<bool(const BlockKey&)> kAny = [](const BlockKey&) {
    return true;
  };
  std::string name_;
  uint64_t capacity_;
  std::unique_ptr<EvictionPolicy> policy_;
  ReplayMap<uint8_t> present_;
  uint64_t peak_ = 0;
};

// A resource used one transfer at a time (a link, a device).
struct Channel {
  double free_at = 0;
  double Use(double now, double seconds) {
    free_at = std::max(free_at, now) + seconds;
    return free_at;
  }
};

struct Replica {
  std::vector<std::unique_ptr<SimTier>> ranks;  // HBM, one pool per data-parallel rank
  std::unique_ptr<SimTier> host, disk;
  Channel link;  // GPU <-> host, shared by loads and stores
  Channel disk_io;
  Channel nic;  // to the remote tier
  double gpu_free = 0;
  uint64_t decoding_tokens = 0;  // context of the running decodes
  std::deque<uint32_t> waiting;  // prefilled requests whose KV does not fit next to the batch
};

enum class EvType : uint8_t { kArrive, kPrefillDone, kDecodeDone, kStartSession };
struct Event {
  double t;
  uint64_t seq;
  EvType type;
  uint32_t id;  // run index (kArrive, kStartSession) or request slot
  bool operator>(const Event& o) const { return t != o.t ? t > o.t : seq > o.seq; }
};

struct Run {  // one live session
  uint32_t trace, session, tree, replica;
  uint32_t next = 0;
  uint64_t sim_id;  // unique session id for policies and the hasher
  BlockKey root;
  double started_s = 0;
  double skip_s = 0;  // AgentX rules: recorded time skipped before the first replayed request
  uint32_t rank = 0;  // data-parallel rank under session affinity
};

struct InFlight {
  uint32_t run;
  uint32_t rank = 0;
  bool measured = true;  // arrived inside the measuring window
  double arrive_s;
  double first_token_s = 0;
  uint64_t context_tokens = 0;
  uint32_t output_tokens = 0;
  std::vector<BlockKey> keys;
};

inline uint64_t Mix(uint64_t x) {  // splitmix64: a well-spread hash of a session id
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Percentiles of values weighted by counts (each value stands for `weight` samples).
Percentiles WeightedPercentiles(std::vector<std::pair<double, double>> v);

// One timed replay: the hardware, the tiers, the live sessions and the event queue. Simulate pops
// events in time order and hands each to its method (OnStartSession, OnArrive, OnPrefillDone,
// OnDecodeDone); Summarize turns what they recorded into the result.
class TimedReplay {
 public:
  TimedReplay(std::span<const workload::Trace> traces, const GpuProfile& gpu,
              const ModelProfile& model, const TimedOptions& o)
      : traces_(traces), gpu_(gpu), model_(model), o_(o) {}

  Result<TimedResult> Simulate();

 private:
  // Setup, in this order: the cost model and HBM (InvalidArgument when nothing fits), the tiers,
  // the sub-agent offsets.
  Status Configure();
  Status BuildTiers();
  void LinkSessions();

  // The events.
  void OnStartSession(uint32_t run_id);
  void OnArrive(uint32_t run_id);
  void OnPrefillDone(uint32_t slot);
  void OnDecodeDone(uint32_t slot);

  // OnArrive's steps: the request's keys (the ideal cache learns them), where the blocks after
  // the HBM prefix can be loaded from, the loads' completion time, the token accounting, and the
  // prefill's slot and occupancy sample.
  std::span<const BlockKey> RequestKeys(const Run& run, const workload::TraceRequest& q,
                                        bool measured);
  std::vector<uint8_t> LoadSources(const Replica& rep, std::span<const BlockKey> keys,
                                   size_t hbm_prefix) const;
  double ScheduleLoads(Replica& rep, const std::vector<uint8_t>& src, size_t head, size_t load,
                       bool measured);
  void CountTokens(const workload::TraceRequest& q, const std::vector<uint8_t>& src,
                   size_t hbm_prefix, size_t head, size_t load);
  uint32_t TakeSlot();
  void SampleOccupancy(const Replica& rep);

  void Push(double t, EvType type, uint32_t id) { events_.push(Event{t, seq_++, type, id}); }
  bool BudgetLeft() const { return o_.max_requests == 0 || issued_ < o_.max_requests; }
  bool WantMoreTrees() const;
  void StartSession(uint32_t trace, uint32_t session, uint32_t tree, uint32_t replica,
                    BlockKey root, double at);
  void StartTree(double at);
  // Live session trees, integrated over the measuring window.
  void LiveChange(double t, int delta);
  // Every tier's policy hears a session's events (the session-aware one orders eviction by them).
  void NotifySession(Replica& rep, uint64_t session, SessionEvent e, double t);
  // Moves blocks evicted from one tier down to the next, recording bytes on the way.
  void Demote(Replica& rep, const std::vector<BlockKey>& from_hbm, uint64_t session);
  // Decode: every step reads the weights and the running batch's KV; TPOT is fixed at start.
  void StartDecode(Replica& rep, uint32_t slot);

  // The result's figures from what the events recorded.
  void Summarize();
  void SummarizeTiers();
  void SummarizeOccupancy();
  bool TierShown(int t) const {
    return t == 0 || (t == 1 && o_.host.enabled) || (t == 2 && o_.disk.enabled) ||
           (t == 3 && remote_);
  }

  const std::span<const workload::Trace> traces_;
  const GpuProfile& gpu_;
  const ModelProfile& model_;
  const TimedOptions& o_;
  TimedResult res_;

  // Set by Configure.
  uint32_t block_tokens_ = 0;
  double window_start_ = 0, window_end_ = INFINITY;  // the measuring window
  uint32_t tp_ = 0;
  // The one cost model: the library's planner prices every load and prefill below.
  std::optional<Planner> planner_;
  const CostProfile* cp_ = nullptr;
  // Planner tier index of each source code (1 host, 2 disk, 3 remote); -1 when disabled.
  int tier_of_[4] = {-1, -1, -1, -1};
  uint64_t kv_per_token_ = 0;
  double accept_ = 0;
  uint64_t hbm_blocks_ = 0;
  uint64_t host_bytes_ = 0;
  double hbm_bw_ = 0;
  // The host link's raw bandwidth: what SSD and remote loads also cross on their way to HBM.
  double link_bw_ = 0;
  double bb_ = 0;

  std::vector<Replica> reps_;
  std::unique_ptr<SimTier> remote_;
  TierTraffic traffic_[4] = {{"hbm"}, {"host"}, {"disk"}, {"remote"}};
  // Children of each session: (child index, offset after the parent's start).
  std::vector<std::vector<std::vector<std::pair<uint32_t, double>>>> children_;

  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events_;
  uint64_t seq_ = 0;
  std::vector<Run> runs_;
  std::vector<uint32_t> tree_live_;  // live sessions per tree
  std::vector<InFlight> slots_;
  std::vector<uint32_t> free_slots_;
  ChainHasher hasher_;
  ReplayMap<uint8_t> ideal_{1 << 16};
  uint64_t ideal_hits_ = 0;
  uint64_t issued_ = 0;
  uint64_t trees_started_ = 0;
  uint64_t trees_one_pass_ = 0;
  std::vector<double> ttft_, tpot_, e2e_;
  std::vector<std::pair<double, double>> itl_;  // (seconds per token, tokens after the first)
  uint64_t rr_rank_ = 0;                        // round-robin DP routing
  uint64_t live_trees_ = 0;
  double live_area_ = 0, live_since_ = 0;
  std::vector<std::pair<double, std::vector<double>>> occupancy_;
  double now_ = 0;
  std::vector<BlockKey> evicted_, evicted2_, evicted3_;
};

}  // namespace kvtier::sim::timed

#endif  // KVTIER_SIM_TIMED_REPLAY_IMPL_H_
