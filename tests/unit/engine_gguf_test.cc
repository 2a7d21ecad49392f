// GGUF loader: a file the test writes itself loads back to the same model (F32 bit for bit,
// F16 to the half-rounded values), and malformed files fail with errors naming what is wrong.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
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

// Hostile files: GGUF bytes built field by field, so a test can put any value in any field.
// Each bad field must come back as one Status naming the file, the field and the value.
enum : uint32_t { kU32 = 4, kI32 = 5, kF32 = 6, kString = 8, kArray = 9, kU64 = 10, kF64 = 12 };

class RawGguf {
 public:
  template <typename T>
  RawGguf& Put(T v) {
    const char* p = reinterpret_cast<const char*>(&v);
    bytes_.insert(bytes_.end(), p, p + sizeof(T));
    return *this;
  }
  RawGguf& Str(const std::string& s) {
    Put<uint64_t>(s.size());
    bytes_.insert(bytes_.end(), s.begin(), s.end());
    return *this;
  }
  RawGguf& Header(uint64_t tensors, uint64_t kvs) {
    return Put<uint32_t>(0x46554747).Put<uint32_t>(3).Put(tensors).Put(kvs);
  }
  template <typename T>
  RawGguf& Kv(const std::string& key, uint32_t type, T value) {
    return Str(key).Put(type).Put(value);
  }
  // A tensor info (no data).
  RawGguf& Tensor(const std::string& name, const std::vector<uint64_t>& dims, uint64_t offset) {
    Str(name).Put<uint32_t>(static_cast<uint32_t>(dims.size()));
    for (uint64_t d : dims) Put(d);
    return Put<uint32_t>(0).Put(offset);  // F32
  }
  // The metadata every llama file needs (5 entries) for a model of d=8, 2 heads, 1 KV head.
  RawGguf& Llama(uint32_t layers = 1) {
    Str("general.architecture").Put(kString).Str("llama");
    Kv("llama.block_count", kU32, layers);
    Kv("llama.embedding_length", kU32, uint32_t{8});
    Kv("llama.feed_forward_length", kU32, uint32_t{16});
    return Kv("llama.attention.head_count", kU32, uint32_t{2})
        .Kv("llama.attention.head_count_kv", kU32, uint32_t{1});
  }
  RawGguf& Pad(size_t align = 32) {
    bytes_.resize((bytes_.size() + align - 1) / align * align, 0);
    return *this;
  }
  const std::vector<char>& bytes() const { return bytes_; }

 private:
  std::vector<char> bytes_;
};
constexpr uint64_t kLlamaKvs = 6;

// Writes the bytes and loads them: the load must fail with `code`, naming the file and every
// string of `names`.
void ExpectLoadError(const TempFile& file, const RawGguf& g, StatusCode code,
                     std::initializer_list<std::string> names) {
  WriteAll(file.path(), g.bytes());
  Status st = LoadGguf(file.path()).status();
  EXPECT_EQ(st.code(), code) << st.ToString();
  EXPECT_NE(st.message().find(file.path()), std::string::npos) << st.message();
  for (const std::string& name : names) {
    EXPECT_NE(st.message().find(name), std::string::npos)
        << "lacks '" << name << "': " << st.message();
  }
}

TEST(EngineGguf, HeaderCountsBeyondTheLimitAreNamed) {
  TempFile file("counts");
  ExpectLoadError(file, RawGguf().Header(uint64_t{1} << 40, 0), StatusCode::kCorruption,
                  {"tensor_count", "1099511627776"});
  ExpectLoadError(file, RawGguf().Header(0, uint64_t{1} << 21), StatusCode::kCorruption,
                  {"kv_count", "2097152"});
}

TEST(EngineGguf, StringLengthsPastTheEndAreNamed) {
  TempFile file("strlen");
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  ExpectLoadError(file, RawGguf().Header(0, 1).Put(kMax).Put(uint64_t{0}), StatusCode::kCorruption,
                  {"metadata key 0", "string length 18446744073709551615"});
  ExpectLoadError(
      file, RawGguf().Header(0, 1).Str("general.name").Put(kString).Put(uint64_t{1} << 40),
      StatusCode::kCorruption, {"metadata general.name", "string length 1099511627776"});
  ExpectLoadError(file, RawGguf().Header(1, 0).Put(uint64_t{1} << 63).Put(uint64_t{0}),
                  StatusCode::kCorruption,
                  {"name of tensor 0", "string length 9223372036854775808"});
}

TEST(EngineGguf, ArrayLengthsPastTheEndAreNamed) {
  TempFile file("arrlen");
  // A string array whose length no file could hold (it used to loop until it ran out).
  ExpectLoadError(file,
                  RawGguf()
                      .Header(0, 1)
                      .Str("tokenizer.ggml.tokens")
                      .Put(kArray)
                      .Put(kString)
                      .Put(std::numeric_limits<uint64_t>::max())
                      .Str("a")
                      .Str("b"),
                  StatusCode::kCorruption,
                  {"tokenizer.ggml.tokens", "array length 18446744073709551615"});
  ExpectLoadError(file,
                  RawGguf()
                      .Header(0, 1)
                      .Str("tokenizer.ggml.scores")
                      .Put(kArray)
                      .Put(kF32)
                      .Put(uint64_t{1} << 61),
                  StatusCode::kCorruption,
                  {"tokenizer.ggml.scores", "array length 2305843009213693952"});
}

TEST(EngineGguf, CountsThatAreNotIntegersInRangeAreNamed) {
  TempFile file("ints");
  // NaN and 8.5 were cast to u32 unchecked (NaN: undefined behaviour; 8.5 became 8).
  ExpectLoadError(file,
                  RawGguf()
                      .Header(0, 5)
                      .Str("general.architecture")
                      .Put(kString)
                      .Str("llama")
                      .Kv("llama.block_count", kF32, std::numeric_limits<float>::quiet_NaN())
                      .Kv("llama.embedding_length", kU32, uint32_t{8})
                      .Kv("llama.feed_forward_length", kU32, uint32_t{16})
                      .Kv("llama.attention.head_count", kU32, uint32_t{2}),
                  StatusCode::kInvalidArgument, {"llama.block_count", "nan"});
  ExpectLoadError(file,
                  RawGguf()
                      .Header(0, 5)
                      .Str("general.architecture")
                      .Put(kString)
                      .Str("llama")
                      .Kv("llama.block_count", kU32, uint32_t{1})
                      .Kv("llama.embedding_length", kF32, 8.5f)
                      .Kv("llama.feed_forward_length", kU32, uint32_t{16})
                      .Kv("llama.attention.head_count", kU32, uint32_t{2}),
                  StatusCode::kInvalidArgument, {"llama.embedding_length", "8.5"});
  // context_length had no range check at all: -1 was cast to u32 and accepted.
  ExpectLoadError(file,
                  RawGguf().Header(0, kLlamaKvs + 1).Llama().Kv("llama.context_length", kI32, -1),
                  StatusCode::kInvalidArgument, {"llama.context_length", "-1"});
  ExpectLoadError(file,
                  RawGguf()
                      .Header(0, kLlamaKvs + 1)
                      .Llama()
                      .Kv("llama.context_length", kU64, uint64_t{1} << 40),
                  StatusCode::kInvalidArgument, {"llama.context_length", "1099511627776"});
}

TEST(EngineGguf, FloatsOutsideFloatRangeAreNamed) {
  TempFile file("floats");
  // 1e300 used to become rope_theta = inf (converting it is undefined), which passed as > 0.
  ExpectLoadError(
      file, RawGguf().Header(0, kLlamaKvs + 1).Llama().Kv("llama.rope.freq_base", kF64, 1e300),
      StatusCode::kInvalidArgument, {"llama.rope.freq_base", "1e+300"});
  ExpectLoadError(file,
                  RawGguf()
                      .Header(0, kLlamaKvs + 1)
                      .Llama()
                      .Kv("llama.attention.layer_norm_rms_epsilon", kF64,
                          std::numeric_limits<double>::quiet_NaN()),
                  StatusCode::kInvalidArgument, {"llama.attention.layer_norm_rms_epsilon", "nan"});
}

TEST(EngineGguf, AlignmentThatIsNotASmallPowerOfTwoIsNamed) {
  TempFile file("align");
  // u64 max and -32 went through an unchecked (undefined) cast; 32.5 was truncated to 32 and
  // 2^32 accepted.
  ExpectLoadError(
      file,
      RawGguf().Header(0, 1).Kv("general.alignment", kU64, std::numeric_limits<uint64_t>::max()),
      StatusCode::kCorruption, {"general.alignment 18446744073709551615"});
  ExpectLoadError(file, RawGguf().Header(0, 1).Kv("general.alignment", kI32, -32),
                  StatusCode::kCorruption, {"general.alignment -32"});
  ExpectLoadError(file, RawGguf().Header(0, 1).Kv("general.alignment", kF32, 32.5f),
                  StatusCode::kCorruption, {"general.alignment 32.5"});
  ExpectLoadError(file, RawGguf().Header(0, 1).Kv("general.alignment", kU64, uint64_t{1} << 32),
                  StatusCode::kCorruption, {"general.alignment 4294967296"});
}

TEST(EngineGguf, VocabularyBeyondIntRangeIsNamed) {
  TempFile file("vocab");
  // dims[1] used to be truncated to u32 (2^32 + 16 -> 16).
  ExpectLoadError(file,
                  RawGguf()
                      .Header(1, kLlamaKvs)
                      .Llama()
                      .Tensor("token_embd.weight", {8, (uint64_t{1} << 32) + 16}, 0)
                      .Pad(),
                  StatusCode::kInvalidArgument, {"token_embd.weight", "vocabulary", "4294967312"});
}

TEST(EngineGguf, TensorOffsetPastTheEndIsNamed) {
  ModelConfig c = SmallConfig();
  TempFile file("offset");
  ASSERT_TRUE(WriteGguf(c, RandomWeights(c, 7), file.path(), false).ok());
  std::vector<char> bytes = ReadAll(file.path());
  const std::string name = "token_embd.weight";
  auto it = std::search(bytes.begin(), bytes.end(), name.begin(), name.end());
  ASSERT_NE(it, bytes.end());
  const size_t offset_at = (it - bytes.begin()) + name.size() + 4 + 2 * 8 + 4;
  const uint64_t offset = std::numeric_limits<uint64_t>::max() - 31;  // data_start + it wraps
  std::memcpy(&bytes[offset_at], &offset, 8);
  WriteAll(file.path(), bytes);
  Status st = LoadGguf(file.path()).status();
  EXPECT_EQ(st.code(), StatusCode::kCorruption) << st.ToString();
  EXPECT_NE(st.message().find(file.path()), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("token_embd.weight: offset 18446744073709551584"), std::string::npos)
      << st.message();
}

TEST(EngineGguf, OverlappingTensorsCannotLoadMoreThanTheFileHolds) {
  // Every tensor of a 1-layer model at offset 0 over the 512 bytes of the largest one: each
  // fits the file alone, so this used to load; scaled up, overlap lets a small file allocate
  // without bound.
  RawGguf g;
  g.Header(11, kLlamaKvs).Llama();
  const std::vector<std::pair<std::string, std::vector<uint64_t>>> shapes = {
      {"token_embd.weight", {8, 16}},   {"blk.0.attn_norm.weight", {8}},
      {"blk.0.attn_q.weight", {8, 8}},  {"blk.0.attn_k.weight", {8, 4}},
      {"blk.0.attn_v.weight", {8, 4}},  {"blk.0.attn_output.weight", {8, 8}},
      {"blk.0.ffn_norm.weight", {8}},   {"blk.0.ffn_gate.weight", {8, 16}},
      {"blk.0.ffn_up.weight", {8, 16}}, {"blk.0.ffn_down.weight", {16, 8}},
      {"output_norm.weight", {8}}};
  for (const auto& [name, dims] : shapes) g.Tensor(name, dims, 0);
  g.Pad();
  for (int i = 0; i < 128; ++i) g.Put(0.5f);
  TempFile file("overlap");
  ExpectLoadError(file, g, StatusCode::kCorruption, {"512-byte data section", "overlap"});
}

TEST(EngineGguf, HugeBlockCountFailsAtTheFirstMissingLayer) {
  // llama.block_count 1e9 used to allocate 1e9 layers up front (std::bad_alloc).
  ModelConfig c = SmallConfig();
  GgufWriter g;
  g.AddString("general.architecture", "llama");
  g.AddU32("llama.block_count", 1000000000);
  g.AddU32("llama.embedding_length", c.d_model);
  g.AddU32("llama.feed_forward_length", c.ffn_dim);
  g.AddU32("llama.attention.head_count", c.num_heads);
  g.AddTensor("token_embd.weight", {c.d_model, c.vocab_size},
              std::vector<float>(size_t{c.d_model} * c.vocab_size, 0.25f), false);
  TempFile file("layers");
  ASSERT_TRUE(g.Write(file.path()).ok());
  Status st = LoadGguf(file.path()).status();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find("blk.0.attn_norm.weight: missing"), std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("llama.block_count is 1000000000"), std::string::npos)
      << st.message();
}

}  // namespace
}  // namespace kvtier::engine
