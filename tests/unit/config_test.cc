#include "kvtier/config.h"

#include <gtest/gtest.h>

#include <fstream>

#include "testing/test_util.h"

namespace kvtier {
namespace {

TEST(ConfigTest, ParsesAFullConfig) {
  auto o = ParseCacheOptionsYaml(R"(
model_id: llama-3.1-8b
model_revision: 0e7c2a1
layout: {preset: llama-3.1-8b, block_tokens: 16}
tenant: team-a
write_mode: write-back
verify_checksums: false
tiers:
  - {kind: host, name: dram, capacity: 64MiB, threads: 2, eviction: s3fifo}
  - kind: metadata
    capacity: 1GiB
    admission: {kind: after-n-hits, hits: 2}
)",
                                 "test.yaml");
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->model_id, "llama-3.1-8b");
  EXPECT_EQ(o->model_revision, "0e7c2a1");
  EXPECT_EQ(o->layout.block_tokens, 16u);
  EXPECT_EQ(o->layout.bytes_per_block(), 2u << 20);
  EXPECT_EQ(o->tenant, "team-a");
  EXPECT_EQ(o->write_mode, WriteMode::kWriteBack);
  EXPECT_FALSE(o->verify_checksums);
  ASSERT_EQ(o->tiers.size(), 2u);
  EXPECT_EQ(o->tiers[0].name, "dram");
  EXPECT_EQ(o->tiers[0].capacity_bytes, 64u << 20);
  EXPECT_EQ(o->tiers[0].threads, 2);
  EXPECT_EQ(o->tiers[0].eviction, "s3fifo");
  EXPECT_EQ(o->tiers[1].admission.kind, AdmissionOptions::Kind::kAfterNHits);
  auto cache = Cache::Open(*o);
  EXPECT_TRUE(cache.ok()) << cache.status().ToString();
}

TEST(ConfigTest, ExplicitLayoutFields) {
  auto o = ParseCacheOptionsYaml(R"(
layout: {num_layers: 2, num_kv_heads: 1, head_dim: 576, dtype: fp8, attention: mla}
tiers: [{kind: host, capacity: 1MiB}]
)",
                                 "x.yaml");
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->layout.attention, AttentionKind::kMla);
  EXPECT_EQ(o->layout.bytes_per_token(), 2u * 576);
}

void ExpectError(const std::string& yaml, const std::string& fragment) {
  auto o = ParseCacheOptionsYaml(yaml, "bad.yaml");
  ASSERT_FALSE(o.ok()) << "accepted: " << yaml;
  EXPECT_EQ(o.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(o.status().message().find(fragment), std::string::npos)
      << "message: " << o.status().message() << "\nwanted: " << fragment;
}

TEST(ConfigTest, ErrorsNameFileLineAndKey) {
  ExpectError("layout: {preset: llama-3.1-8b}\ntiers:\n  - {kind: host, capacity: 8XB}\n",
              "bad.yaml:3: tiers[0].capacity: cannot parse '8XB' as a size");
  ExpectError("layout: {preset: llama-3.1-8b}\ntiers: [{kind: host, capacity: 1GiB, thread: 2}]\n",
              "tiers[0].thread: unknown key");
  ExpectError("layout: {preset: nope}\ntiers: [{kind: host, capacity: 1GiB}]\n",
              "layout.preset: unknown layout preset 'nope'");
  ExpectError("layout: {preset: llama-3.1-8b}\n", "tiers: want a non-empty list");
  ExpectError("tiers: [{kind: host, capacity: 1GiB}]\n", "layout: missing");
  ExpectError(
      "layout: {preset: llama-3.1-8b, dtype: int4}\ntiers: [{kind: host, capacity: 1GiB}]\n",
      "layout.dtype: unknown dtype 'int4'");
  ExpectError(
      "layout: {preset: llama-3.1-8b}\nwrite_mode: sometimes\ntiers: [{kind: host, capacity: "
      "1GiB}]\n",
      "write_mode: unknown mode 'sometimes'");
  ExpectError(
      "layout: {preset: llama-3.1-8b}\ntiers: [{kind: host, capacity: 1GiB, eviction: mru}]\n",
      "tiers[0].eviction: unknown eviction policy 'mru'");
  ExpectError(
      "layout: {preset: llama-3.1-8b}\ntiers: [{kind: host, capacity: 1GiB, threads: -2}]\n",
      "tiers[0].threads: want a non-negative integer");
  ExpectError("layout: {preset: llama-3.1-8b}\ntiers: [{kind: host, capacity: 1KiB}]\n",
              "tiers[0].capacity_bytes");
  ExpectError("layout: [unclosed\n", "bad.yaml:");
}

// Tier parameters were checked only when the tier opened, with no file or line ("tier 'disk':
// params.segment_bytes: ..."), although this page promises both for every error.
TEST(ConfigTest, TierParameterErrorsNameFileLineAndKey) {
  ExpectError(
      "layout: {preset: llama-3.1-8b}\ntiers:\n  - kind: disk\n    capacity: 1GiB\n    params:\n"
      "      path: /tmp/x\n      segment_bytes: lots\n",
      "bad.yaml:7: tiers[0].params.segment_bytes: 'lots' is not a byte size");
  ExpectError(
      "layout: {preset: llama-3.1-8b}\ntiers:\n  - kind: disk\n    capacity: 1GiB\n    params:\n"
      "      path: /tmp/x\n      colour: blue\n",
      "bad.yaml:7: tiers[0].params.colour: unknown disk tier param");
  ExpectError(
      "layout: {preset: llama-3.1-8b}\ntiers:\n  - kind: remote\n    capacity: 1GiB\n"
      "    params: {url: 'redis://127.0.0.1:6379', timeout_ms: soon}\n",
      "bad.yaml:5: tiers[0].params.timeout_ms:");
}

TEST(ConfigTest, LoadsAFile) {
  testing::TempDir dir;
  std::string path = dir.path() + "/kvtier.yaml";
  std::ofstream(path) << "layout: {preset: deepseek-v3}\ntiers: [{kind: host, capacity: 256MiB}]\n";
  auto o = LoadCacheOptionsFile(path);
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->layout.attention, AttentionKind::kMla);
  auto missing = LoadCacheOptionsFile(dir.path() + "/none.yaml");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("none.yaml"), std::string::npos);
}

}  // namespace
}  // namespace kvtier
