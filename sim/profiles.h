// GPU and model profiles: the numbers the timed replay's cost model uses, read from JSON files
// (sim/profiles/gpus/*.json, sim/profiles/models/*.json) so a user can add their own. A profile
// is looked up by name (case-insensitive) in the built-in folder and in --profiles DIR, or given
// as a path to a .json file.
//
// Thread-safety: values; the loaders are reentrant.
#ifndef KVTIER_SIM_PROFILES_H_
#define KVTIER_SIM_PROFILES_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/status.h"

namespace kvtier::sim {

struct GpuProfile {
  std::string name;
  double hbm_gb = 0;                 // HBM capacity, GB (1e9 bytes)
  double hbm_tbps = 0;               // HBM bandwidth, TB/s
  double bf16_tflops = 0;            // dense bf16 peak, TFLOP/s
  double mfu = 0.5;                  // achieved fraction of peak in prefill
  double hbm_efficiency = 0.8;       // achieved fraction of HBM bandwidth in decode
  double host_link_gbps = 50;        // achieved GPU<->host bandwidth, GB/s, one way
  double host_link_latency_us = 10;  // per transfer (coalesced blocks)
  std::string note;                  // where the figures come from

  Status Validate() const;
};

struct ModelProfile {
  std::string name;
  double params_b = 0;         // total parameters, billions (weights in HBM)
  double active_params_b = 0;  // per token (MoE: the active experts)
  double weight_bytes_per_param = 2;
  uint32_t layers = 0;
  uint32_t q_heads = 0;
  uint32_t kv_heads = 0;
  uint32_t head_dim = 0;            // attention head dim (for the attention FLOPs)
  uint64_t kv_bytes_per_token = 0;  // KV across all layers
  std::string attention;            // "gqa", "mha", "mla"
  std::string note;

  Status Validate() const;
  double weight_bytes() const { return params_b * 1e9 * weight_bytes_per_param; }
  // FLOPs to prefill tokens [from, to) of a prompt: 2 x active params per token plus attention
  // 4 x layers x q_heads x head_dim x position.
  double PrefillFlops(uint64_t from, uint64_t to) const;
};

// The folder of built-in profiles (the source tree's sim/profiles, or KVTIER_PROFILES_DIR).
std::string BuiltinProfilesDir();
Result<GpuProfile> LoadGpuProfile(std::string_view name_or_path, std::string_view extra_dir = {});
Result<ModelProfile> LoadModelProfile(std::string_view name_or_path,
                                      std::string_view extra_dir = {});
Result<GpuProfile> ParseGpuProfile(std::string_view json, std::string_view source);
Result<ModelProfile> ParseModelProfile(std::string_view json, std::string_view source);
std::vector<std::string> ProfileNames(std::string_view kind);  // "gpus" or "models"

}  // namespace kvtier::sim

#endif  // KVTIER_SIM_PROFILES_H_
