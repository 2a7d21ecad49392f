#include "sim/cost_model.h"

#include <algorithm>

namespace kvtier::sim {

uint32_t DefaultTp(const GpuProfile& gpu, const ModelProfile& model) {
  uint32_t tp = 1;
  while (model.weight_bytes() > 0.6 * tp * gpu.hbm_gb * 1e9 && tp < 64) tp *= 2;
  return tp;
}

Result<CostProfile> MakeCostProfile(const GpuProfile& gpu, const ModelProfile& model,
                                    const CostModelOptions& o) {
  KVTIER_RETURN_IF_ERROR(gpu.Validate());
  KVTIER_RETURN_IF_ERROR(model.Validate());
  if (o.tp == 0 || o.block_tokens == 0) {
    return Status::InvalidArgument("cost model: tp and block_tokens must be >= 1");
  }
  if (!(o.mfu >= 0 && o.mfu <= 1)) return Status::InvalidArgument("cost model: mfu in [0, 1]");
  const uint64_t kv = model.KvBytesPerToken(o.kv_dtype);
  if (kv == 0) {
    return Status::InvalidArgument("cost model: unknown KV dtype '" + o.kv_dtype +
                                   "' (bf16, fp16, fp8)");
  }
  CostProfile p;
  p.machine = std::to_string(o.tp) + " x " + gpu.name;
  p.model = model.name;
  p.block_tokens = o.block_tokens;
  p.block_bytes = kv * o.block_tokens;
  const double peak = gpu.bf16_tflops * 1e12 * o.tp;
  const double mfu = o.mfu > 0 ? o.mfu : gpu.mfu;
  const double attn_mfu = o.mfu > 0 ? o.mfu : (gpu.attention_mfu > 0 ? gpu.attention_mfu : gpu.mfu);
  p.prefill.fixed_s = 0;
  p.prefill.per_token_s = 2.0 * model.active_params_b * 1e9 / (peak * mfu);
  p.prefill.per_token_context_s = model.AttentionFlopsPerPair() / (peak * attn_mfu);
  p.prefill.context_cap_tokens = model.attention_topk;
  p.load_fixed_s = gpu.load_fixed_ms * 1e-3;
  const double link = (o.host_gbps > 0 ? o.host_gbps : gpu.host_link_gbps * o.tp) * 1e9;
  const double link_lat =
      o.host_latency_s >= 0 ? o.host_latency_s : gpu.host_link_latency_us * 1e-6;
  if (o.host) p.tiers.push_back({"host", link_lat, link});
  if (o.disk) {
    if (!(o.disk_gbps > 0)) return Status::InvalidArgument("cost model: disk needs a bandwidth");
    p.tiers.push_back({"disk", o.disk_latency_s + link_lat, std::min(o.disk_gbps * 1e9, link)});
  }
  if (o.remote) {
    if (!(o.remote_gbps > 0))
      return Status::InvalidArgument("cost model: remote needs a bandwidth");
    p.tiers.push_back(
        {"remote", o.remote_latency_s + link_lat, std::min(o.remote_gbps * 1e9, link)});
  }
  KVTIER_RETURN_IF_ERROR(p.Validate());
  return p;
}

double RecomputeSeconds(const Planner& planner, uint64_t tokens) {
  return planner.RecomputeAllSeconds(tokens);
}

double LoadSeconds(const Planner& planner, int tier, uint64_t tokens) {
  return planner.LoadAllSeconds(tier, tokens);
}

uint64_t CrossoverTokens(const Planner& planner, int tier, uint64_t max_tokens) {
  return planner.CrossoverTokens(tier, max_tokens);
}

}  // namespace kvtier::sim
