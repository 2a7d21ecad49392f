#include "engine/model.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

#include "engine/blas.h"

namespace kvtier::engine {
namespace {

// y[n][out] = x[n][in] * W[out][in]^T
void Linear(const float* x, uint32_t n, uint32_t in, const std::vector<float>& w, uint32_t out,
            float* y, uint32_t ldy) {
  blas::Sgemm(/*trans_b=*/true, static_cast<int>(n), static_cast<int>(out), static_cast<int>(in),
              1.0f, x, static_cast<int>(in), w.data(), static_cast<int>(in), 0.0f, y,
              static_cast<int>(ldy));
}

void RmsNorm(const float* x, uint32_t n, uint32_t d, const std::vector<float>& w, float eps,
             float* y) {
  for (uint32_t t = 0; t < n; ++t) {
    const float* xr = x + size_t{t} * d;
    float* yr = y + size_t{t} * d;
    float ss = 0.0f;
    for (uint32_t i = 0; i < d; ++i) ss += xr[i] * xr[i];
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(d) + eps);
    for (uint32_t i = 0; i < d; ++i) yr[i] = xr[i] * inv * w[i];
  }
}

// e^x for x <= 0 (softmax after subtracting the row max), within ~2 ulp. Branch-free so the
// loops below vectorize; the same code runs in every forward pass, so results stay bit-exact.
inline float ExpNonPositive(float x) {
  x = x < -87.0f ? -87.0f : x;
  const float t = x * 1.44269504088896341f;         // x / ln 2
  const float k = (t + 12582912.0f) - 12582912.0f;  // round to nearest (|t| < 2^22)
  const float f = t - k;                            // [-0.5, 0.5]
  float p = 1.540353039e-4f;                        // 2^f: Taylor series of e^(f ln 2)
  p = p * f + 1.333355815e-3f;
  p = p * f + 9.618129108e-3f;
  p = p * f + 5.550410866e-2f;
  p = p * f + 2.402265070e-1f;
  p = p * f + 6.931471806e-1f;
  p = p * f + 1.0f;
  const int32_t bits = (static_cast<int32_t>(k) + 127) << 23;  // 2^k, k in [-126, 0]
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

// row[0, valid) <- exp(row - max), row[valid, ctx) <- 0; returns 1 / sum (applied to the P*V
// output rows instead of to every probability: one pass less). Reductions run in fixed lanes,
// so the same inputs always give the same bits.
float SoftmaxRowUnnormalized(float* row, uint32_t valid, uint32_t ctx) {
  uint32_t i = 0;
  float mx = -std::numeric_limits<float>::infinity();
#if defined(__SSE2__)
  __m128 m4 = _mm_set1_ps(mx);
  for (; i + 4 <= valid; i += 4) m4 = _mm_max_ps(m4, _mm_loadu_ps(row + i));
  float lanes[4];
  _mm_storeu_ps(lanes, m4);
  mx = std::max(std::max(lanes[0], lanes[1]), std::max(lanes[2], lanes[3]));
#endif
  for (; i < valid; ++i) mx = row[i] > mx ? row[i] : mx;
  for (i = 0; i < valid; ++i) row[i] = ExpNonPositive(row[i] - mx);
  float s8[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (i = 0; i + 8 <= valid; i += 8) {
    for (int j = 0; j < 8; ++j) s8[j] += row[i + j];
  }
  float sum = ((s8[0] + s8[1]) + (s8[2] + s8[3])) + ((s8[4] + s8[5]) + (s8[6] + s8[7]));
  for (; i < valid; ++i) sum += row[i];
  for (i = valid; i < ctx; ++i) row[i] = 0.0f;
  return 1.0f / sum;
}

}  // namespace

void SetBlasThreads(int threads) { blas::SetThreads(std::max(1, threads)); }
int BlasThreads() { return blas::Threads(); }

Model::Model(ModelConfig config, std::shared_ptr<const Weights> weights)
    : config_(std::move(config)), weights_(std::move(weights)) {
  const uint32_t hd = config_.head_dim();
  inv_freq_.resize(hd / 2);
  for (uint32_t i = 0; i < hd / 2; ++i) {
    inv_freq_[i] = static_cast<float>(
        std::pow(static_cast<double>(config_.rope_theta), -2.0 * i / static_cast<double>(hd)));
  }
}

Result<Model> Model::Create(ModelConfig config, std::shared_ptr<const Weights> weights) {
  KVTIER_RETURN_IF_ERROR(config.Validate());
  if (weights == nullptr) return Status::InvalidArgument("model: no weights");
  KVTIER_RETURN_IF_ERROR(weights->CheckShapes(config));
  return Model(std::move(config), std::move(weights));
}

Status Model::CheckChunk(std::span<const TokenId> tokens, uint32_t pos,
                         std::span<const BlockId> table, const KvPool& pool) const {
  const ModelConfig& c = config_;
  const uint32_t n = static_cast<uint32_t>(tokens.size());
  const uint32_t bt = pool.layout().block_tokens;
  if (pool.layout() != c.Layout(bt)) {
    return Status::InvalidArgument("forward: pool layout " + pool.layout().ToString() +
                                   " does not fit model " + c.name);
  }
  if (n == 0) return Status::InvalidArgument("forward: empty chunk");
  if (pos / bt != (pos + n - 1) / bt) {
    return Status::InvalidArgument("forward: chunk [" + std::to_string(pos) + ", " +
                                   std::to_string(pos + n) + ") spans two blocks");
  }
  if (pos + n > c.max_positions) {
    return Status::InvalidArgument("forward: position " + std::to_string(pos + n) +
                                   " is past max_positions " + std::to_string(c.max_positions));
  }
  if (table.size() <= pos / bt) {
    return Status::InvalidArgument("forward: block table has " + std::to_string(table.size()) +
                                   " blocks, position " + std::to_string(pos) + " needs " +
                                   std::to_string(pos / bt + 1));
  }
  for (TokenId t : tokens) {
    if (t >= c.vocab_size) {
      return Status::InvalidArgument("forward: token " + std::to_string(t) +
                                     " is outside the vocabulary of " +
                                     std::to_string(c.vocab_size));
    }
  }
  return Status::Ok();
}

void Model::BeginChunk(std::span<const TokenId> tokens, uint32_t pos, ChunkState* s) const {
  const uint32_t n = static_cast<uint32_t>(tokens.size());
  const uint32_t d = config_.d_model, half = config_.head_dim() / 2;
  s->pos = pos;
  s->n = n;
  s->x.resize(size_t{n} * d);
  for (uint32_t t = 0; t < n; ++t) {
    std::memcpy(&s->x[size_t{t} * d], &weights_->embedding[size_t{tokens[t]} * d],
                d * sizeof(float));
  }
  // RoPE (adjacent pairs, the GGUF "llama" convention) for the chunk's positions.
  s->cos.resize(size_t{n} * half);
  s->sin.resize(size_t{n} * half);
  for (uint32_t t = 0; t < n; ++t) {
    for (uint32_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(pos + t) * static_cast<double>(inv_freq_[i]);
      s->cos[size_t{t} * half + i] = static_cast<float>(std::cos(angle));
      s->sin[size_t{t} * half + i] = static_cast<float>(std::sin(angle));
    }
  }
}

void Model::Rope(const ChunkState& s, float* rows, uint32_t heads, uint32_t stride) const {
  const uint32_t hd = config_.head_dim(), half = hd / 2;
  for (uint32_t t = 0; t < s.n; ++t) {
    for (uint32_t hh = 0; hh < heads; ++hh) {
      float* v = rows + size_t{t} * stride + size_t{hh} * hd;
      for (uint32_t i = 0; i < half; ++i) {
        const float c0 = s.cos[size_t{t} * half + i], s0 = s.sin[size_t{t} * half + i];
        const float a = v[2 * i], b = v[2 * i + 1];
        v[2 * i] = a * c0 - b * s0;
        v[2 * i + 1] = a * s0 + b * c0;
      }
    }
  }
}

void Model::Layer(uint32_t l, ChunkState* s, std::span<const BlockId> table, KvPool* pool) {
  const ModelConfig& c = config_;
  const uint32_t n = s->n, pos = s->pos, bt = pool->layout().block_tokens;
  const uint32_t d = c.d_model, hd = c.head_dim(), qdim = c.num_heads * hd,
                 kvdim = c.num_kv_heads * hd, f = c.ffn_dim;
  h_.resize(size_t{n} * d);
  q_.resize(size_t{n} * qdim);
  attn_.resize(size_t{n} * qdim);
  tmp_.resize(size_t{n} * d);
  gate_.resize(size_t{n} * f);
  up_.resize(size_t{n} * f);
  std::vector<float>& x = s->x;
  const BlockId cur = table[pos / bt];
  const uint32_t off = pos % bt;
  const LayerWeights& w = weights_->layers[l];
  RmsNorm(x.data(), n, d, w.attn_norm, c.norm_eps, h_.data());
  Linear(h_.data(), n, d, w.wq, qdim, q_.data(), qdim);
  float* k_rows = pool->K(cur, l) + size_t{off} * kvdim;
  float* v_rows = pool->V(cur, l) + size_t{off} * kvdim;
  Linear(h_.data(), n, d, w.wk, kvdim, k_rows, kvdim);
  Linear(h_.data(), n, d, w.wv, kvdim, v_rows, kvdim);
  Rope(*s, q_.data(), c.num_heads, qdim);
  Rope(*s, k_rows, c.num_kv_heads, kvdim);
  Attention(l, pos, n, table, pool);
  Linear(attn_.data(), n, qdim, w.wo, d, tmp_.data(), d);
  for (size_t i = 0; i < x.size(); ++i) x[i] += tmp_[i];

  RmsNorm(x.data(), n, d, w.ffn_norm, c.norm_eps, h_.data());
  Linear(h_.data(), n, d, w.w_gate, f, gate_.data(), f);
  Linear(h_.data(), n, d, w.w_up, f, up_.data(), f);
  for (size_t i = 0; i < gate_.size(); ++i) {
    const float g = gate_[i];
    gate_[i] = g / (1.0f + std::exp(-g)) * up_[i];
  }
  Linear(gate_.data(), n, f, w.w_down, d, tmp_.data(), d);
  for (size_t i = 0; i < x.size(); ++i) x[i] += tmp_[i];
}

void Model::Logits(const ChunkState& s, std::vector<float>* logits) {
  const ModelConfig& c = config_;
  const uint32_t d = c.d_model;
  h_.resize(d);
  RmsNorm(&s.x[size_t{s.n - 1} * d], 1, d, weights_->final_norm, c.norm_eps, h_.data());
  logits->resize(c.vocab_size);
  blas::Sgemv(static_cast<int>(c.vocab_size), static_cast<int>(d), 1.0f,
              weights_->output_matrix().data(), static_cast<int>(d), h_.data(), 1, 0.0f,
              logits->data(), 1);
}

Status Model::ForwardChunk(std::span<const TokenId> tokens, uint32_t pos,
                           std::span<const BlockId> table, KvPool* pool,
                           std::vector<float>* logits) {
  KVTIER_RETURN_IF_ERROR(CheckChunk(tokens, pos, table, *pool));
  BeginChunk(tokens, pos, &chunk_);
  for (uint32_t l = 0; l < config_.num_layers; ++l) Layer(l, &chunk_, table, pool);
  if (logits != nullptr) Logits(chunk_, logits);
  return Status::Ok();
}

Status Model::ForwardLayerwise(std::span<const TokenId> prompt, std::span<const Chunk> chunks,
                               std::span<const BlockId> table, KvPool* pool,
                               std::vector<float>* logits, const LayerGate& before_layer) {
  if (chunks.empty()) return Status::InvalidArgument("forward: no chunks");
  for (const Chunk& ch : chunks) {
    if (uint64_t{ch.pos} + ch.n > prompt.size()) {
      return Status::InvalidArgument("forward: chunk [" + std::to_string(ch.pos) + ", +" +
                                     std::to_string(ch.n) + ") passes the prompt's " +
                                     std::to_string(prompt.size()) + " tokens");
    }
    KVTIER_RETURN_IF_ERROR(CheckChunk(prompt.subspan(ch.pos, ch.n), ch.pos, table, *pool));
  }
  std::vector<ChunkState>& states = layerwise_;
  states.resize(chunks.size());
  for (size_t i = 0; i < chunks.size(); ++i) {
    BeginChunk(prompt.subspan(chunks[i].pos, chunks[i].n), chunks[i].pos, &states[i]);
  }
  for (uint32_t l = 0; l < config_.num_layers; ++l) {
    if (before_layer) KVTIER_RETURN_IF_ERROR(before_layer(l));
    for (ChunkState& s : states) Layer(l, &s, table, pool);
  }
  if (logits != nullptr) Logits(states.back(), logits);
  return Status::Ok();
}

// Causal GQA attention of the chunk's queries over KV blocks 0 .. pos / bt. The query heads of
// one KV group are stacked (M = group * n rows); every shape depends only on (pos, n).
void Model::Attention(uint32_t layer, uint32_t pos, uint32_t n, std::span<const BlockId> table,
                      KvPool* pool) {
  const ModelConfig& c = config_;
  const uint32_t hd = c.head_dim(), qdim = c.num_heads * hd, kvdim = c.num_kv_heads * hd;
  const uint32_t group = c.group_size(), m = group * n;
  const uint32_t bt = pool->layout().block_tokens;
  const uint32_t ctx = pos + n;
  const uint32_t nblk = (ctx - 1) / bt + 1;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  qg_.resize(size_t{m} * hd);
  outg_.resize(size_t{m} * hd);
  scores_.resize(size_t{m} * ctx);
  kc_.resize(size_t{ctx} * hd);
  inv_sum_.resize(m);
  vc_.resize(size_t{ctx} * hd);

  for (uint32_t g = 0; g < c.num_kv_heads; ++g) {
    for (uint32_t gi = 0; gi < group; ++gi) {
      for (uint32_t t = 0; t < n; ++t) {
        std::memcpy(&qg_[(size_t{gi} * n + t) * hd], &q_[size_t{t} * qdim + (g * group + gi) * hd],
                    hd * sizeof(float));
      }
    }
    // Gather this head's K and V rows [0, ctx) from the pool blocks (in block order) so that
    // scores and P*V are one large sgemm each; their shapes depend only on (pos, n).
    for (uint32_t j = 0; j < nblk; ++j) {
      const uint32_t rows = std::min(bt, ctx - j * bt);
      const float* kb = pool->K(table[j], layer) + g * hd;
      const float* vb = pool->V(table[j], layer) + g * hd;
      for (uint32_t t = 0; t < rows; ++t) {
        std::memcpy(&kc_[(size_t{j} * bt + t) * hd], kb + size_t{t} * kvdim, hd * sizeof(float));
        std::memcpy(&vc_[(size_t{j} * bt + t) * hd], vb + size_t{t} * kvdim, hd * sizeof(float));
      }
    }
    blas::Sgemm(/*trans_b=*/true, static_cast<int>(m), static_cast<int>(ctx), static_cast<int>(hd),
                scale, qg_.data(), static_cast<int>(hd), kc_.data(), static_cast<int>(hd), 0.0f,
                scores_.data(), static_cast<int>(ctx));
    for (uint32_t r = 0; r < m; ++r) {  // causal: row r (position pos + r % n) sees [0, p]
      inv_sum_[r] = SoftmaxRowUnnormalized(&scores_[size_t{r} * ctx], pos + (r % n) + 1, ctx);
    }
    blas::Sgemm(/*trans_b=*/false, static_cast<int>(m), static_cast<int>(hd), static_cast<int>(ctx),
                1.0f, scores_.data(), static_cast<int>(ctx), vc_.data(), static_cast<int>(hd), 0.0f,
                outg_.data(), static_cast<int>(hd));
    for (uint32_t gi = 0; gi < group; ++gi) {
      for (uint32_t t = 0; t < n; ++t) {
        const float inv = inv_sum_[size_t{gi} * n + t];
        const float* src = &outg_[(size_t{gi} * n + t) * hd];
        float* dst = &attn_[size_t{t} * qdim + (g * group + gi) * hd];
        for (uint32_t e = 0; e < hd; ++e) dst[e] = src[e] * inv;
      }
    }
  }
}

}  // namespace kvtier::engine
