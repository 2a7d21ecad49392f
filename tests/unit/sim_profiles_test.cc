// GPU and model profiles (sim/profiles.cc): the built-in ones load, the model's prefill FLOPs
// follow its shape, and a bad profile names the file and the field.
#include <gtest/gtest.h>

#include "sim/profiles.h"

namespace kvtier::sim {
namespace {

TEST(Profiles, BuiltinsLoadAndBadOnesNameTheField) {
  for (const char* g : {"h100", "h200", "b200", "b300", "mi355x", "gb300"}) {
    EXPECT_TRUE(LoadGpuProfile(g).ok()) << g;
  }
  for (const char* m : {"llama-3.1-8b", "llama-3.1-70b", "qwen3-235b-a22b", "deepseek-v3"}) {
    EXPECT_TRUE(LoadModelProfile(m).ok()) << m;
  }
  auto m = LoadModelProfile("llama-3.1-8b");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->kv_bytes_per_token, 128u * 1024);
  // 2 x params per token plus 4 x layers x heads x dim x position.
  EXPECT_DOUBLE_EQ(m->PrefillFlops(0, 2), 2 * 2 * 8.03e9 + 4.0 * 32 * 32 * 128 * (0 + 1));
  EXPECT_EQ(LoadGpuProfile("nope").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(
      ParseGpuProfile(R"({"name":"x","hbm_gb":80,"hbm_tbps":3})", "x.json").status().message(),
      "x.json: missing 'bf16_tflops'");
  EXPECT_EQ(
      ParseGpuProfile(R"({"name":"x","hbm_gb":80,"hbm_tbps":3,"bf16_tflops":1,"mfu":2})", "x.json")
          .status()
          .message(),
      "x.json: GPU profile x: mfu must be in (0, 1]");
}

}  // namespace
}  // namespace kvtier::sim
