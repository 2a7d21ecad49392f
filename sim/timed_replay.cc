#include "sim/timed_replay.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <memory>
#include <queue>

#include "sim/cache_compare.h"
#include "sim/cache_replay.h"
#include "sim/cost_model.h"
#include "sim/flat_lru.h"

namespace kvtier::sim {
namespace {

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

uint64_t Mix(uint64_t x) {  // splitmix64: a well-spread hash of a session id
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Percentiles of values weighted by counts (each value stands for `weight` samples).
Percentiles WeightedPercentiles(std::vector<std::pair<double, double>> v) {
  Percentiles p;
  double total = 0, sum = 0;
  for (auto [x, w] : v) {
    total += w;
    sum += x * w;
  }
  if (total <= 0) return p;
  std::sort(v.begin(), v.end());
  p.mean = sum / total;
  auto at = [&](double q) {
    double seen = 0;
    for (auto [x, w] : v) {
      seen += w;
      if (seen >= q * total) return x;
    }
    return v.back().first;
  };
  p.p50 = at(0.50);
  p.p75 = at(0.75);
  p.p90 = at(0.90);
  p.p95 = at(0.95);
  p.p99 = at(0.99);
  return p;
}

}  // namespace

Status TimedOptions::Validate() const {
  if (concurrency == 0) return Status::InvalidArgument("concurrency must be >= 1");
  if (replicas == 0) return Status::InvalidArgument("replicas must be >= 1");
  if (!(hbm_kv_fraction > 0 && hbm_kv_fraction <= 1)) {
    return Status::InvalidArgument("hbm_kv_fraction must be in (0, 1]");
  }
  for (const TierSpec* t : {&host, &disk, &remote}) {
    if (t->bandwidth_gbps < 0 || t->latency_s < 0) {
      return Status::InvalidArgument("tier bandwidth and latency must be >= 0");
    }
  }
  if ((disk.enabled && disk.capacity_bytes == 0) ||
      (remote.enabled && remote.capacity_bytes == 0)) {
    return Status::InvalidArgument("disk and remote tiers need a size");
  }
  if (disk.enabled && disk.bandwidth_gbps <= 0)
    return Status::InvalidArgument("disk needs a bandwidth");
  if (remote.enabled && remote.bandwidth_gbps <= 0) {
    return Status::InvalidArgument("remote needs a bandwidth");
  }
  if (!(mfu >= 0 && mfu <= 1)) return Status::InvalidArgument("mfu must be in [0, 1]");
  if (dp == 0) return Status::InvalidArgument("dp must be >= 1");
  if (!(spec_acceptance_length == 0 || spec_acceptance_length >= 1)) {
    return Status::InvalidArgument("spec acceptance length must be >= 1 (0 = the model's)");
  }
  if (warmup_s < 0 || window_s < 0 || max_idle_s < 0) {
    return Status::InvalidArgument("warmup, window and idle cap must be >= 0");
  }
  return Status::Ok();
}

Percentiles ComputePercentiles(std::vector<double> v) {
  Percentiles p;
  if (v.empty()) return p;
  std::sort(v.begin(), v.end());
  double sum = 0;
  for (double x : v) sum += x;
  p.mean = sum / static_cast<double>(v.size());
  auto at = [&](double q) {
    const double pos = q * static_cast<double>(v.size() - 1);
    const size_t lo = static_cast<size_t>(std::floor(pos));
    const size_t hi = std::min(lo + 1, v.size() - 1);
    return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
  };
  p.p50 = at(0.50);
  p.p75 = at(0.75);
  p.p90 = at(0.90);
  p.p95 = at(0.95);
  p.p99 = at(0.99);
  return p;
}

Result<TimedResult> ReplayTimed(std::span<const workload::Trace> traces, const GpuProfile& gpu,
                                const ModelProfile& model, const TimedOptions& o) {
  KVTIER_RETURN_IF_ERROR(o.Validate());
  KVTIER_RETURN_IF_ERROR(gpu.Validate());
  KVTIER_RETURN_IF_ERROR(model.Validate());
  if (traces.empty()) return Status::InvalidArgument("no traces to replay");
  const double wall_start =
      std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  const uint32_t block_tokens = traces[0].block_tokens;
  for (const auto& t : traces) {
    if (t.block_tokens != block_tokens) {
      return Status::InvalidArgument("timed replay needs one block size; " + t.path + " has " +
                                     std::to_string(t.block_tokens) + ", " + traces[0].path +
                                     " has " + std::to_string(block_tokens));
    }
  }
  TimedResult res;
  res.gpu = gpu.name;
  res.model = model.name;
  res.policy = o.policy;
  res.concurrency = o.concurrency;
  res.replicas = o.replicas;
  res.dp = o.dp;
  res.dp_round_robin = o.dp_round_robin;
  res.agentx_rules = o.agentx_rules;
  // The measuring window: everything, or [warmup, warmup + window) when a window is set.
  const double window_start = o.window_s > 0 ? o.warmup_s : 0;
  const double window_end = o.window_s > 0 ? o.warmup_s + o.window_s : INFINITY;
  const double hbm_bytes = gpu.hbm_gb * 1e9;
  uint32_t tp = o.tp;
  if (tp == 0) tp = DefaultTp(gpu, model);
  res.tp = tp;
  CostModelOptions cm;
  cm.tp = tp;
  cm.block_tokens = block_tokens;
  cm.mfu = o.mfu;
  cm.kv_dtype = o.kv_dtype;
  cm.host = o.host.enabled;
  cm.host_gbps = o.host.bandwidth_gbps > 0 ? o.host.bandwidth_gbps * tp : 0;
  cm.host_latency_s = o.host.latency_s > 0 ? o.host.latency_s : -1;
  cm.disk = o.disk.enabled;
  cm.disk_gbps = o.disk.bandwidth_gbps;
  cm.disk_latency_s = o.disk.latency_s;
  cm.remote = o.remote.enabled;
  cm.remote_gbps = o.remote.bandwidth_gbps;
  cm.remote_latency_s = o.remote.latency_s;
  KVTIER_ASSIGN_OR_RETURN(CostProfile cost, MakeCostProfile(gpu, model, cm));
  // The one cost model: the library's planner prices every load and prefill below.
  const Planner planner(std::move(cost));
  const CostProfile& cp = planner.profile();
  const PrefillCost& pc = cp.prefill;
  // Planner tier index of each source code (1 host, 2 disk, 3 remote); -1 when disabled.
  const int tier_of[4] = {-1, cp.FindTier("host"), cp.FindTier("disk"), cp.FindTier("remote")};
  const uint64_t kv_per_token = model.KvBytesPerToken(o.kv_dtype);
  const double accept =
      o.spec_acceptance_length > 0 ? o.spec_acceptance_length : model.spec_acceptance_length;
  res.block_bytes = cp.block_bytes;
  const double kv_bytes = o.hbm_kv_bytes > 0
                              ? static_cast<double>(o.hbm_kv_bytes)
                              : o.hbm_kv_fraction * tp * hbm_bytes - model.weight_bytes();
  if (kv_bytes < static_cast<double>(res.block_bytes)) {
    return Status::InvalidArgument(model.name + " leaves no HBM for KV on " + std::to_string(tp) +
                                   " x " + gpu.name + "; raise --tp");
  }
  res.hbm_kv_bytes = static_cast<uint64_t>(kv_bytes);
  const uint64_t hbm_blocks = res.hbm_kv_bytes / res.block_bytes;
  if (hbm_blocks < o.dp) return Status::InvalidArgument("--dp leaves a rank without an HBM block");
  res.capacity_tokens = hbm_blocks * block_tokens;
  const uint64_t host_bytes =
      o.host_pool_multiple > 0    ? static_cast<uint64_t>(o.host_pool_multiple * res.hbm_kv_bytes)
      : o.host.capacity_bytes > 0 ? o.host.capacity_bytes
                                  : std::min<uint64_t>(4 * res.hbm_kv_bytes, 3'000'000'000'000ull);
  const double hbm_bw = gpu.hbm_tbps * 1e12 * gpu.hbm_efficiency * tp;
  // The host link's raw bandwidth: what SSD and remote loads also cross on their way to HBM.
  const double link_bw =
      (o.host.bandwidth_gbps > 0 ? o.host.bandwidth_gbps * tp : gpu.host_link_gbps * tp) * 1e9;
  const double bb = static_cast<double>(res.block_bytes);

  auto make_policy = [&](uint64_t blocks) -> Result<std::unique_ptr<EvictionPolicy>> {
    const std::string name = o.policy == "lru-tail" || o.policy == "lru" ? "lru" : o.policy;
    return MakeEvictionPolicy(name, blocks);
  };
  std::vector<Replica> reps(o.replicas);
  for (auto& r : reps) {
    for (uint32_t k = 0; k < o.dp; ++k) {
      KVTIER_ASSIGN_OR_RETURN(auto p, make_policy(hbm_blocks / o.dp));
      r.ranks.push_back(std::make_unique<SimTier>("hbm", hbm_blocks / o.dp, std::move(p)));
    }
    if (o.host.enabled) {
      KVTIER_ASSIGN_OR_RETURN(auto hp, make_policy(host_bytes / res.block_bytes));
      r.host = std::make_unique<SimTier>("host", host_bytes / res.block_bytes, std::move(hp));
    }
    if (o.disk.enabled) {
      KVTIER_ASSIGN_OR_RETURN(auto dp, make_policy(o.disk.capacity_bytes / res.block_bytes));
      r.disk =
          std::make_unique<SimTier>("disk", o.disk.capacity_bytes / res.block_bytes, std::move(dp));
    }
  }
  std::unique_ptr<SimTier> remote;
  if (o.remote.enabled) {
    KVTIER_ASSIGN_OR_RETURN(auto rp, make_policy(o.remote.capacity_bytes / res.block_bytes));
    remote = std::make_unique<SimTier>("remote", o.remote.capacity_bytes / res.block_bytes,
                                       std::move(rp));
  }
  res.offload = o.host.enabled || o.disk.enabled || o.remote.enabled;
  TierTraffic traffic[4] = {{"hbm"}, {"host"}, {"disk"}, {"remote"}};

  // Children of each session: (child index, offset after the parent's start).
  std::vector<std::vector<std::vector<std::pair<uint32_t, double>>>> children(traces.size());
  for (uint32_t t = 0; t < traces.size(); ++t) {
    children[t].resize(traces[t].sessions.size());
    for (uint32_t s = 0; s < traces[t].sessions.size(); ++s) {
      const auto& ss = traces[t].sessions[s];
      if (ss.parent >= 0) {
        const auto& parent = traces[t].sessions[ss.parent];
        const double parent_start =
            parent.requests.empty() ? parent.start_s : parent.requests[0].start_s;
        const double child_start = ss.requests.empty() ? ss.start_s : ss.requests[0].start_s;
        children[t][ss.parent].emplace_back(s, std::max(0.0, child_start - parent_start));
      }
    }
  }

  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events;
  uint64_t seq = 0;
  auto push = [&](double t, EvType type, uint32_t id) { events.push(Event{t, seq++, type, id}); };
  std::vector<Run> runs;
  std::vector<uint32_t> tree_live;  // live sessions per tree
  std::vector<InFlight> slots;
  std::vector<uint32_t> free_slots;
  ChainHasher hasher;
  ReplayMap<uint8_t> ideal(1 << 16);
  uint64_t ideal_hits = 0;
  uint64_t issued = 0;
  uint64_t trees_started = 0;
  const uint64_t trees_one_pass = std::max<uint64_t>(traces.size(), o.concurrency);
  std::vector<double> ttft, tpot, e2e;
  std::vector<std::pair<double, double>> itl;  // (seconds per token, tokens after the first)
  uint64_t rr_rank = 0;                        // round-robin DP routing
  // Live session trees, integrated over the measuring window.
  uint64_t live_trees = 0;
  double live_area = 0, live_since = 0;
  auto live_change = [&](double t, int delta) {
    const double a = std::max(live_since, window_start), b = std::min(t, window_end);
    if (b > a) live_area += static_cast<double>(live_trees) * (b - a);
    live_since = t;
    live_trees = static_cast<uint64_t>(static_cast<int64_t>(live_trees) + delta);
  };
  std::vector<std::pair<double, std::vector<double>>> occupancy;
  double now = 0;

  auto budget_left = [&] { return o.max_requests == 0 || issued < o.max_requests; };
  auto start_session = [&](uint32_t trace, uint32_t session, uint32_t tree, uint32_t replica,
                           BlockKey root, double at) {
    Run r{trace, session, tree, replica, 0, runs.size() + 1, root, at};
    r.rank = static_cast<uint32_t>(Mix(r.sim_id ^ (o.seed << 32)) % o.dp);
    const auto& reqs = traces[trace].sessions[session].requests;
    if (o.agentx_rules && traces[trace].sessions[session].parent < 0 && reqs.size() > 1) {
      // Start at a seeded point 25-75% through the recorded session; its prefix is warmed.
      const double u = 0.25 + 0.5 * static_cast<double>(Mix(o.seed * 1000003 + tree) >> 11) /
                                  static_cast<double>(1ull << 53);
      const double t0 = reqs.front().start_s, point = t0 + u * (reqs.back().start_s - t0);
      while (r.next + 1 < reqs.size() && reqs[r.next].start_s < point) ++r.next;
      r.skip_s = reqs[r.next].start_s - t0;
    }
    runs.push_back(r);
    ++tree_live[tree];
    push(at, EvType::kStartSession, static_cast<uint32_t>(runs.size() - 1));
  };
  auto start_tree = [&](double at) {
    const uint32_t trace = static_cast<uint32_t>(trees_started % traces.size());
    const uint64_t copy = trees_started / traces.size();
    const uint32_t tree = static_cast<uint32_t>(tree_live.size());
    tree_live.push_back(0);
    live_change(at, +1);
    // Each copy of a trace is another user's session: its own namespace.
    const BlockKey root = copy == 0
                              ? traces[trace].root
                              : ChainKeyFromId(traces[trace].root, 0x5eed000000000000ull | copy);
    ++trees_started;
    for (uint32_t s = 0; s < traces[trace].sessions.size(); ++s) {
      if (traces[trace].sessions[s].parent < 0) {
        start_session(trace, s, tree, tree % o.replicas, root, at);
      }
    }
  };
  auto want_more_trees = [&] {
    if (o.window_s > 0) return now < window_end && budget_left();  // keep C trees live
    return o.max_requests > 0 ? budget_left() : trees_started < trees_one_pass;
  };
  for (uint32_t i = 0; i < o.concurrency && want_more_trees(); ++i) start_tree(0);

  // Moves blocks evicted from one tier down to the next, recording bytes on the way.
  std::vector<BlockKey> evicted, evicted2, evicted3;
  // Every tier's policy hears a session's events (the session-aware one orders eviction by them).
  auto session_event = [&](Replica& rep, uint64_t session, SessionEvent e, double t) {
    for (auto& rank : rep.ranks) rank->Event(session, e, t);
    for (SimTier* tier : {rep.host.get(), rep.disk.get(), remote.get()}) {
      if (tier != nullptr) tier->Event(session, e, t);
    }
  };
  auto demote = [&](Replica& rep, const std::vector<BlockKey>& from_hbm, uint64_t session) {
    if (!rep.host) return;
    AccessHint h{session, 0, now};
    evicted2.clear();
    uint64_t stored = 0;
    for (const auto& k : from_hbm) {
      if (!rep.host->Contains(k)) ++stored;
      rep.host->Put(k, h, &evicted2);
    }
    if (stored) {
      rep.link.Use(now, planner.LoadSeconds(tier_of[1], stored));
      traffic[1].store_bytes += stored * res.block_bytes;
    }
    if (!rep.disk || evicted2.empty()) return;
    evicted3.clear();
    uint64_t to_disk = 0;
    for (const auto& k : evicted2) {
      if (!rep.disk->Contains(k)) ++to_disk;
      rep.disk->Put(k, h, &evicted3);
    }
    if (to_disk) {
      rep.disk_io.Use(now, planner.LoadSeconds(tier_of[2], to_disk));
      traffic[2].store_bytes += to_disk * res.block_bytes;
    }
  };

  // Decode: every step reads the weights and the running batch's KV; TPOT is fixed at start.
  auto start_decode = [&](Replica& rep, uint32_t slot) {
    InFlight& f = slots[slot];
    rep.decoding_tokens += f.context_tokens;
    const double step =
        (model.weight_bytes() + static_cast<double>(rep.decoding_tokens) * kv_per_token) / hbm_bw;
    // Speculative decoding: `accept` tokens per step on average.
    const double per_token = step / accept;
    if (f.measured) {
      tpot.push_back(per_token);
      if (f.output_tokens > 1) itl.emplace_back(per_token, f.output_tokens - 1);
    }
    push(now + per_token * std::max<uint32_t>(1, f.output_tokens), EvType::kDecodeDone, slot);
  };

  while (!events.empty()) {
    const Event ev = events.top();
    events.pop();
    now = ev.t;
    if (ev.type == EvType::kStartSession) {
      runs[ev.id].started_s = now;
      const Run run = runs[ev.id];  // a copy: start_session grows runs
      for (const auto& [child, offset] : children[run.trace][run.session]) {
        if (offset < run.skip_s) continue;  // it ran in the skipped part
        start_session(run.trace, child, run.tree, run.replica, run.root, now + offset - run.skip_s);
      }
      if (run.next > 0) {
        // AgentX rules: the skipped part's context is in HBM (and what spills, below) before
        // the first replayed request; nothing of it is measured.
        const auto& prev = traces[run.trace].sessions[run.session].requests[run.next - 1];
        workload::ReplayRequest wr;
        wr.session = run.sim_id;
        wr.root = run.root;
        wr.ids = traces[run.trace].IdsOf(prev);
        wr.block_tokens = block_tokens;
        size_t common = 0;
        auto keys = hasher.Keys(wr, &common);
        Replica& rep = reps[run.replica];
        evicted.clear();
        for (size_t i = keys.size(); i-- > 0;) {
          rep.ranks[run.rank]->Put(keys[i], AccessHint{run.sim_id, static_cast<uint32_t>(i), now},
                                   &evicted);
          if (!ideal.Contains(keys[i])) ideal.Insert(keys[i], 1);
        }
        demote(rep, evicted, run.sim_id);
      }
      push(now, EvType::kArrive, ev.id);
      continue;
    }
    if (ev.type == EvType::kArrive) {
      Run& run = runs[ev.id];
      const auto& sess = traces[run.trace].sessions[run.session];
      if (run.next >= sess.requests.size() || !budget_left() || now >= window_end) {
        // Nothing (more) to send: the session ends.
        if (--tree_live[run.tree] == 0) {
          live_change(now, -1);
          if (want_more_trees()) start_tree(now);
        }
        continue;
      }
      const bool measured = now >= window_start;
      const auto& q = sess.requests[run.next];
      ++issued;
      Replica& rep = reps[run.replica];
      const uint32_t rank = o.dp_round_robin ? static_cast<uint32_t>(rr_rank++ % o.dp) : run.rank;
      SimTier& hbm = *rep.ranks[rank];
      workload::ReplayRequest rq;
      rq.session = run.sim_id;
      rq.root = run.root;
      rq.ids = traces[run.trace].IdsOf(q);
      rq.block_tokens = block_tokens;
      rq.session_last = run.next + 1 == sess.requests.size();
      size_t common = 0;
      auto keys = hasher.Keys(rq, &common);
      const size_t n = keys.size();
      // Ideal: an infinite cache over the same requests.
      size_t im = 0;
      while (im < n && ideal.Contains(keys[im])) ++im;
      for (size_t i = im; i < n; ++i) ideal.Insert(keys[i], 1);
      if (measured) ideal_hits += std::min<uint64_t>(im * block_tokens, q.prompt_tokens);

      session_event(rep, run.sim_id, SessionEvent::kActive, now);
      size_t hbm_prefix = 0;
      while (hbm_prefix < n && hbm.Contains(keys[hbm_prefix])) ++hbm_prefix;
      // Where each following block can be loaded from: 1 host, 2 disk, 3 remote.
      std::vector<uint8_t> src;
      for (size_t i = hbm_prefix; i < n; ++i) {
        uint8_t s = 0;
        if (rep.host && rep.host->Contains(keys[i]))
          s = 1;
        else if (rep.disk && rep.disk->Contains(keys[i]))
          s = 2;
        else if (remote && remote->Contains(keys[i]))
          s = 3;
        if (s == 0) break;
        src.push_back(s);
      }
      const uint64_t prompt = q.prompt_tokens;
      // The planner decides: recompute the first r loadable blocks, load the next ones.
      PlanRequest pr;
      pr.prompt_tokens = static_cast<uint32_t>(std::min<uint64_t>(prompt, UINT32_MAX));
      pr.resident_blocks = static_cast<uint32_t>(hbm_prefix);
      for (uint8_t code : src) pr.block_tier.push_back(tier_of[code]);
      Plan plan = planner.Choose(pr);
      if (!o.planner && plan.choice != PlanChoice::kLoad) {
        // Always load: the whole run the planner could have loaded.
        const uint32_t loadable = plan.recompute_blocks + plan.load_blocks;
        plan.recompute_blocks = 0;
        plan.load_blocks = loadable;
      }
      const size_t head = plan.recompute_blocks, load = plan.load_blocks;
      // Loads: one batch per tier (the planner's pricing), queued on the device (SSD, NIC)
      // and the host link; a request waits for its last batch and the connector's fixed cost.
      double load_done = now;
      if (load > 0) {
        uint64_t count[4] = {0, 0, 0, 0};
        for (size_t i = head; i < head + load; ++i) ++count[src[i]];
        for (int code = 1; code <= 3; ++code) {
          if (count[code] == 0) continue;
          const double secs = planner.LoadSeconds(tier_of[code], count[code]);
          double done = 0;
          if (code == 1) {
            done = rep.link.Use(now, secs);
          } else {
            const double dev = (code == 2 ? rep.disk_io : rep.nic).Use(now, secs);
            done = std::max(dev, rep.link.Use(now, count[code] * bb / link_bw));
          }
          load_done = std::max(load_done, done);
          if (measured) traffic[code].load_bytes += count[code] * res.block_bytes;
        }
        load_done += cp.load_fixed_s;
      }
      // Token accounting.
      auto tokens_of = [&](size_t from_block, size_t to_block) -> uint64_t {
        const uint64_t a = std::min<uint64_t>(from_block * block_tokens, prompt);
        const uint64_t b = std::min<uint64_t>(to_block * block_tokens, prompt);
        return b - a;
      };
      uint64_t loaded = 0;
      for (size_t i = head; i < head + load; ++i)
        loaded += tokens_of(hbm_prefix + i, hbm_prefix + i + 1);
      if (measured) {
        res.hbm_tokens += tokens_of(0, hbm_prefix);
        for (size_t i = head; i < head + load; ++i) {
          const uint64_t t = tokens_of(hbm_prefix + i, hbm_prefix + i + 1);
          if (src[i] == 1) res.host_tokens += t;
          if (src[i] == 2) res.disk_tokens += t;
          if (src[i] == 3) res.remote_tokens += t;
        }
        res.loadable_recomputed += tokens_of(hbm_prefix, hbm_prefix + src.size()) - loaded;
        res.recomputed += prompt - tokens_of(0, hbm_prefix) - loaded;
        res.prompt_tokens += prompt;
        res.output_tokens += q.output_tokens;
        ++res.requests;
      }
      // The HBM prefix is in use now: it becomes most recent (touched last to first).
      for (size_t i = hbm_prefix; i-- > 0;)
        hbm.Touch(keys[i], AccessHint{run.sim_id, static_cast<uint32_t>(i), now});
      // Compute: the recomputed head, then everything after the loaded run (at least one token:
      // the logits of the last one), priced by the planner's prefill model.
      const double ctx0 =
          static_cast<double>(std::min<uint64_t>(hbm_prefix * block_tokens, prompt));
      const double end =
          std::min<double>(static_cast<double>((hbm_prefix + head + load) * block_tokens),
                           static_cast<double>(prompt));
      const double tail = std::max(1.0, static_cast<double>(prompt) - end);
      const double compute_s = pc.fixed_s +
                               pc.Compute(static_cast<double>(head * block_tokens), ctx0) +
                               pc.Compute(tail, std::min(end, prompt - tail));
      const double start = std::max(load_done, rep.gpu_free);
      const double done = start + compute_s;
      rep.gpu_free = done;
      uint32_t slot;
      if (!free_slots.empty()) {
        slot = free_slots.back();
        free_slots.pop_back();
      } else {
        slot = static_cast<uint32_t>(slots.size());
        slots.emplace_back();
      }
      InFlight& f = slots[slot];
      f.run = ev.id;
      f.rank = rank;
      f.measured = measured;
      f.arrive_s = now;
      f.context_tokens = prompt + q.output_tokens;
      f.output_tokens = q.output_tokens;
      f.keys.assign(keys.begin(), keys.end());
      push(done, EvType::kPrefillDone, slot);
      // Occupancy sample.
      std::vector<double> occ;
      uint64_t hbm_used = 0;
      for (const auto& r : rep.ranks) hbm_used += r->size();
      occ.push_back(static_cast<double>(hbm_used) / std::max<uint64_t>(1, hbm_blocks));
      occ.push_back(rep.host ? static_cast<double>(rep.host->size()) /
                                   std::max<uint64_t>(1, rep.host->capacity())
                             : 0);
      occ.push_back(rep.disk ? static_cast<double>(rep.disk->size()) /
                                   std::max<uint64_t>(1, rep.disk->capacity())
                             : 0);
      occ.push_back(remote ? static_cast<double>(remote->size()) /
                                 std::max<uint64_t>(1, remote->capacity())
                           : 0);
      occupancy.emplace_back(now, std::move(occ));
      continue;
    }
    if (ev.type == EvType::kPrefillDone) {
      InFlight& f = slots[ev.id];
      Run& run = runs[f.run];
      Replica& rep = reps[run.replica];
      f.first_token_s = now;
      if (f.measured) ttft.push_back(now - f.arrive_s);
      // The whole prompt is resident in HBM now (touched last to first); what HBM drops goes
      // to host, host's drops to disk; new blocks are written through to remote.
      evicted.clear();
      uint64_t new_remote = 0;
      for (size_t i = f.keys.size(); i-- > 0;) {
        AccessHint h{run.sim_id, static_cast<uint32_t>(i), now};
        rep.ranks[f.rank]->Put(f.keys[i], h, &evicted);
        if (remote && !remote->Contains(f.keys[i])) {
          evicted2.clear();
          remote->Put(f.keys[i], h, &evicted2);
          ++new_remote;
        }
      }
      if (new_remote) {
        rep.nic.Use(now, planner.LoadSeconds(tier_of[3], new_remote));
        traffic[3].store_bytes += new_remote * res.block_bytes;
      }
      demote(rep, evicted, run.sim_id);
      // The running batch's KV must fit in HBM: wait for room (FIFO) when it does not.
      if (rep.decoding_tokens == 0 ||
          rep.decoding_tokens + f.context_tokens <= res.capacity_tokens) {
        start_decode(rep, ev.id);
      } else {
        rep.waiting.push_back(ev.id);
      }
      continue;
    }
    // kDecodeDone
    InFlight& f = slots[ev.id];
    Run& run = runs[f.run];
    Replica& rep = reps[run.replica];
    rep.decoding_tokens -= f.context_tokens;
    while (
        !rep.waiting.empty() &&
        (rep.decoding_tokens == 0 ||
         rep.decoding_tokens + slots[rep.waiting.front()].context_tokens <= res.capacity_tokens)) {
      const uint32_t next = rep.waiting.front();
      rep.waiting.pop_front();
      start_decode(rep, next);
    }
    if (f.measured) e2e.push_back(now - f.arrive_s);
    if (o.record_requests) {
      res.log.push_back(
          RequestRecord{run.trace, run.session, run.next, f.arrive_s, f.first_token_s, now});
    }
    const auto& sess = traces[run.trace].sessions[run.session];
    const auto& q = sess.requests[run.next];
    run.next++;
    free_slots.push_back(ev.id);
    if (run.next < sess.requests.size()) {
      const auto& nq = sess.requests[run.next];
      double think = nq.think_s;
      if (think < 0) {
        think = std::max(0.0, nq.start_s - q.start_s - std::max(0.0, q.api_s));
      }
      if (o.max_idle_s > 0) think = std::min(think, o.max_idle_s);
      session_event(rep, run.sim_id, SessionEvent::kThinking, now);
      push(now + think, EvType::kArrive, f.run);
    } else {
      session_event(rep, run.sim_id, SessionEvent::kFinished, now);
      push(now, EvType::kArrive, f.run);  // ends the session (see kArrive)
    }
  }

  res.makespan_s = now;
  live_change(now, 0);
  const double measured_s =
      o.window_s > 0 ? std::min(now, window_end) - window_start : res.makespan_s;
  res.window_start_s = window_start;
  res.measured_s = measured_s;
  res.live_trees_mean = measured_s > 0 ? live_area / measured_s : 0;
  res.itl_s = WeightedPercentiles(std::move(itl));
  res.ideal_hit_rate = res.prompt_tokens ? static_cast<double>(ideal_hits) / res.prompt_tokens : 0;
  res.ttft_s = ComputePercentiles(ttft);
  res.tpot_s = ComputePercentiles(tpot);
  res.e2e_s = ComputePercentiles(e2e);
  std::sort(ttft.begin(), ttft.end());
  res.ttft_samples = std::move(ttft);
  const double gpus = static_cast<double>(o.replicas) * tp;
  if (measured_s > 0) {
    res.input_tokens_per_s_per_gpu = res.prompt_tokens / measured_s / gpus;
    res.output_tokens_per_s_per_gpu = res.output_tokens / measured_s / gpus;
    res.total_tokens_per_s_per_gpu =
        static_cast<double>(res.prompt_tokens + res.output_tokens) / measured_s / gpus;
  }
  auto inv = [](double x) { return x > 0 ? 1.0 / x : 0; };
  res.interactivity_p50 = inv(res.itl_s.p50);
  res.interactivity_p75 = inv(res.itl_s.p75);
  res.interactivity = inv(res.itl_s.p90);
  traffic[0].capacity_blocks = hbm_blocks;
  for (const auto& r : reps) {
    uint64_t peak = 0;  // sum of the ranks' peaks: an upper bound when dp > 1
    for (const auto& k : r.ranks) peak += k->peak();
    traffic[0].peak_blocks = std::max(traffic[0].peak_blocks, peak);
  }
  if (o.host.enabled) {
    traffic[1].capacity_blocks = reps[0].host->capacity();
    for (const auto& r : reps)
      traffic[1].peak_blocks = std::max(traffic[1].peak_blocks, r.host->peak());
  }
  if (o.disk.enabled) {
    traffic[2].capacity_blocks = reps[0].disk->capacity();
    for (const auto& r : reps)
      traffic[2].peak_blocks = std::max(traffic[2].peak_blocks, r.disk->peak());
  }
  if (remote) {
    traffic[3].capacity_blocks = remote->capacity();
    traffic[3].peak_blocks = remote->peak();
  }
  traffic[0].load_bytes = 0;
  for (int i = 0; i < 4; ++i) {
    if (i == 0 || (i == 1 && o.host.enabled) || (i == 2 && o.disk.enabled) || (i == 3 && remote)) {
      res.tiers.push_back(traffic[i]);
    }
  }
  // Occupancy: at most occupancy_samples points, evenly spread over the samples.
  const size_t ns = std::min<size_t>(o.occupancy_samples, occupancy.size());
  res.occupancy_frac.assign(res.tiers.size(), {});
  for (size_t s = 0; s < ns; ++s) {
    const size_t i = ns == 1 ? 0 : s * (occupancy.size() - 1) / (ns - 1);
    res.occupancy_t.push_back(occupancy[i].first);
    size_t col = 0;
    for (int t = 0; t < 4; ++t) {
      if (t == 0 || (t == 1 && o.host.enabled) || (t == 2 && o.disk.enabled) ||
          (t == 3 && remote)) {
        res.occupancy_frac[col++].push_back(occupancy[i].second[t]);
      }
    }
  }
  res.wall_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count() -
      wall_start;
  return res;
}

}  // namespace kvtier::sim
