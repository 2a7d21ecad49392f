#include "sim/timed_replay.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <utility>

#include "sim/hbm_budget.h"
#include "sim/timed_replay_impl.h"

namespace kvtier::sim {
namespace timed {

Result<TimedResult> TimedReplay::Simulate() {
  const double wall_start =
      std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  KVTIER_RETURN_IF_ERROR(Configure());
  KVTIER_RETURN_IF_ERROR(BuildTiers());
  LinkSessions();
  trees_one_pass_ = std::max<uint64_t>(traces_.size(), o_.concurrency);
  for (uint32_t i = 0; i < o_.concurrency && WantMoreTrees(); ++i) StartTree(0);
  while (!events_.empty()) {
    const Event ev = events_.top();
    events_.pop();
    now_ = ev.t;
    switch (ev.type) {
      case EvType::kStartSession:
        OnStartSession(ev.id);
        break;
      case EvType::kArrive:
        OnArrive(ev.id);
        break;
      case EvType::kPrefillDone:
        OnPrefillDone(ev.id);
        break;
      case EvType::kDecodeDone:
        OnDecodeDone(ev.id);
        break;
    }
  }
  Summarize();
  res_.wall_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count() -
      wall_start;
  return std::move(res_);
}

Status TimedReplay::Configure() {
  block_tokens_ = traces_[0].block_tokens;
  for (const auto& t : traces_) {
    if (t.block_tokens != block_tokens_) {
      return Status::InvalidArgument("timed replay needs one block size; " + t.path + " has " +
                                     std::to_string(t.block_tokens) + ", " + traces_[0].path +
                                     " has " + std::to_string(block_tokens_));
    }
  }
  res_.gpu = gpu_.name;
  res_.model = model_.name;
  res_.policy = o_.policy;
  res_.concurrency = o_.concurrency;
  res_.replicas = o_.replicas;
  res_.dp = o_.dp;
  res_.dp_round_robin = o_.dp_round_robin;
  res_.agentx_rules = o_.agentx_rules;
  // The measuring window: everything, or [warmup, warmup + window) when a window is set.
  window_start_ = o_.window_s > 0 ? o_.warmup_s : 0;
  window_end_ = o_.window_s > 0 ? o_.warmup_s + o_.window_s : INFINITY;
  tp_ = o_.tp;
  if (tp_ == 0) tp_ = DefaultTp(gpu_, model_);
  res_.tp = tp_;
  CostModelOptions cm;
  cm.tp = tp_;
  cm.block_tokens = block_tokens_;
  cm.mfu = o_.mfu;
  cm.kv_dtype = o_.kv_dtype;
  cm.host = o_.host.enabled;
  cm.host_gbps = o_.host.bandwidth_gbps > 0 ? o_.host.bandwidth_gbps * tp_ : 0;
  cm.host_latency_s = o_.host.latency_s > 0 ? o_.host.latency_s : -1;
  cm.disk = o_.disk.enabled;
  cm.disk_gbps = o_.disk.bandwidth_gbps;
  cm.disk_latency_s = o_.disk.latency_s;
  cm.remote = o_.remote.enabled;
  cm.remote_gbps = o_.remote.bandwidth_gbps;
  cm.remote_latency_s = o_.remote.latency_s;
  KVTIER_ASSIGN_OR_RETURN(CostProfile cost, MakeCostProfile(gpu_, model_, cm));
  planner_.emplace(std::move(cost));
  cp_ = &planner_->profile();
  const CostProfile& cp = *cp_;
  tier_of_[1] = cp.FindTier("host");
  tier_of_[2] = cp.FindTier("disk");
  tier_of_[3] = cp.FindTier("remote");
  kv_per_token_ = model_.KvBytesPerToken(o_.kv_dtype);
  accept_ =
      o_.spec_acceptance_length > 0 ? o_.spec_acceptance_length : model_.spec_acceptance_length;
  res_.block_bytes = cp.block_bytes;
  double kv_bytes = static_cast<double>(o_.hbm_kv_bytes);
  if (o_.hbm_kv_bytes == 0) {
    // The engine's pool per data-parallel rank (sim/hbm_budget.h), each rank running its share
    // of the live session trees; the replicas' ranks hold tokens at the per-token block size.
    ServingOptions so;
    so.tp = tp_;
    so.dp = o_.dp;
    so.memory_utilization = o_.hbm_kv_fraction;
    so.running_per_rank = (o_.concurrency + o_.dp - 1) / o_.dp;
    so.kv_dtype = o_.kv_dtype;
    KVTIER_ASSIGN_OR_RETURN(HbmBudget budget, ComputeHbmBudget(gpu_, model_, so));
    kv_bytes = static_cast<double>(budget.tokens) * o_.dp * static_cast<double>(kv_per_token_);
  }
  if (kv_bytes < static_cast<double>(res_.block_bytes)) {
    return Status::InvalidArgument(model_.name + " leaves no HBM for KV on " + std::to_string(tp_) +
                                   " x " + gpu_.name + "; raise --tp");
  }
  res_.hbm_kv_bytes = static_cast<uint64_t>(kv_bytes);
  hbm_blocks_ = res_.hbm_kv_bytes / res_.block_bytes;
  if (hbm_blocks_ < o_.dp)
    return Status::InvalidArgument("--dp leaves a rank without an HBM block");
  res_.capacity_tokens = hbm_blocks_ * block_tokens_;
  host_bytes_ = o_.host_pool_multiple > 0
                    ? static_cast<uint64_t>(o_.host_pool_multiple * res_.hbm_kv_bytes)
                : o_.host.capacity_bytes > 0
                    ? o_.host.capacity_bytes
                    : std::min<uint64_t>(4 * res_.hbm_kv_bytes, 3'000'000'000'000ull);
  hbm_bw_ = gpu_.hbm_tbps * 1e12 * gpu_.hbm_efficiency * tp_;
  link_bw_ =
      (o_.host.bandwidth_gbps > 0 ? o_.host.bandwidth_gbps * tp_ : gpu_.host_link_gbps * tp_) * 1e9;
  bb_ = static_cast<double>(res_.block_bytes);
  return Status::Ok();
}

Status TimedReplay::BuildTiers() {
  auto make_policy = [&](uint64_t blocks) -> Result<std::unique_ptr<EvictionPolicy>> {
    const std::string name = o_.policy == "lru-tail" || o_.policy == "lru" ? "lru" : o_.policy;
    return MakeEvictionPolicy(name, blocks);
  };
  reps_.resize(o_.replicas);
  for (auto& r : reps_) {
    for (uint32_t k = 0; k < o_.dp; ++k) {
      KVTIER_ASSIGN_OR_RETURN(auto p, make_policy(hbm_blocks_ / o_.dp));
      r.ranks.push_back(std::make_unique<SimTier>("hbm", hbm_blocks_ / o_.dp, std::move(p)));
    }
    if (o_.host.enabled) {
      KVTIER_ASSIGN_OR_RETURN(auto hp, make_policy(host_bytes_ / res_.block_bytes));
      r.host = std::make_unique<SimTier>("host", host_bytes_ / res_.block_bytes, std::move(hp));
    }
    if (o_.disk.enabled) {
      KVTIER_ASSIGN_OR_RETURN(auto dp, make_policy(o_.disk.capacity_bytes / res_.block_bytes));
      r.disk = std::make_unique<SimTier>("disk", o_.disk.capacity_bytes / res_.block_bytes,
                                         std::move(dp));
    }
  }
  if (o_.remote.enabled) {
    KVTIER_ASSIGN_OR_RETURN(auto rp, make_policy(o_.remote.capacity_bytes / res_.block_bytes));
    remote_ = std::make_unique<SimTier>("remote", o_.remote.capacity_bytes / res_.block_bytes,
                                        std::move(rp));
  }
  res_.offload = o_.host.enabled || o_.disk.enabled || o_.remote.enabled;
  return Status::Ok();
}

void TimedReplay::LinkSessions() {
  children_.resize(traces_.size());
  for (uint32_t t = 0; t < traces_.size(); ++t) {
    children_[t].resize(traces_[t].sessions.size());
    for (uint32_t s = 0; s < traces_[t].sessions.size(); ++s) {
      const auto& ss = traces_[t].sessions[s];
      if (ss.parent >= 0) {
        const auto& parent = traces_[t].sessions[ss.parent];
        const double parent_start =
            parent.requests.empty() ? parent.start_s : parent.requests[0].start_s;
        const double child_start = ss.requests.empty() ? ss.start_s : ss.requests[0].start_s;
        children_[t][ss.parent].emplace_back(s, std::max(0.0, child_start - parent_start));
      }
    }
  }
}

void TimedReplay::LiveChange(double t, int delta) {
  const double a = std::max(live_since_, window_start_), b = std::min(t, window_end_);
  if (b > a) live_area_ += static_cast<double>(live_trees_) * (b - a);
  live_since_ = t;
  live_trees_ = static_cast<uint64_t>(static_cast<int64_t>(live_trees_) + delta);
}

void TimedReplay::StartSession(uint32_t trace, uint32_t session, uint32_t tree, uint32_t replica,
                               BlockKey root, double at) {
  Run r{trace, session, tree, replica, 0, runs_.size() + 1, root, at};
  r.rank = static_cast<uint32_t>(Mix(r.sim_id ^ (o_.seed << 32)) % o_.dp);
  const auto& reqs = traces_[trace].sessions[session].requests;
  if (o_.agentx_rules && traces_[trace].sessions[session].parent < 0 && reqs.size() > 1) {
    // Start at a seeded point 25-75% through the recorded session; its prefix is warmed.
    const double u = 0.25 + 0.5 * static_cast<double>(Mix(o_.seed * 1000003 + tree) >> 11) /
                                static_cast<double>(1ull << 53);
    const double t0 = reqs.front().start_s, point = t0 + u * (reqs.back().start_s - t0);
    while (r.next + 1 < reqs.size() && reqs[r.next].start_s < point) ++r.next;
    r.skip_s = reqs[r.next].start_s - t0;
  }
  runs_.push_back(r);
  ++tree_live_[tree];
  Push(at, EvType::kStartSession, static_cast<uint32_t>(runs_.size() - 1));
}

void TimedReplay::StartTree(double at) {
  const uint32_t trace = static_cast<uint32_t>(trees_started_ % traces_.size());
  const uint64_t copy = trees_started_ / traces_.size();
  const uint32_t tree = static_cast<uint32_t>(tree_live_.size());
  tree_live_.push_back(0);
  LiveChange(at, +1);
  // Each copy of a trace is another user's session: its own namespace.
  const BlockKey root = copy == 0
                            ? traces_[trace].root
                            : ChainKeyFromId(traces_[trace].root, 0x5eed000000000000ull | copy);
  ++trees_started_;
  for (uint32_t s = 0; s < traces_[trace].sessions.size(); ++s) {
    if (traces_[trace].sessions[s].parent < 0) {
      StartSession(trace, s, tree, tree % o_.replicas, root, at);
    }
  }
}

bool TimedReplay::WantMoreTrees() const {
  if (o_.window_s > 0) return now_ < window_end_ && BudgetLeft();  // keep C trees live
  return o_.max_requests > 0 ? BudgetLeft() : trees_started_ < trees_one_pass_;
}

void TimedReplay::NotifySession(Replica& rep, uint64_t session, SessionEvent e, double t) {
  for (auto& rank : rep.ranks) rank->Event(session, e, t);
  for (SimTier* tier : {rep.host.get(), rep.disk.get(), remote_.get()}) {
    if (tier != nullptr) tier->Event(session, e, t);
  }
}

void TimedReplay::Demote(Replica& rep, const std::vector<BlockKey>& from_hbm, uint64_t session) {
  if (!rep.host) return;
  AccessHint h{session, 0, now_};
  evicted2_.clear();
  uint64_t stored = 0;
  for (const auto& k : from_hbm) {
    if (!rep.host->Contains(k)) ++stored;
    rep.host->Put(k, h, &evicted2_);
  }
  if (stored) {
    rep.link.Use(now_, planner_->LoadSeconds(tier_of_[1], stored));
    traffic_[1].store_bytes += stored * res_.block_bytes;
  }
  if (!rep.disk || evicted2_.empty()) return;
  evicted3_.clear();
  uint64_t to_disk = 0;
  for (const auto& k : evicted2_) {
    if (!rep.disk->Contains(k)) ++to_disk;
    rep.disk->Put(k, h, &evicted3_);
  }
  if (to_disk) {
    rep.disk_io.Use(now_, planner_->LoadSeconds(tier_of_[2], to_disk));
    traffic_[2].store_bytes += to_disk * res_.block_bytes;
  }
}

void TimedReplay::StartDecode(Replica& rep, uint32_t slot) {
  InFlight& f = slots_[slot];
  rep.decoding_tokens += f.context_tokens;
  const double step =
      (model_.weight_bytes() + static_cast<double>(rep.decoding_tokens) * kv_per_token_) / hbm_bw_;
  // Speculative decoding: `accept` tokens per step on average.
  const double per_token = step / accept_;
  if (f.measured) {
    tpot_.push_back(per_token);
    if (f.output_tokens > 1) itl_.emplace_back(per_token, f.output_tokens - 1);
  }
  Push(now_ + per_token * std::max<uint32_t>(1, f.output_tokens), EvType::kDecodeDone, slot);
}

void TimedReplay::OnStartSession(uint32_t run_id) {
  runs_[run_id].started_s = now_;
  const Run run = runs_[run_id];  // a copy: StartSession grows runs_
  for (const auto& [child, offset] : children_[run.trace][run.session]) {
    if (offset < run.skip_s) continue;  // it ran in the skipped part
    StartSession(run.trace, child, run.tree, run.replica, run.root, now_ + offset - run.skip_s);
  }
  if (run.next > 0) {
    // AgentX rules: the skipped part's context is in HBM (and what spills, below) before
    // the first replayed request; nothing of it is measured.
    const auto& prev = traces_[run.trace].sessions[run.session].requests[run.next - 1];
    workload::ReplayRequest wr;
    wr.session = run.sim_id;
    wr.root = run.root;
    wr.ids = traces_[run.trace].IdsOf(prev);
    wr.block_tokens = block_tokens_;
    size_t common = 0;
    auto keys = hasher_.Keys(wr, &common);
    Replica& rep = reps_[run.replica];
    evicted_.clear();
    for (size_t i = keys.size(); i-- > 0;) {
      rep.ranks[run.rank]->Put(keys[i], AccessHint{run.sim_id, static_cast<uint32_t>(i), now_},
                               &evicted_);
      if (!ideal_.Contains(keys[i])) ideal_.Insert(keys[i], 1);
    }
    Demote(rep, evicted_, run.sim_id);
  }
  Push(now_, EvType::kArrive, run_id);
}

void TimedReplay::OnArrive(uint32_t run_id) {
  Run& run = runs_[run_id];
  const auto& sess = traces_[run.trace].sessions[run.session];
  if (run.next >= sess.requests.size() || !BudgetLeft() || now_ >= window_end_) {
    // Nothing (more) to send: the session ends.
    if (--tree_live_[run.tree] == 0) {
      LiveChange(now_, -1);
      if (WantMoreTrees()) StartTree(now_);
    }
    return;
  }
  const bool measured = now_ >= window_start_;
  const auto& q = sess.requests[run.next];
  ++issued_;
  Replica& rep = reps_[run.replica];
  const uint32_t rank = o_.dp_round_robin ? static_cast<uint32_t>(rr_rank_++ % o_.dp) : run.rank;
  SimTier& hbm = *rep.ranks[rank];
  // Valid until the hasher's next request: none comes before this one is done.
  const std::span<const BlockKey> keys = RequestKeys(run, q, measured);
  const size_t n = keys.size();

  NotifySession(rep, run.sim_id, SessionEvent::kActive, now_);
  size_t hbm_prefix = 0;
  while (hbm_prefix < n && hbm.Contains(keys[hbm_prefix])) ++hbm_prefix;
  const std::vector<uint8_t> src = LoadSources(rep, keys, hbm_prefix);
  const uint64_t prompt = q.prompt_tokens;
  // The planner decides: recompute the first r loadable blocks, load the next ones.
  PlanRequest pr;
  pr.prompt_tokens = static_cast<uint32_t>(std::min<uint64_t>(prompt, UINT32_MAX));
  pr.resident_blocks = static_cast<uint32_t>(hbm_prefix);
  for (uint8_t code : src) pr.block_tier.push_back(tier_of_[code]);
  Plan plan = planner_->Choose(pr);
  if (!o_.planner && plan.choice != PlanChoice::kLoad) {
    // Always load: the whole run the planner could have loaded.
    const uint32_t loadable = plan.recompute_blocks + plan.load_blocks;
    plan.recompute_blocks = 0;
    plan.load_blocks = loadable;
  }
  const size_t head = plan.recompute_blocks, load = plan.load_blocks;
  const double load_done = ScheduleLoads(rep, src, head, load, measured);
  if (measured) CountTokens(q, src, hbm_prefix, head, load);
  // The HBM prefix is in use now: it becomes most recent (touched last to first).
  for (size_t i = hbm_prefix; i-- > 0;)
    hbm.Touch(keys[i], AccessHint{run.sim_id, static_cast<uint32_t>(i), now_});
  // Compute: the recomputed head, then everything after the loaded run (at least one token:
  // the logits of the last one), priced by the planner's prefill model.
  const PrefillCost& pc = cp_->prefill;
  const double ctx0 = static_cast<double>(std::min<uint64_t>(hbm_prefix * block_tokens_, prompt));
  const double end = std::min<double>(
      static_cast<double>((hbm_prefix + head + load) * block_tokens_), static_cast<double>(prompt));
  const double tail = std::max(1.0, static_cast<double>(prompt) - end);
  const double compute_s = pc.fixed_s +
                           pc.Compute(static_cast<double>(head * block_tokens_), ctx0) +
                           pc.Compute(tail, std::min(end, prompt - tail));
  const double start = std::max(load_done, rep.gpu_free);
  const double done = start + compute_s;
  rep.gpu_free = done;
  const uint32_t slot = TakeSlot();
  InFlight& f = slots_[slot];
  f.run = run_id;
  f.rank = rank;
  f.measured = measured;
  f.arrive_s = now_;
  f.context_tokens = prompt + q.output_tokens;
  f.output_tokens = q.output_tokens;
  f.keys.assign(keys.begin(), keys.end());
  Push(done, EvType::kPrefillDone, slot);
  SampleOccupancy(rep);
}

std::span<const BlockKey> TimedReplay::RequestKeys(const Run& run, const workload::TraceRequest& q,
                                                   bool measured) {
  workload::ReplayRequest rq;
  rq.session = run.sim_id;
  rq.root = run.root;
  rq.ids = traces_[run.trace].IdsOf(q);
  rq.block_tokens = block_tokens_;
  rq.session_last = run.next + 1 == traces_[run.trace].sessions[run.session].requests.size();
  size_t common = 0;
  auto keys = hasher_.Keys(rq, &common);
  const size_t n = keys.size();
  // Ideal: an infinite cache over the same requests.
  size_t im = 0;
  while (im < n && ideal_.Contains(keys[im])) ++im;
  for (size_t i = im; i < n; ++i) ideal_.Insert(keys[i], 1);
  if (measured) ideal_hits_ += std::min<uint64_t>(im * block_tokens_, q.prompt_tokens);
  return keys;
}

std::vector<uint8_t> TimedReplay::LoadSources(const Replica& rep, std::span<const BlockKey> keys,
                                              size_t hbm_prefix) const {
  // Where each following block can be loaded from: 1 host, 2 disk, 3 remote.
  std::vector<uint8_t> src;
  for (size_t i = hbm_prefix; i < keys.size(); ++i) {
    uint8_t s = 0;
    if (rep.host && rep.host->Contains(keys[i]))
      s = 1;
    else if (rep.disk && rep.disk->Contains(keys[i]))
      s = 2;
    else if (remote_ && remote_->Contains(keys[i]))
      s = 3;
    if (s == 0) break;
    src.push_back(s);
  }
  return src;
}

double TimedReplay::ScheduleLoads(Replica& rep, const std::vector<uint8_t>& src, size_t head,
                                  size_t load, bool measured) {
  // Loads: one batch per tier (the planner's pricing), queued on the device (SSD, NIC)
  // and the host link; a request waits for its last batch and the connector's fixed cost.
  double load_done = now_;
  if (load == 0) return load_done;
  uint64_t count[4] = {0, 0, 0, 0};
  for (size_t i = head; i < head + load; ++i) ++count[src[i]];
  for (int code = 1; code <= 3; ++code) {
    if (count[code] == 0) continue;
    const double secs = planner_->LoadSeconds(tier_of_[code], count[code]);
    double done = 0;
    if (code == 1) {
      done = rep.link.Use(now_, secs);
    } else {
      const double dev = (code == 2 ? rep.disk_io : rep.nic).Use(now_, secs);
      done = std::max(dev, rep.link.Use(now_, count[code] * bb_ / link_bw_));
    }
    load_done = std::max(load_done, done);
    if (measured) traffic_[code].load_bytes += count[code] * res_.block_bytes;
  }
  return load_done + cp_->load_fixed_s;
}

void TimedReplay::CountTokens(const workload::TraceRequest& q, const std::vector<uint8_t>& src,
                              size_t hbm_prefix, size_t head, size_t load) {
  const uint64_t prompt = q.prompt_tokens;
  auto tokens_of = [&](size_t from_block, size_t to_block) -> uint64_t {
    const uint64_t a = std::min<uint64_t>(from_block * block_tokens_, prompt);
    const uint64_t b = std::min<uint64_t>(to_block * block_tokens_, prompt);
    return b - a;
  };
  uint64_t loaded = 0;
  for (size_t i = head; i < head + load; ++i)
    loaded += tokens_of(hbm_prefix + i, hbm_prefix + i + 1);
  res_.hbm_tokens += tokens_of(0, hbm_prefix);
  for (size_t i = head; i < head + load; ++i) {
    const uint64_t t = tokens_of(hbm_prefix + i, hbm_prefix + i + 1);
    if (src[i] == 1) res_.host_tokens += t;
    if (src[i] == 2) res_.disk_tokens += t;
    if (src[i] == 3) res_.remote_tokens += t;
  }
  res_.loadable_recomputed += tokens_of(hbm_prefix, hbm_prefix + src.size()) - loaded;
  res_.recomputed += prompt - tokens_of(0, hbm_prefix) - loaded;
  res_.prompt_tokens += prompt;
  res_.output_tokens += q.output_tokens;
  ++res_.requests;
}

uint32_t TimedReplay::TakeSlot() {
  if (!free_slots_.empty()) {
    const uint32_t slot = free_slots_.back();
    free_slots_.pop_back();
    return slot;
  }
  slots_.emplace_back();
  return static_cast<uint32_t>(slots_.size() - 1);
}

void TimedReplay::SampleOccupancy(const Replica& rep) {
  std::vector<double> occ;
  uint64_t hbm_used = 0;
  for (const auto& r : rep.ranks) hbm_used += r->size();
  occ.push_back(static_cast<double>(hbm_used) / std::max<uint64_t>(1, hbm_blocks_));
  occ.push_back(rep.host ? static_cast<double>(rep.host->size()) /
                               std::max<uint64_t>(1, rep.host->capacity())
                         : 0);
  occ.push_back(rep.disk ? static_cast<double>(rep.disk->size()) /
                               std::max<uint64_t>(1, rep.disk->capacity())
                         : 0);
  occ.push_back(remote_ ? static_cast<double>(remote_->size()) /
                              std::max<uint64_t>(1, remote_->capacity())
                        : 0);
  occupancy_.emplace_back(now_, std::move(occ));
}

void TimedReplay::OnPrefillDone(uint32_t slot) {
  InFlight& f = slots_[slot];
  Run& run = runs_[f.run];
  Replica& rep = reps_[run.replica];
  f.first_token_s = now_;
  if (f.measured) ttft_.push_back(now_ - f.arrive_s);
  // The whole prompt is resident in HBM now (touched last to first); what HBM drops goes
  // to host, host's drops to disk; new blocks are written through to remote.
  evicted_.clear();
  uint64_t new_remote = 0;
  for (size_t i = f.keys.size(); i-- > 0;) {
    AccessHint h{run.sim_id, static_cast<uint32_t>(i), now_};
    rep.ranks[f.rank]->Put(f.keys[i], h, &evicted_);
    if (remote_ && !remote_->Contains(f.keys[i])) {
      evicted2_.clear();
      remote_->Put(f.keys[i], h, &evicted2_);
      ++new_remote;
    }
  }
  if (new_remote) {
    rep.nic.Use(now_, planner_->LoadSeconds(tier_of_[3], new_remote));
    traffic_[3].store_bytes += new_remote * res_.block_bytes;
  }
  Demote(rep, evicted_, run.sim_id);
  // The running batch's KV must fit in HBM: wait for room (FIFO) when it does not.
  if (rep.decoding_tokens == 0 || rep.decoding_tokens + f.context_tokens <= res_.capacity_tokens) {
    StartDecode(rep, slot);
  } else {
    rep.waiting.push_back(slot);
  }
}

void TimedReplay::OnDecodeDone(uint32_t slot) {
  InFlight& f = slots_[slot];
  Run& run = runs_[f.run];
  Replica& rep = reps_[run.replica];
  rep.decoding_tokens -= f.context_tokens;
  while (
      !rep.waiting.empty() &&
      (rep.decoding_tokens == 0 ||
       rep.decoding_tokens + slots_[rep.waiting.front()].context_tokens <= res_.capacity_tokens)) {
    const uint32_t next = rep.waiting.front();
    rep.waiting.pop_front();
    StartDecode(rep, next);
  }
  if (f.measured) e2e_.push_back(now_ - f.arrive_s);
  if (o_.record_requests) {
    res_.log.push_back(
        RequestRecord{run.trace, run.session, run.next, f.arrive_s, f.first_token_s, now_});
  }
  const auto& sess = traces_[run.trace].sessions[run.session];
  const auto& q = sess.requests[run.next];
  run.next++;
  free_slots_.push_back(slot);
  if (run.next < sess.requests.size()) {
    const auto& nq = sess.requests[run.next];
    double think = nq.think_s;
    if (think < 0) {
      think = std::max(0.0, nq.start_s - q.start_s - std::max(0.0, q.api_s));
    }
    if (o_.max_idle_s > 0) think = std::min(think, o_.max_idle_s);
    NotifySession(rep, run.sim_id, SessionEvent::kThinking, now_);
    Push(now_ + think, EvType::kArrive, f.run);
  } else {
    NotifySession(rep, run.sim_id, SessionEvent::kFinished, now_);
    Push(now_, EvType::kArrive, f.run);  // ends the session (see OnArrive)
  }
}

void TimedReplay::Summarize() {
  res_.makespan_s = now_;
  LiveChange(now_, 0);
  const double measured_s =
      o_.window_s > 0 ? std::min(now_, window_end_) - window_start_ : res_.makespan_s;
  res_.window_start_s = window_start_;
  res_.measured_s = measured_s;
  res_.live_trees_mean = measured_s > 0 ? live_area_ / measured_s : 0;
  res_.itl_s = WeightedPercentiles(std::move(itl_));
  res_.ideal_hit_rate =
      res_.prompt_tokens ? static_cast<double>(ideal_hits_) / res_.prompt_tokens : 0;
  res_.ttft_s = ComputePercentiles(ttft_);
  res_.tpot_s = ComputePercentiles(tpot_);
  res_.e2e_s = ComputePercentiles(e2e_);
  std::sort(ttft_.begin(), ttft_.end());
  res_.ttft_samples = std::move(ttft_);
  const double gpus = static_cast<double>(o_.replicas) * tp_;
  if (measured_s > 0) {
    res_.input_tokens_per_s_per_gpu = res_.prompt_tokens / measured_s / gpus;
    res_.output_tokens_per_s_per_gpu = res_.output_tokens / measured_s / gpus;
    res_.total_tokens_per_s_per_gpu =
        static_cast<double>(res_.prompt_tokens + res_.output_tokens) / measured_s / gpus;
  }
  auto inv = [](double x) { return x > 0 ? 1.0 / x : 0; };
  res_.interactivity_p50 = inv(res_.itl_s.p50);
  res_.interactivity_p75 = inv(res_.itl_s.p75);
  res_.interactivity = inv(res_.itl_s.p90);
  SummarizeTiers();
  SummarizeOccupancy();
}

void TimedReplay::SummarizeTiers() {
  traffic_[0].capacity_blocks = hbm_blocks_;
  for (const auto& r : reps_) {
    uint64_t peak = 0;  // sum of the ranks' peaks: an upper bound when dp > 1
    for (const auto& k : r.ranks) peak += k->peak();
    traffic_[0].peak_blocks = std::max(traffic_[0].peak_blocks, peak);
  }
  if (o_.host.enabled) {
    traffic_[1].capacity_blocks = reps_[0].host->capacity();
    for (const auto& r : reps_)
      traffic_[1].peak_blocks = std::max(traffic_[1].peak_blocks, r.host->peak());
  }
  if (o_.disk.enabled) {
    traffic_[2].capacity_blocks = reps_[0].disk->capacity();
    for (const auto& r : reps_)
      traffic_[2].peak_blocks = std::max(traffic_[2].peak_blocks, r.disk->peak());
  }
  if (remote_) {
    traffic_[3].capacity_blocks = remote_->capacity();
    traffic_[3].peak_blocks = remote_->peak();
  }
  traffic_[0].load_bytes = 0;
  for (int i = 0; i < 4; ++i) {
    if (TierShown(i)) res_.tiers.push_back(traffic_[i]);
  }
}

void TimedReplay::SummarizeOccupancy() {
  // At most occupancy_samples points, evenly spread over the samples.
  const size_t ns = std::min<size_t>(o_.occupancy_samples, occupancy_.size());
  res_.occupancy_frac.assign(res_.tiers.size(), {});
  for (size_t s = 0; s < ns; ++s) {
    const size_t i = ns == 1 ? 0 : s * (occupancy_.size() - 1) / (ns - 1);
    res_.occupancy_t.push_back(occupancy_[i].first);
    size_t col = 0;
    for (int t = 0; t < 4; ++t) {
      if (TierShown(t)) res_.occupancy_frac[col++].push_back(occupancy_[i].second[t]);
    }
  }
}

}  // namespace timed

Result<TimedResult> ReplayTimed(std::span<const workload::Trace> traces, const GpuProfile& gpu,
                                const ModelProfile& model, const TimedOptions& o) {
  KVTIER_RETURN_IF_ERROR(o.Validate());
  KVTIER_RETURN_IF_ERROR(gpu.Validate());
  KVTIER_RETURN_IF_ERROR(model.Validate());
  if (traces.empty()) return Status::InvalidArgument("no traces to replay");
  timed::TimedReplay replay(traces, gpu, model, o);
  return replay.Simulate();
}

}  // namespace kvtier::sim
