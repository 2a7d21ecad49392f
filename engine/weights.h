// Weights of a Llama-architecture model in fp32, row-major [out][in] per linear layer (the
// GGUF/PyTorch order: y = x W^T), and a seeded random initialisation.
//
// Thread-safety: a value type; read-only use from many threads is safe.
#ifndef KVTIER_ENGINE_WEIGHTS_H_
#define KVTIER_ENGINE_WEIGHTS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "engine/config.h"
#include "kvtier/status.h"

namespace kvtier::engine {

struct LayerWeights {
  std::vector<float> attn_norm;  // [d]
  std::vector<float> wq;         // [num_heads * head_dim][d]
  std::vector<float> wk;         // [num_kv_heads * head_dim][d]
  std::vector<float> wv;         // [num_kv_heads * head_dim][d]
  std::vector<float> wo;         // [d][num_heads * head_dim]
  std::vector<float> ffn_norm;   // [d]
  std::vector<float> w_gate;     // [ffn][d]
  std::vector<float> w_up;       // [ffn][d]
  std::vector<float> w_down;     // [d][ffn]
};

struct Weights {
  std::vector<float> embedding;  // [vocab][d]
  std::vector<LayerWeights> layers;
  std::vector<float> final_norm;  // [d]
  std::vector<float> output;      // [vocab][d]; empty = tied to the embedding

  const std::vector<float>& output_matrix() const { return output.empty() ? embedding : output; }
  // InvalidArgument naming the first tensor whose size does not match config.
  Status CheckShapes(const ModelConfig& config) const;
};

// Uniform weights in +-1/sqrt(fan_in) from a counter-based generator: the same seed gives the
// same bits on every machine.
Weights RandomWeights(const ModelConfig& config, uint64_t seed);

// The fingerprint of RandomWeights(config, seed) for the namespace root: "seeded-v1:" and 32
// hex digits of an XXH3-128 over the generator's version, the seed and every config field that
// shapes the weights or the KV (not the name). Different weights never share a revision.
std::string RandomWeightsRevision(const ModelConfig& config, uint64_t seed);

}  // namespace kvtier::engine

#endif  // KVTIER_ENGINE_WEIGHTS_H_
