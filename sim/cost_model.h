// The cost model of the timed replay and of `kvtier plan`: the library's Planner, with a
// CostProfile derived from a GPU profile and a model profile (doc/replay.md, "Cost model").
//
//   prefill(t, context) = t x 2 x active params / (tp x peak x mfu)
//                         + pairs(t, context) x attention FLOPs per pair / (tp x peak x
//                         attention_mfu)
//   load(request)       = load_fixed (once) + per tier: latency + bytes / bandwidth
//
// with pairs() capped by the model's attention_topk. Host loads cross the GPU's host link; SSD and
// remote loads are limited by the slower of their device and that link and pay both latencies.
//
// Thread-safety: functions of values; reentrant.
#ifndef KVTIER_SIM_COST_MODEL_H_
#define KVTIER_SIM_COST_MODEL_H_

#include <cstdint>
#include <string>

#include "kvtier/planner.h"
#include "kvtier/status.h"
#include "sim/profiles.h"

namespace kvtier::sim {

struct CostModelOptions {
  uint32_t tp = 1;  // GPUs of one replica: compute and host links scale with it
  uint32_t block_tokens = 64;
  double mfu = 0;        // > 0: overrides the GPU's mfu (and attention_mfu) for prefill
  std::string kv_dtype;  // "bf16", "fp8"; empty = the model profile's
  bool host = true;
  double host_gbps = 0;        // 0 = the GPU's host link (per GPU, times tp)
  double host_latency_s = -1;  // < 0 = the GPU's host_link_latency_us
  bool disk = false;
  double disk_gbps = 6, disk_latency_s = 100e-6;
  bool remote = false;
  double remote_gbps = 25, remote_latency_s = 200e-6;
};

// GPUs per replica when none is given: the fewest (a power of two, <= 64) whose HBM holds the
// weights in 60% of it.
uint32_t DefaultTp(const GpuProfile& gpu, const ModelProfile& model);

// The planner profile for `model` on `gpu`, tiers named "host", "disk", "remote" (those
// enabled, in that order). InvalidArgument for a bad profile, dtype or option.
Result<CostProfile> MakeCostProfile(const GpuProfile& gpu, const ModelProfile& model,
                                    const CostModelOptions& options);

// TTFT of one request of `tokens` prompt tokens with nothing cached (recompute) or with every
// loadable block in `tier` (all but the block holding the last token), as the planner prices them.
double RecomputeSeconds(const Planner& planner, uint64_t tokens);
double LoadSeconds(const Planner& planner, int tier, uint64_t tokens);
// The prompt length below which recomputing beats loading everything from `tier`: the smallest
// length (to a token) at which loading is cheaper, found by doubling then bisection. 0 when
// loading does not win up to max_tokens.
uint64_t CrossoverTokens(const Planner& planner, int tier, uint64_t max_tokens = 1u << 22);

}  // namespace kvtier::sim

#endif  // KVTIER_SIM_COST_MODEL_H_
