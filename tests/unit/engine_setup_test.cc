// BuildEngine with a YAML cache config: the namespace carries the engine's weights fingerprint,
// so engines with different weights (or one set of weights under two names) that share a disk
// or Redis tier never load each other's KV, while the same engine finds its own blocks again;
// a config's layout, model_id and model_revision are honoured or refused, never overwritten.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "engine/gguf.h"
#include "engine/setup.h"
#include "testing/redis_harness.h"
#include "testing/test_util.h"

namespace kvtier::engine {
namespace {

using kvtier::testing::TempDir;

EngineOptions Tiny(uint64_t seed) {
  EngineOptions o;
  o.model = "tiny";
  o.seed = seed;
  o.block_tokens = 16;
  o.pool_blocks = 32;
  o.threads = 1;
  return o;
}

// The tiny engine's layout at 16 tokens a block, as a config writes it.
constexpr const char* kTinyLayout =
    "layout: {num_layers: 4, num_kv_heads: 2, head_dim: 64, dtype: fp32, attention: mha, "
    "block_tokens: 16}\n";

std::string WriteConfig(const TempDir& dir, const std::string& name, const std::string& text) {
  const std::string path = dir.path() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

std::string DiskTier(const std::string& dir) {
  return "tiers:\n  - {kind: disk, capacity: 8MiB, params: {path: " + dir +
         ", segment_bytes: 1MiB}}\n";
}

// 6 full blocks: the first 5 are stored and loadable by a later turn (the last is computed).
std::vector<TokenId> Prompt() {
  std::vector<TokenId> p;
  for (TokenId t = 0; t < 96; ++t) p.push_back((t * 37 + 11) % 512);
  return p;
}

struct TurnOutcome {
  uint32_t tier_hit_blocks = 0;
  std::vector<float> logits;
};

// One engine process: build, run the prompt once with a cold pool, close every tier.
Result<TurnOutcome> RunOnce(const EngineOptions& options, const std::string& config) {
  KVTIER_ASSIGN_OR_RETURN(EngineSetup s, BuildEngine(options, 0, config));
  TurnOptions t;
  t.decode_tokens = 1;
  t.use_pool = false;
  KVTIER_ASSIGN_OR_RETURN(TurnResult r, s.engine->RunTurn(Prompt(), t));
  return TurnOutcome{r.tier_hit_blocks, std::move(r.logits)};
}

// Engine A fills the shared tiers of `config`; an engine with other weights (or A's weights
// under another model_id) finds nothing there; A itself, restarted, finds its blocks.
void ExpectNoSharingAcrossWeights(const TempDir& dir, const std::string& tiers) {
  const std::string as_tiny = WriteConfig(dir, "tiny.yaml", kTinyLayout + tiers);
  const std::string as_other =
      WriteConfig(dir, "other.yaml", std::string("model_id: other\n") + kTinyLayout + tiers);

  Result<TurnOutcome> first = RunOnce(Tiny(1), as_tiny);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(first->tier_hit_blocks, 0u);

  Result<TurnOutcome> other_seed = RunOnce(Tiny(2), as_tiny);
  ASSERT_TRUE(other_seed.ok()) << other_seed.status().ToString();
  EXPECT_EQ(other_seed->tier_hit_blocks, 0u) << "seed 2 was served seed 1's KV";
  EXPECT_NE(other_seed->logits, first->logits);

  Result<TurnOutcome> other_name = RunOnce(Tiny(1), as_other);
  ASSERT_TRUE(other_name.ok()) << other_name.status().ToString();
  EXPECT_EQ(other_name->tier_hit_blocks, 0u) << "model_id 'other' was served 'tiny''s KV";

  // The control: the tiers did keep the blocks, and the same weights under the same name
  // reuse them bit for bit.
  Result<TurnOutcome> again = RunOnce(Tiny(1), as_tiny);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->tier_hit_blocks, 5u);
  EXPECT_EQ(again->logits, first->logits);
}

TEST(EngineSetup, EnginesWithDifferentWeightsNeverShareADiskTier) {
  SetBlasThreads(1);
  TempDir dir;
  ExpectNoSharingAcrossWeights(dir, DiskTier(dir.path() + "/disk"));
}

TEST(EngineSetup, EnginesWithDifferentWeightsNeverShareARedisTier) {
  if (std::string why = kvtier::testing::RedisMissingReason(); !why.empty()) GTEST_SKIP() << why;
  Result<std::unique_ptr<kvtier::testing::RedisServer>> server =
      kvtier::testing::RedisServer::Start({});
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  SetBlasThreads(1);
  TempDir dir;
  ExpectNoSharingAcrossWeights(
      dir, "tiers:\n  - {kind: remote, capacity: 8MiB, params: {url: " + (*server)->url() + "}}\n");
}

TEST(EngineSetup, RevisionIsAFingerprintOfTheWeights) {
  EXPECT_EQ(RandomWeightsRevision(ModelPreset("tiny").value(), 1),
            RandomWeightsRevision(ModelPreset("tiny").value(), 1));
  EXPECT_NE(RandomWeightsRevision(ModelPreset("tiny").value(), 1),
            RandomWeightsRevision(ModelPreset("tiny").value(), 2));
  ModelConfig eps = ModelPreset("tiny").value();
  eps.norm_eps = 1e-6f;
  EXPECT_NE(RandomWeightsRevision(eps, 1), RandomWeightsRevision(ModelPreset("tiny").value(), 1));

  // Two GGUF files with one general.name and different weights: different revisions; the
  // same file loaded twice: the same one.
  TempDir dir;
  ModelConfig c = ModelPreset("tiny").value();
  c.num_layers = 1;
  c.name = "same-name";
  const std::string a = dir.path() + "/a.gguf", b = dir.path() + "/b.gguf";
  ASSERT_TRUE(WriteGguf(c, RandomWeights(c, 1), a, false).ok());
  ASSERT_TRUE(WriteGguf(c, RandomWeights(c, 2), b, false).ok());
  Result<GgufModel> ga = LoadGguf(a), gb = LoadGguf(b), ga2 = LoadGguf(a);
  ASSERT_TRUE(ga.ok() && gb.ok() && ga2.ok());
  EXPECT_EQ(ga->config.name, gb->config.name);
  EXPECT_TRUE(ga->revision.starts_with("gguf-xxh128:")) << ga->revision;
  EXPECT_NE(ga->revision, gb->revision);
  EXPECT_EQ(ga->revision, ga2->revision);
}

TEST(EngineSetup, ConfigKeysTheEngineDecidesAreRefusedOrHonoured) {
  SetBlasThreads(1);
  TempDir dir;
  const std::string tiers = "tiers:\n  - {kind: host, capacity: 4MiB}\n";

  // A layout that is not the engine's (64-token blocks): refused, naming the file and the
  // layout to write.
  const std::string wrong_layout =
      WriteConfig(dir, "layout.yaml",
                  "layout: {num_layers: 4, num_kv_heads: 2, head_dim: 64, dtype: fp32}\n" + tiers);
  Result<EngineSetup> s = BuildEngine(Tiny(1), 0, wrong_layout);
  ASSERT_EQ(s.status().code(), StatusCode::kInvalidArgument) << s.status().ToString();
  EXPECT_NE(s.status().message().find(wrong_layout + ": layout:"), std::string::npos)
      << s.status().message();
  EXPECT_NE(s.status().message().find("num_layers: 4, num_kv_heads: 2, head_dim: 64"),
            std::string::npos)
      << s.status().message();

  // Another model's revision: refused.
  const std::string wrong_rev =
      WriteConfig(dir, "rev.yaml", std::string("model_revision: v7\n") + kTinyLayout + tiers);
  s = BuildEngine(Tiny(1), 0, wrong_rev);
  ASSERT_EQ(s.status().code(), StatusCode::kInvalidArgument) << s.status().ToString();
  EXPECT_NE(s.status().message().find(wrong_rev + ": model_revision: 'v7'"), std::string::npos)
      << s.status().message();

  // Its own revision and a model_id: honoured.
  const std::string own = WriteConfig(dir, "own.yaml",
                                      "model_id: my-model\nmodel_revision: " +
                                          RandomWeightsRevision(ModelPreset("tiny").value(), 1) +
                                          "\n" + kTinyLayout + tiers);
  s = BuildEngine(Tiny(1), 0, own);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  Namespace ns;
  ns.model_id = "my-model";
  ns.model_revision = s->engine->model_revision();
  ns.layout_fingerprint = s->engine->layout().fingerprint();
  EXPECT_EQ(s->cache->Root(), ns.Root());
}

}  // namespace
}  // namespace kvtier::engine
