// ModelConfig: the shape of a Llama-architecture transformer (embedding, RMSNorm, RoPE, GQA
// attention with a causal mask, SwiGLU MLP), and the presets the reference engine ships with.
//
// Thread-safety: a value type.
#ifndef KVTIER_ENGINE_CONFIG_H_
#define KVTIER_ENGINE_CONFIG_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/layout.h"
#include "kvtier/status.h"

namespace kvtier::engine {

struct ModelConfig {
  std::string name = "custom";
  uint32_t vocab_size = 0;
  uint32_t num_layers = 0;
  uint32_t d_model = 0;
  uint32_t num_heads = 0;     // query heads
  uint32_t num_kv_heads = 0;  // K/V heads (GQA: num_heads is a multiple of it)
  uint32_t ffn_dim = 0;       // SwiGLU hidden width
  float rope_theta = 10000.0f;
  float norm_eps = 1e-5f;
  uint32_t max_positions = 32768;

  uint32_t head_dim() const { return num_heads ? d_model / num_heads : 0; }
  uint32_t group_size() const { return num_kv_heads ? num_heads / num_kv_heads : 0; }
  // Weights of the transformer, embedding and output head included.
  uint64_t num_params() const;
  // Multiply-adds x2 of the dense layers for one token (what sgemm does per prompt token).
  double dense_flops_per_token() const;

  // OK, or InvalidArgument naming the field.
  Status Validate() const;
  // The KV layout of this model in the engine's pool: fp32, K then V per layer.
  KvLayout Layout(uint32_t block_tokens) const;
  // "small: 12L d=768 12q/4kv heads ffn=2048 vocab=4096 (78.6M params)"
  std::string ToString() const;
};

// "tiny" (4 layers, d=256, for tests) and "small" (12 layers, d=768, 12 query / 4 KV heads, for
// demos and measurements). NotFound lists the known names.
Result<ModelConfig> ModelPreset(std::string_view name);
std::vector<std::string> ModelPresetNames();

}  // namespace kvtier::engine

#endif  // KVTIER_ENGINE_CONFIG_H_
