// Timed replay: a discrete-event, closed-loop simulation of agentic sessions against modelled
// hardware (doc/replay.md, "Timed replay").
//
// C session trees (a session and its sub-agents) are live at once; when one finishes the next
// trace starts (the set is recycled, each copy in its own namespace). A request is sent its think
// time after the session's previous request finished; a sub-agent starts at its recorded offset
// after its parent started. Each replica (tp GPUs) has an HBM tier and optionally host DRAM and
// SSD tiers; a remote tier is shared by all replicas. Tiers hold block sizes only (no bytes), each
// with its own eviction policy. The cost model is the library's Planner with the profile
// MakeCostProfile (sim/cost_model.h) derives from the GPU and model profiles:
//   prefill  = the planner's prefill model (dense FLOPs and attention pairs over achieved peak),
//              one prefill at a time per replica
//   load     = the planner's load model: a fixed cost per loading request, plus per tier used
//              latency + bytes / bandwidth, queued on the host link (and the SSD / NIC first)
//   decode   = per step (weights + KV of the running batch) / (HBM bandwidth x efficiency),
//              divided by the speculative acceptance length per token
//   store    = HBM evictions written back to host, host evictions to SSD, every new block written
//              through to remote, priced like loads, on the same devices and link
// and per request the planner chooses what to load and what to recompute (Planner::Choose).
//
// Thread-safety: reentrant (one run per call).
#ifndef KVTIER_SIM_TIMED_REPLAY_H_
#define KVTIER_SIM_TIMED_REPLAY_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kvtier/status.h"
#include "sim/profiles.h"
#include "workload/trace.h"

namespace kvtier::sim {

struct TierSpec {
  bool enabled = false;
  uint64_t capacity_bytes = 0;
  double bandwidth_gbps = 0;  // GB/s (1e9 bytes) for loads; stores use the same figure
  double latency_s = 0;       // per operation
};

struct TimedOptions {
  uint32_t concurrency = 8;  // live session trees
  uint32_t replicas = 1;
  uint32_t tp = 0;            // GPUs per replica; 0 = the fewest that hold the weights
  uint64_t max_requests = 0;  // 0 = one pass over every trace (more when concurrency needs it)
  std::string policy = "lru-tail";  // per tier: lru-tail (built in) or a MakeEvictionPolicy name
  // HBM KV capacity; 0 = the engine's pool of each data-parallel rank (sim/hbm_budget.h), with
  // hbm_kv_fraction as the engine's memory utilization.
  uint64_t hbm_kv_bytes = 0;
  double hbm_kv_fraction = 0.9;
  TierSpec host;  // bandwidth 0 = the GPU host link; capacity 0 = 4x HBM KV (<= 3 TB)
  double host_pool_multiple = 0;  // > 0: host capacity = this x the HBM KV capacity
  TierSpec disk;
  TierSpec remote;       // shared by every replica
  bool planner = true;   // false: always load what is cached (no recompute choice)
  double mfu = 0;        // 0 = the GPU profile's
  std::string kv_dtype;  // KV element type ("bf16", "fp8"); empty = the model profile's
  double spec_acceptance_length = 0;  // tokens per decode step; 0 = the model profile's
  uint32_t occupancy_samples = 64;
  bool record_requests = false;  // fill TimedResult::log
  // Data-parallel attention: each replica's HBM pool split into dp ranks. A session goes to the
  // rank a hash of its id picks (session affinity), or with dp_round_robin each request to the
  // next rank, so a session's context is often on another rank and is recomputed.
  uint32_t dp = 1;
  bool dp_round_robin = false;
  // AgentX replay rules (doc/replay.md): sessions start at a seeded point 25-75% through their
  // recording with that context warmed; think time capped at max_idle_s; metrics only over
  // [warmup_s, warmup_s + window_s), trees recycled until the window ends.
  bool agentx_rules = false;
  uint64_t seed = 1;
  double warmup_s = 0;
  double window_s = 0;    // 0 = no window: measure the whole run
  double max_idle_s = 0;  // 0 = no cap

  Status Validate() const;
};

struct Percentiles {
  double mean = 0, p50 = 0, p75 = 0, p90 = 0, p95 = 0, p99 = 0;
};
Percentiles ComputePercentiles(std::vector<double> values);

struct TierTraffic {
  std::string tier;
  uint64_t load_bytes = 0;   // tier -> HBM
  uint64_t store_bytes = 0;  // HBM (or upper tier) -> tier
  uint64_t capacity_blocks = 0;
  uint64_t peak_blocks = 0;
};

struct RequestRecord {
  uint32_t trace = 0;
  uint32_t session = 0;  // index into Trace::sessions
  uint32_t request = 0;  // index into its session's requests
  double arrive_s = 0, first_token_s = 0, done_s = 0;
};

struct TimedResult {
  std::string gpu, model, policy;
  uint32_t concurrency = 0, replicas = 0, tp = 0, dp = 1;
  bool dp_round_robin = false, agentx_rules = false;
  uint64_t block_bytes = 0;
  uint64_t hbm_kv_bytes = 0;
  uint64_t capacity_tokens = 0;  // HBM KV capacity in tokens
  uint64_t requests = 0;
  uint64_t prompt_tokens = 0, output_tokens = 0;
  // Prompt tokens by where they came from.
  uint64_t hbm_tokens = 0, host_tokens = 0, disk_tokens = 0, remote_tokens = 0, recomputed = 0;
  uint64_t loadable_recomputed = 0;  // cached below HBM but the planner chose to recompute
  double ideal_hit_rate = 0;         // of the same requests, infinite cache
  Percentiles ttft_s, tpot_s, e2e_s;
  Percentiles itl_s;  // inter-token latency, one sample per output token after the first
  std::vector<double> ttft_samples;  // sorted, for the CDF
  double makespan_s = 0;
  double window_start_s = 0;  // metrics cover [window_start_s, window_start_s + measured_s)
  double measured_s = 0;
  double live_trees_mean = 0;  // concurrency as InferenceX counts it: live session trees
  // Per GPU over the measured time; input counts every prompt token, cached ones included.
  double input_tokens_per_s_per_gpu = 0;
  double output_tokens_per_s_per_gpu = 0;
  double total_tokens_per_s_per_gpu = 0;
  // InferenceX interactivity: 1 / percentile(ITL), tokens/s per user. `interactivity` is p90's.
  double interactivity = 0, interactivity_p50 = 0, interactivity_p75 = 0;
  std::vector<TierTraffic> tiers;
  std::vector<double> occupancy_t;                  // sample times
  std::vector<std::vector<double>> occupancy_frac;  // per tier, used / capacity at each sample
  std::vector<RequestRecord> log;                   // with record_requests, in completion order
  double wall_s = 0;
  bool offload = false;  // any tier below HBM enabled

  // Shares of all prompt tokens (InferenceX's HBM hit and DRAM hit).
  double hbm_hit_share() const {
    return prompt_tokens ? static_cast<double>(hbm_tokens) / static_cast<double>(prompt_tokens) : 0;
  }
  double dram_hit_share() const {
    return prompt_tokens ? static_cast<double>(host_tokens) / static_cast<double>(prompt_tokens)
                         : 0;
  }
  double hit_rate() const {
    return prompt_tokens
               ? 1.0 - static_cast<double>(recomputed) / static_cast<double>(prompt_tokens)
               : 0;
  }
};

Result<TimedResult> ReplayTimed(std::span<const workload::Trace> traces, const GpuProfile& gpu,
                                const ModelProfile& model, const TimedOptions& options);

}  // namespace kvtier::sim

#endif  // KVTIER_SIM_TIMED_REPLAY_H_
