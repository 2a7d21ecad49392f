#include "engine/weights.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

#include "hash/xxh.h"

namespace kvtier::engine {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Fills v[i] with a uniform value in [-scale, scale) derived only from (seed, stream, i).
void FillUniform(std::vector<float>* v, size_t n, uint64_t seed, uint64_t stream, float scale) {
  v->resize(n);
  const uint64_t base = SplitMix64(seed ^ SplitMix64(stream));
  for (size_t i = 0; i < n; ++i) {
    const uint64_t r = SplitMix64(base + i);
    const float u = static_cast<float>(r >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    (*v)[i] = (2.0f * u - 1.0f) * scale;
  }
}

Status CheckSize(const std::vector<float>& v, size_t want, const std::string& name) {
  if (v.size() != want) {
    return Status::InvalidArgument("tensor " + name + ": has " + std::to_string(v.size()) +
                                   " values, model config needs " + std::to_string(want));
  }
  return Status::Ok();
}

}  // namespace

Status Weights::CheckShapes(const ModelConfig& c) const {
  const size_t d = c.d_model, q = size_t{c.num_heads} * c.head_dim(),
               kv = size_t{c.num_kv_heads} * c.head_dim(), f = c.ffn_dim, vocab = c.vocab_size;
  KVTIER_RETURN_IF_ERROR(CheckSize(embedding, vocab * d, "token_embd"));
  if (layers.size() != c.num_layers) {
    return Status::InvalidArgument("weights have " + std::to_string(layers.size()) +
                                   " layers, model config needs " + std::to_string(c.num_layers));
  }
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerWeights& l = layers[i];
    const std::string p = "blk." + std::to_string(i) + ".";
    KVTIER_RETURN_IF_ERROR(CheckSize(l.attn_norm, d, p + "attn_norm"));
    KVTIER_RETURN_IF_ERROR(CheckSize(l.wq, q * d, p + "attn_q"));
    KVTIER_RETURN_IF_ERROR(CheckSize(l.wk, kv * d, p + "attn_k"));
    KVTIER_RETURN_IF_ERROR(CheckSize(l.wv, kv * d, p + "attn_v"));
    KVTIER_RETURN_IF_ERROR(CheckSize(l.wo, d * q, p + "attn_output"));
    KVTIER_RETURN_IF_ERROR(CheckSize(l.ffn_norm, d, p + "ffn_norm"));
    KVTIER_RETURN_IF_ERROR(CheckSize(l.w_gate, f * d, p + "ffn_gate"));
    KVTIER_RETURN_IF_ERROR(CheckSize(l.w_up, f * d, p + "ffn_up"));
    KVTIER_RETURN_IF_ERROR(CheckSize(l.w_down, d * f, p + "ffn_down"));
  }
  KVTIER_RETURN_IF_ERROR(CheckSize(final_norm, d, "output_norm"));
  if (!output.empty()) KVTIER_RETURN_IF_ERROR(CheckSize(output, vocab * d, "output"));
  return Status::Ok();
}

Weights RandomWeights(const ModelConfig& c, uint64_t seed) {
  const size_t d = c.d_model, q = size_t{c.num_heads} * c.head_dim(),
               kv = size_t{c.num_kv_heads} * c.head_dim(), f = c.ffn_dim;
  const float sd = 1.0f / std::sqrt(static_cast<float>(d));
  const float sf = 1.0f / std::sqrt(static_cast<float>(f));
  Weights w;
  uint64_t stream = 0;
  FillUniform(&w.embedding, size_t{c.vocab_size} * d, seed, stream++, 1.0f);
  w.layers.resize(c.num_layers);
  for (LayerWeights& l : w.layers) {
    l.attn_norm.assign(d, 1.0f);
    l.ffn_norm.assign(d, 1.0f);
    FillUniform(&l.wq, q * d, seed, stream++, sd);
    FillUniform(&l.wk, kv * d, seed, stream++, sd);
    FillUniform(&l.wv, kv * d, seed, stream++, sd);
    FillUniform(&l.wo, d * q, seed, stream++, sd);
    FillUniform(&l.w_gate, f * d, seed, stream++, sd);
    FillUniform(&l.w_up, f * d, seed, stream++, sd);
    FillUniform(&l.w_down, d * f, seed, stream++, sf);
  }
  w.final_norm.assign(d, 1.0f);
  FillUniform(&w.output, size_t{c.vocab_size} * d, seed, stream++, sd);
  return w;
}

std::string RandomWeightsRevision(const ModelConfig& c, uint64_t seed) {
  // Bump the tag whenever RandomWeights draws different numbers for the same inputs.
  std::string buf = "kvtier-random-weights-v1";
  auto put = [&buf](uint64_t v) {
    for (int i = 0; i < 8; ++i) buf.push_back(static_cast<char>(v >> (8 * i)));
  };
  auto bits = [](float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof(u));
    return u;
  };
  for (uint64_t v :
       {seed, uint64_t{c.vocab_size}, uint64_t{c.num_layers}, uint64_t{c.d_model},
        uint64_t{c.num_heads}, uint64_t{c.num_kv_heads}, uint64_t{c.ffn_dim},
        uint64_t{bits(c.rope_theta)}, uint64_t{bits(c.norm_eps)}, uint64_t{c.max_positions}}) {
    put(v);
  }
  const XXH128_hash_t h = XXH3_128bits(buf.data(), buf.size());
  char hex[33];
  std::snprintf(hex, sizeof(hex), "%016llx%016llx", static_cast<unsigned long long>(h.high64),
                static_cast<unsigned long long>(h.low64));
  return std::string("seeded-v1:") + hex;
}

}  // namespace kvtier::engine
