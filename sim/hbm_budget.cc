#include "sim/hbm_budget.h"

#include <cmath>

namespace kvtier::sim {

Status ServingOptions::Validate() const {
  if (tp == 0 || dp == 0 || tp % dp != 0) {
    return Status::InvalidArgument("serving: tp must be a multiple of dp (both >= 1)");
  }
  if (!(memory_utilization > 0 && memory_utilization <= 1)) {
    return Status::InvalidArgument("serving: memory utilization must be in (0, 1]");
  }
  if (!(reserve_gb >= 0)) return Status::InvalidArgument("serving: reserve must be >= 0");
  return Status::Ok();
}

Result<HbmBudget> ComputeHbmBudget(const GpuProfile& gpu, const ModelProfile& model,
                                   const ServingOptions& o) {
  KVTIER_RETURN_IF_ERROR(o.Validate());
  if (!o.kv_dtype.empty() && model.KvBytesPerToken(o.kv_dtype) == 0) {
    return Status::InvalidArgument("unknown KV dtype '" + o.kv_dtype + "' (bf16, fp16, fp8)");
  }
  const KvGroupLayout layout =
      model.kv_layout.groups.empty()
          ? SingleGroupLayout(static_cast<double>(model.kv_bytes_per_token), model.kv_dtype)
          : model.kv_layout;
  HbmBudget b;
  b.gpus_per_rank = o.tp / o.dp;
  b.gpu_bytes = gpu.hbm_gb * 1e9;
  b.usable_bytes = b.gpu_bytes * o.memory_utilization;
  b.expert_bytes = model.expert_bytes() / o.tp;
  // Without the split every weight is sharded over the replica (the one-number profiles' rule).
  b.dense_bytes = model.expert_params_b > 0 ? model.dense_bytes() / b.gpus_per_rank
                                            : model.dense_bytes() / o.tp;
  b.reserve_bytes = o.reserve_gb * 1e9;
  b.kv_gpu_bytes = b.usable_bytes - b.weight_bytes() - b.reserve_bytes;
  b.kv_bytes = b.kv_gpu_bytes * (layout.replicated_across_tp ? 1 : b.gpus_per_rank);
  b.per_request_bytes = KvBytesPerRunningRequest(layout, o.kv_dtype);
  b.running = o.running_per_rank;
  b.fixed_bytes = b.per_request_bytes * b.running;
  b.token_bytes = KvBytesPerCachedToken(layout, o.kv_dtype);
  const double left = b.kv_bytes - b.fixed_bytes;
  if (left > 0 && b.token_bytes > 0) {
    b.tokens = static_cast<uint64_t>(std::floor(left / b.token_bytes));
  }
  b.pool_bytes = static_cast<double>(b.tokens) * b.token_bytes;
  return b;
}

}  // namespace kvtier::sim
