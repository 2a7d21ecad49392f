// The HBM an engine leaves for KV on one data-parallel rank, term by term, from a GPU profile and
// a model profile (doc/replay.md, "HBM pool"):
//
//   usable     = HBM x memory_utilization                       per GPU
//   weights    = routed experts / tp + other weights / (tp / dp)   per GPU (experts sharded over
//                every GPU of the replica, the rest replicated on each data-parallel rank)
//   kv per GPU = usable - weights - reserve
//   kv         = kv per GPU x GPUs per rank (x 1 when the layout is replicated across TP)
//   fixed      = running requests x the layout's bytes per running request
//   tokens     = (kv - fixed) / the layout's bytes per cached token
//
// A profile without the expert split shards all its weights over tp, which keeps the one-number
// profiles' pool what it was (memory_utilization x tp x HBM - weights per replica).
//
// Thread-safety: functions of values; reentrant.
#ifndef KVTIER_SIM_HBM_BUDGET_H_
#define KVTIER_SIM_HBM_BUDGET_H_

#include <cstdint>
#include <string>

#include "kvtier/status.h"
#include "sim/profiles.h"

namespace kvtier::sim {

struct ServingOptions {
  uint32_t tp = 1;  // GPUs of one replica
  uint32_t dp = 1;  // data-parallel attention ranks of a replica, tp / dp GPUs each
  // The engine's share of HBM for weights and KV (vLLM gpu_memory_utilization, SGLang
  // mem_fraction_static); the rest holds activations and graphs.
  double memory_utilization = 0.9;
  double reserve_gb = 0;          // per GPU, set aside beyond (1 - memory_utilization)
  uint32_t running_per_rank = 0;  // requests a rank runs at once (their per-request KV)
  std::string kv_dtype;           // empty = the model's

  Status Validate() const;
};

struct HbmBudget {
  uint32_t gpus_per_rank = 1;
  double gpu_bytes = 0;      // one GPU's HBM
  double usable_bytes = 0;   // per GPU, x memory_utilization
  double expert_bytes = 0;   // routed experts per GPU
  double dense_bytes = 0;    // the other weights per GPU
  double reserve_bytes = 0;  // per GPU
  double kv_gpu_bytes = 0;   // per GPU: usable - weights - reserve (negative: does not fit)
  double kv_bytes = 0;       // per rank
  double per_request_bytes = 0;
  uint32_t running = 0;
  double fixed_bytes = 0;  // running x per_request_bytes
  double token_bytes = 0;  // per cached token
  uint64_t tokens = 0;     // per rank; 0 when nothing is left
  double pool_bytes = 0;   // tokens x token_bytes

  double weight_bytes() const { return expert_bytes + dense_bytes; }
};

// InvalidArgument for bad options (tp not a multiple of dp, utilization outside (0, 1]) or an
// unknown KV dtype. A model that leaves nothing is not an error: tokens is 0.
Result<HbmBudget> ComputeHbmBudget(const GpuProfile& gpu, const ModelProfile& model,
                                   const ServingOptions& options);

}  // namespace kvtier::sim

#endif  // KVTIER_SIM_HBM_BUDGET_H_
