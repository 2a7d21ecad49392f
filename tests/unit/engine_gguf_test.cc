// GGUF loader: a file the test writes itself loads back to the same model (F32 bit for bit,
// F16 to the half-rounded values), and malformed files fail with errors naming what is wrong.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "engine/gguf.h"
#include "engine/kv_pool.h"
#include "engine/model.h"

namespace kvtier::engine {
namespace {

class TempFile {
 public:
  explicit TempFile(const std::string& stem)
      : path_(::testing::TempDir() + "/" + stem + "_" + std::to_string(::getpid()) + ".gguf") {}
  ~TempFile() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A tiny config with tied output weights, to cover that path too.
ModelConfig SmallConfig() {
  ModelConfig c = ModelPreset("tiny").value();
  c.num_layers = 2;
  c.name = "gguf-test";
  c.rope_theta = 500000.0f;
  c.norm_eps = 1e-6f;
  return c;
}

std::vector<float> LastLogits(const ModelConfig& c, std::shared_ptr<const Weights> w) {
  Model m = Model::Create(c, std::move(w)).value();
  auto pool = KvPool::Create(c.Layout(16), 2).value();
  std::vector<BlockId> table = {pool->Allocate().value(), pool->Allocate().value()};
  std::vector<TokenId> toks = {1, 2, 3, 4, 5, 400, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18};
  std::vector<float> logits;
  EXPECT_TRUE(m.ForwardChunk(std::span(toks).subspan(0, 16), 0, table, pool.get(), nullptr).ok());
  EXPECT_TRUE(m.ForwardChunk(std::span(toks).subspan(16), 16, table, pool.get(), &logits).ok());
  return logits;
}

TEST(EngineGguf, F32RoundTripIsExact) {
  SetBlasThreads(1);
  ModelConfig c = SmallConfig();
  Weights w = RandomWeights(c, 3);
  w.output.clear();  // tied to token_embd
  TempFile file("f32");
  ASSERT_TRUE(WriteGguf(c, w, file.path(), /*f16=*/false).ok());
  Result<GgufModel> g = LoadGguf(file.path());
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->version, 3u);
  EXPECT_EQ(g->config.name, "gguf-test");
  EXPECT_EQ(g->config.num_layers, 2u);
  EXPECT_EQ(g->config.vocab_size, c.vocab_size);
  EXPECT_EQ(g->config.num_kv_heads, c.num_kv_heads);
  EXPECT_EQ(g->config.rope_theta, c.rope_theta);
  EXPECT_EQ(g->config.norm_eps, c.norm_eps);
  EXPECT_TRUE(g->weights.output.empty());
  EXPECT_EQ(g->weights.layers[1].w_down, w.layers[1].w_down);
  EXPECT_EQ(g->weights.embedding, w.embedding);
  auto a = LastLogits(c, std::make_shared<const Weights>(w));
  auto b = LastLogits(g->config, std::make_shared<const Weights>(std::move(g->weights)));
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
}

TEST(EngineGguf, F16WeightsLoadAsTheirHalfValues) {
  ModelConfig c = SmallConfig();
  Weights w = RandomWeights(c, 4);
  TempFile file("f16");
  ASSERT_TRUE(WriteGguf(c, w, file.path(), /*f16=*/true).ok());
  Result<GgufModel> g = LoadGguf(file.path());
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  const auto& got = g->weights.layers[0].wq;
  ASSERT_EQ(got.size(), w.layers[0].wq.size());
  size_t differ = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i], HalfToFloat(FloatToHalf(w.layers[0].wq[i])));
    differ += got[i] != w.layers[0].wq[i];
    EXPECT_NEAR(got[i], w.layers[0].wq[i], 1e-3);
  }
  EXPECT_GT(differ, 0u);  // it really went through half precision
  EXPECT_EQ(g->weights.output.size(), w.output.size());
}

TEST(EngineGguf, HalfConversionRoundTripsEveryHalf) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = HalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    EXPECT_EQ(FloatToHalf(f), h) << "half 0x" << std::hex << h;
  }
  EXPECT_EQ(HalfToFloat(0x3c00), 1.0f);
  EXPECT_EQ(HalfToFloat(0xc000), -2.0f);
  EXPECT_EQ(FloatToHalf(1.0f + 1.0f / 4096), 0x3c00);  // ties to even
  EXPECT_EQ(FloatToHalf(1e6f), 0x7c00);                // overflow -> inf
}

std::vector<char> ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(in), {});
}
void WriteAll(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream(path, std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

TEST(EngineGguf, TruncatedFileIsCorruptionNamingTheFile) {
  ModelConfig c = SmallConfig();
  TempFile file("trunc");
  ASSERT_TRUE(WriteGguf(c, RandomWeights(c, 5), file.path(), false).ok());
  std::vector<char> bytes = ReadAll(file.path());
  for (size_t keep : {size_t{6}, size_t{200}, bytes.size() - 100}) {
    WriteAll(file.path(), std::vector<char>(bytes.begin(), bytes.begin() + keep));
    Result<GgufModel> g = LoadGguf(file.path());
    ASSERT_FALSE(g.ok()) << "kept " << keep;
    EXPECT_EQ(g.status().code(), StatusCode::kCorruption) << g.status().ToString();
    EXPECT_NE(g.status().message().find(file.path()), std::string::npos);
  }
}

TEST(EngineGguf, UnsupportedContentIsNamed) {
  ModelConfig c = SmallConfig();
  Weights w = RandomWeights(c, 6);
  TempFile file("bad");
  {  // another architecture
    GgufWriter g;
    g.AddString("general.architecture", "mamba");
    ASSERT_TRUE(g.Write(file.path()).ok());
    Status st = LoadGguf(file.path()).status();
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("mamba"), std::string::npos) << st.message();
  }
  {  // a missing tensor
    GgufWriter g;
    g.AddString("general.architecture", "llama");
    g.AddU32("llama.block_count", 1);
    g.AddU32("llama.embedding_length", c.d_model);
    g.AddU32("llama.feed_forward_length", c.ffn_dim);
    g.AddU32("llama.attention.head_count", c.num_heads);
    g.AddTensor("token_embd.weight", {c.d_model, c.vocab_size}, w.embedding, false);
    ASSERT_TRUE(g.Write(file.path()).ok());
    Status st = LoadGguf(file.path()).status();
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("blk.0.attn_norm.weight"), std::string::npos) << st.message();
  }
  {  // a quantized tensor: patch the type field of the first tensor (F32 = 0 -> Q4_0 = 2)
    ASSERT_TRUE(WriteGguf(c, w, file.path(), false).ok());
    std::vector<char> bytes = ReadAll(file.path());
    const std::string name = "token_embd.weight";
    auto it = std::search(bytes.begin(), bytes.end(), name.begin(), name.end());
    ASSERT_NE(it, bytes.end());
    const size_t type_at = (it - bytes.begin()) + name.size() + 4 + 2 * 8;
    bytes[type_at] = 2;
    WriteAll(file.path(), bytes);
    Status st = LoadGguf(file.path()).status();
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("token_embd.weight"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("F32 and F16 only"), std::string::npos) << st.message();
  }
  EXPECT_EQ(LoadGguf(file.path() + ".absent").status().code(), StatusCode::kNotFound);
  WriteAll(file.path(), {'G', 'G', 'U', 'X', 0, 0, 0, 0});
  EXPECT_NE(LoadGguf(file.path()).status().message().find("not a GGUF file"), std::string::npos);
}

}  // namespace
}  // namespace kvtier::engine
