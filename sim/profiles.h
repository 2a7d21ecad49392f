// GPU and model profiles: the numbers the timed replay's cost model uses, read from JSON files
// (sim/profiles/gpus/*.json, sim/profiles/models/*.json) so a user can add their own. A profile
// is looked up by name (case-insensitive) in the built-in folder and in --profiles DIR, or given
// as a path to a .json file.
//
// Thread-safety: values; the loaders are reentrant.
#ifndef KVTIER_SIM_PROFILES_H_
#define KVTIER_SIM_PROFILES_H_

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/status.h"
#include "sim/kv_layout.h"

namespace kvtier::sim {

struct GpuProfile {
  std::string name;
  double hbm_gb = 0;                 // HBM capacity, GB (1e9 bytes)
  double hbm_tbps = 0;               // HBM bandwidth, TB/s
  double bf16_tflops = 0;            // dense bf16 peak, TFLOP/s
  double mfu = 0.5;                  // achieved fraction of peak in prefill's dense layers
  double attention_mfu = 0;          // the same for attention FLOPs; 0 = mfu
  double hbm_efficiency = 0.8;       // achieved fraction of HBM bandwidth in decode
  double host_link_gbps = 50;        // achieved GPU<->host bandwidth, GB/s, one way
  double host_link_latency_us = 10;  // per transfer operation (one batch of blocks per tier)
  double load_fixed_ms = 0;          // per request that loads anything (the connector's cost)
  std::string note;                  // where the figures come from
  std::map<std::string, std::string> sources;  // field -> where its value comes from

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
  uint32_t v_head_dim = 0;          // value head dim; 0 = head_dim (MLA models differ)
  uint64_t kv_bytes_per_token = 0;  // KV per cached token across all layers, at kv_dtype
  std::string kv_dtype = "bf16";    // element type kv_bytes_per_token is stated in
  // The KV by layer group ("kv_layout"); a one-number profile is one full-attention group of
  // kv_bytes_per_token, and then kv_bytes_per_token is what the layout charges per cached token.
  KvGroupLayout kv_layout;
  // Weights as loaded, split so parallelism can shard them: routed experts (sharded over every
  // GPU of a replica under expert parallelism) and the rest (replicated per data-parallel rank).
  // expert_params_b 0 = no split: params_b x weight_bytes_per_param, sharded over tp.
  double expert_params_b = 0;
  double expert_bytes_per_param = 0;
  double dense_bytes_per_param = 0;
  std::string attention;              // "gqa", "mha", "mla", "csa" (compressed sparse)
  uint32_t attention_topk = 0;        // > 0: a query attends to at most this many tokens
  double spec_acceptance_length = 1;  // mean tokens per decode step (speculative decoding)
  std::string note;
  std::map<std::string, std::string> sources;  // field -> where its value comes from

  Status Validate() const;
  // All weights of one replica as loaded.
  double weight_bytes() const;
  // Routed-expert and other weights, bytes (expert_bytes() is 0 without the split).
  double expert_bytes() const;
  double dense_bytes() const;
  // KV bytes per cached token stored as `dtype` ("bf16", "fp16", "fp8"; empty = kv_dtype), or 0
  // for an unknown dtype: the layout's KvBytesPerCachedToken, rounded.
  uint64_t KvBytesPerToken(std::string_view dtype = {}) const;
  // Attention FLOPs per (query, key) pair: 2 x layers x q_heads x (head_dim + v_head_dim).
  double AttentionFlopsPerPair() const;
  // FLOPs to prefill tokens [from, to) of a prompt: 2 x active params per token plus attention
  // FLOPs per pair x position (uncapped).
  double PrefillFlops(uint64_t from, uint64_t to) const;
};

// Bytes per KV element of a dtype name ("bf16", "fp16": 2; "fp8": 1), or 0 if unknown.
double KvDtypeBytes(std::string_view dtype);

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
