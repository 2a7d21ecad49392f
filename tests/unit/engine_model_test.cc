// The reference transformer: matches a naive double-precision forward pass, and a chunk
// computed after a copied prefix gives the very same bits as in a full prefill.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "engine/config.h"
#include "engine/kv_pool.h"
#include "engine/model.h"
#include "engine/weights.h"

namespace kvtier::engine {
namespace {

std::vector<TokenId> Tokens(uint32_t n, uint32_t vocab, uint32_t salt = 0) {
  std::vector<TokenId> t(n);
  for (uint32_t i = 0; i < n; ++i) t[i] = (i * 7919u + 13u + salt * 104729u) % vocab;
  return t;
}

// Straightforward per-token forward pass in double: the semantics the chunked one must have.
std::vector<double> NaiveLogits(const ModelConfig& c, const Weights& w,
                                const std::vector<TokenId>& toks) {
  const size_t n = toks.size(), d = c.d_model, hd = c.head_dim(), nh = c.num_heads,
               kvh = c.num_kv_heads, f = c.ffn_dim, g = c.group_size();
  std::vector<std::vector<double>> x(n, std::vector<double>(d));
  for (size_t t = 0; t < n; ++t)
    for (size_t i = 0; i < d; ++i) x[t][i] = w.embedding[toks[t] * d + i];
  auto norm = [&](const std::vector<double>& v, const std::vector<float>& wt) {
    double ss = 0;
    for (double a : v) ss += a * a;
    const double inv = 1.0 / std::sqrt(ss / d + c.norm_eps);
    std::vector<double> o(v.size());
    for (size_t i = 0; i < v.size(); ++i) o[i] = v[i] * inv * wt[i];
    return o;
  };
  auto matvec = [](const std::vector<float>& m, const std::vector<double>& v, size_t out) {
    std::vector<double> o(out, 0.0);
    for (size_t r = 0; r < out; ++r)
      for (size_t i = 0; i < v.size(); ++i) o[r] += m[r * v.size() + i] * v[i];
    return o;
  };
  auto rope = [&](std::vector<double>* v, size_t heads, size_t pos) {
    for (size_t h = 0; h < heads; ++h)
      for (size_t i = 0; i < hd / 2; ++i) {
        const double ang = pos * std::pow(double(c.rope_theta), -2.0 * i / hd);
        double& a = (*v)[h * hd + 2 * i];
        double& b = (*v)[h * hd + 2 * i + 1];
        const double a0 = a, b0 = b;
        a = a0 * std::cos(ang) - b0 * std::sin(ang);
        b = a0 * std::sin(ang) + b0 * std::cos(ang);
      }
  };
  for (size_t l = 0; l < c.num_layers; ++l) {
    const LayerWeights& lw = w.layers[l];
    std::vector<std::vector<double>> q(n), k(n), v(n);
    for (size_t t = 0; t < n; ++t) {
      auto h = norm(x[t], lw.attn_norm);
      q[t] = matvec(lw.wq, h, nh * hd);
      k[t] = matvec(lw.wk, h, kvh * hd);
      v[t] = matvec(lw.wv, h, kvh * hd);
      rope(&q[t], nh, t);
      rope(&k[t], kvh, t);
    }
    for (size_t t = 0; t < n; ++t) {
      std::vector<double> att(nh * hd, 0.0);
      for (size_t h = 0; h < nh; ++h) {
        const size_t kh = h / g;
        std::vector<double> s(t + 1);
        double mx = -1e300;
        for (size_t j = 0; j <= t; ++j) {
          double dot = 0;
          for (size_t e = 0; e < hd; ++e) dot += q[t][h * hd + e] * k[j][kh * hd + e];
          s[j] = dot / std::sqrt(double(hd));
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (double& a : s) sum += (a = std::exp(a - mx));
        for (size_t j = 0; j <= t; ++j)
          for (size_t e = 0; e < hd; ++e) att[h * hd + e] += s[j] / sum * v[j][kh * hd + e];
      }
      auto o = matvec(lw.wo, att, d);
      for (size_t i = 0; i < d; ++i) x[t][i] += o[i];
      auto h2 = norm(x[t], lw.ffn_norm);
      auto gt = matvec(lw.w_gate, h2, f), up = matvec(lw.w_up, h2, f);
      for (size_t i = 0; i < f; ++i) gt[i] = gt[i] / (1 + std::exp(-gt[i])) * up[i];
      auto dn = matvec(lw.w_down, gt, d);
      for (size_t i = 0; i < d; ++i) x[t][i] += dn[i];
    }
  }
  auto h = norm(x[n - 1], w.final_norm);
  return matvec(w.output_matrix(), h, c.vocab_size);
}

struct Fixture {
  ModelConfig config;
  Model model;
  std::unique_ptr<KvPool> pool;
};

Fixture Make(uint32_t block_tokens, uint64_t blocks) {
  ModelConfig c = ModelPreset("tiny").value();
  static const auto weights = std::make_shared<const Weights>(RandomWeights(c, 42));
  Model m = Model::Create(c, weights).value();
  return {c, std::move(m), KvPool::Create(c.Layout(block_tokens), blocks).value()};
}

std::vector<BlockId> Alloc(KvPool* pool, uint32_t n) {
  std::vector<BlockId> t;
  for (uint32_t i = 0; i < n; ++i) t.push_back(pool->Allocate().value());
  return t;
}

// Prefill of toks into table, one aligned chunk per block starting at block `from`.
std::vector<float> Prefill(Fixture* f, const std::vector<TokenId>& toks,
                           const std::vector<BlockId>& table, uint32_t from = 0) {
  const uint32_t bt = f->pool->layout().block_tokens, n = static_cast<uint32_t>(toks.size());
  std::vector<float> logits;
  for (uint32_t p = from * bt; p < n; p += bt) {
    const uint32_t len = std::min(bt, n - p);
    EXPECT_TRUE(f->model
                    .ForwardChunk(std::span(toks).subspan(p, len), p, table, f->pool.get(),
                                  p + len == n ? &logits : nullptr)
                    .ok());
  }
  return logits;
}

TEST(EngineModel, MatchesNaiveDoublePrecisionForward) {
  SetBlasThreads(1);
  Fixture f = Make(16, 8);
  auto toks = Tokens(40, f.config.vocab_size);
  auto table = Alloc(f.pool.get(), 3);
  std::vector<float> got = Prefill(&f, toks, table);
  std::vector<double> want = NaiveLogits(f.config, f.model.weights(), toks);
  ASSERT_EQ(got.size(), want.size());
  double max_err = 0, max_abs = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    max_err = std::max(max_err, std::fabs(got[i] - want[i]));
    max_abs = std::max(max_abs, std::fabs(want[i]));
  }
  EXPECT_GT(max_abs, 1e-2);  // the logits are not all ~0
  EXPECT_LT(max_err, 1e-3 * std::max(1.0, max_abs)) << "max |err| " << max_err;
}

TEST(EngineModel, ChunkAfterCopiedPrefixIsBitExact) {
  for (int threads : {1, 2}) {
    SetBlasThreads(threads);
    for (uint32_t n : {17u, 32u, 33u, 100u, 128u}) {
      Fixture f = Make(16, 32);
      auto toks = Tokens(n, f.config.vocab_size);
      const uint32_t blocks = (n + 15) / 16;
      auto a = Alloc(f.pool.get(), blocks), b = Alloc(f.pool.get(), blocks);
      std::vector<float> full = Prefill(&f, toks, a);
      const uint32_t keep = (n - 1) / 16;  // every block but the last token's
      for (uint32_t i = 0; i < keep; ++i) {
        std::memcpy(f.pool->block(b[i]).data(), f.pool->block(a[i]).data(), f.pool->block_bytes());
      }
      std::vector<float> resumed = Prefill(&f, toks, b, keep);
      ASSERT_EQ(full.size(), resumed.size());
      EXPECT_EQ(0, std::memcmp(full.data(), resumed.data(), full.size() * sizeof(float)))
          << "n=" << n << " threads=" << threads;
    }
  }
  SetBlasThreads(1);
}

// Layer by layer over the chunks after a copied prefix, as a layer-wise load runs them: the
// same KV and logits as chunk after chunk; a gate that fails stops the pass at that layer.
TEST(EngineModel, LayerwisePassIsBitExactWithChunkByChunk) {
  for (int threads : {1, 2}) {
    SetBlasThreads(threads);
    Fixture f = Make(16, 32);
    const uint32_t n = 100, keep = 3;
    auto toks = Tokens(n, f.config.vocab_size);
    auto a = Alloc(f.pool.get(), 7), b = Alloc(f.pool.get(), 7);
    std::vector<float> full = Prefill(&f, toks, a);
    for (uint32_t i = 0; i < keep; ++i)
      std::memcpy(f.pool->block(b[i]).data(), f.pool->block(a[i]).data(), f.pool->block_bytes());
    std::vector<Model::Chunk> chunks;
    for (uint32_t p = keep * 16; p < n; p += 16) chunks.push_back({p, std::min(16u, n - p)});
    std::vector<uint32_t> gated;
    std::vector<float> got;
    ASSERT_TRUE(f.model
                    .ForwardLayerwise(toks, chunks, b, f.pool.get(), &got,
                                      [&](uint32_t l) {
                                        gated.push_back(l);
                                        return Status::Ok();
                                      })
                    .ok());
    EXPECT_EQ(gated, (std::vector<uint32_t>{0, 1, 2, 3}));  // tiny has 4 layers, in order
    ASSERT_EQ(got.size(), full.size());
    EXPECT_EQ(0, std::memcmp(got.data(), full.data(), full.size() * sizeof(float)))
        << "threads " << threads;
    for (uint32_t i = keep; i < 7; ++i)
      EXPECT_EQ(0, std::memcmp(f.pool->block(b[i]).data(), f.pool->block(a[i]).data(),
                               f.pool->block_bytes()))
          << "block " << i;
    Status stop = f.model.ForwardLayerwise(toks, chunks, b, f.pool.get(), &got, [](uint32_t l) {
      return l == 2 ? Status::Unavailable("layer 2 never came") : Status::Ok();
    });
    EXPECT_EQ(stop.code(), StatusCode::kUnavailable);
    std::vector<Model::Chunk> past = {{96, 16}};  // passes the prompt's 100 tokens
    EXPECT_EQ(f.model.ForwardLayerwise(toks, past, b, f.pool.get(), &got, nullptr).code(),
              StatusCode::kInvalidArgument);
  }
  SetBlasThreads(1);
}

TEST(EngineModel, LogitsDependOnTheWholePrefix) {
  SetBlasThreads(1);
  Fixture f = Make(16, 16);
  auto toks = Tokens(50, f.config.vocab_size);
  auto changed = toks;
  changed[3] = (changed[3] + 1) % f.config.vocab_size;  // a token in the first block
  auto a = Alloc(f.pool.get(), 4), b = Alloc(f.pool.get(), 4);
  std::vector<float> la = Prefill(&f, toks, a), lb = Prefill(&f, changed, b);
  EXPECT_NE(0, std::memcmp(la.data(), lb.data(), la.size() * sizeof(float)));
}

TEST(EngineModel, RejectsBadChunks) {
  Fixture f = Make(16, 4);
  auto table = Alloc(f.pool.get(), 2);
  auto toks = Tokens(20, f.config.vocab_size);
  std::vector<float> logits;
  Status spans =
      f.model.ForwardChunk(std::span(toks).subspan(0, 20), 0, table, f.pool.get(), &logits);
  EXPECT_EQ(spans.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(spans.message().find("spans two blocks"), std::string::npos) << spans.message();
  std::vector<TokenId> bad = {f.config.vocab_size};
  EXPECT_EQ(f.model.ForwardChunk(bad, 0, table, f.pool.get(), &logits).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(
      f.model.ForwardChunk(std::span(toks).subspan(0, 4), 48, table, f.pool.get(), &logits).code(),
      StatusCode::kInvalidArgument);  // the table has no block 3
  EXPECT_EQ(f.model.ForwardChunk({}, 0, table, f.pool.get(), &logits).code(),
            StatusCode::kInvalidArgument);
}

TEST(EngineModel, PresetsAndValidation) {
  ModelConfig small = ModelPreset("small").value();
  EXPECT_EQ(small.num_layers, 12u);
  EXPECT_EQ(small.d_model, 768u);
  EXPECT_EQ(small.num_heads, 12u);
  EXPECT_EQ(small.num_kv_heads, 4u);
  EXPECT_TRUE(small.Validate().ok());
  EXPECT_EQ(small.Layout(64).bytes_per_token(), 12u * 4 * 64 * 2 * 4);
  EXPECT_EQ(ModelPreset("huge").status().code(), StatusCode::kNotFound);
  ModelConfig bad = small;
  bad.num_kv_heads = 5;
  Status st = bad.Validate();
  EXPECT_NE(st.message().find("num_kv_heads"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace kvtier::engine
