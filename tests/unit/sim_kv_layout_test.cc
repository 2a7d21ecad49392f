// KV by layer group (sim/kv_layout.h) and the HBM pool per data-parallel rank
// (sim/hbm_budget.h): DeepSeek-V4-Pro's groups derived term by term from its config and the
// engine rule its profile quotes, a dense model unchanged by the groups, page padding and the
// parser's errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "sim/hbm_budget.h"
#include "sim/kv_layout.h"
#include "sim/profiles.h"

namespace kvtier::sim {
namespace {

const KvGroup& Group(const ModelProfile& m, const std::string& name) {
  for (const KvGroup& g : m.kv_layout.groups) {
    if (g.name == name) return g;
  }
  ADD_FAILURE() << "no group " << name;
  return m.kv_layout.groups.front();
}

// DeepSeek-V4-Pro's config.json: compress_ratios for the 61 layers (the 62nd entry is the MTP
// layer's), head_dim 512 = 448 nope + 64 rope, index_head_dim 128, sliding_window 128.
std::vector<int> V4ProRatios() {
  std::vector<int> r = {128, 128};
  for (int i = 0; i < 29; ++i) r.insert(r.end(), {4, 128});
  r.push_back(4);
  return r;
}

TEST(KvGroupLayout, DeepSeekV4ProGroupsTermByTerm) {
  auto m = LoadModelProfile("deepseek-v4-pro");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  const KvGroupLayout& l = m->kv_layout;
  const std::vector<int> ratios = V4ProRatios();
  ASSERT_EQ(ratios.size(), 61u);
  const uint32_t c4 = std::count(ratios.begin(), ratios.end(), 4);
  const uint32_t c128 = std::count(ratios.begin(), ratios.end(), 128);
  EXPECT_EQ(c4, 30u);
  EXPECT_EQ(c128, 31u);
  // The fp8 latent entry: 448 fp8 nope + 64 bf16 rope + 8 scale bytes; indexer 128 fp8 + 4.
  const double latent = 448 + 64 * 2 + 8, index_key = 128 + 128 / 128 * 4;
  EXPECT_EQ(Group(*m, "swa").layers, 61u);
  EXPECT_EQ(Group(*m, "c4a").layers, c4);
  EXPECT_EQ(Group(*m, "c128a").layers, c128);

  // Token groups: a 256-token page holds 256 / ratio entries.
  const KvGroupBytes c4a = GroupBytes(l, Group(*m, "c4a"));
  EXPECT_DOUBLE_EQ(c4a.page_bytes, 64 * latent);
  EXPECT_DOUBLE_EQ(c4a.per_token, c4 * latent / 4);  // 4380
  const KvGroupBytes c128a = GroupBytes(l, Group(*m, "c128a"));
  EXPECT_DOUBLE_EQ(c128a.page_bytes, 2 * latent);
  EXPECT_DOUBLE_EQ(c128a.per_token, c128 * latent / 128);                                  // 141.44
  EXPECT_DOUBLE_EQ(GroupBytes(l, Group(*m, "c4_indexer")).per_token, c4 * index_key / 4);  // 990
  // Window pool: every layer's window, and the c4 rings (8 fp32 slots of kv + score, twice for
  // the overlap) per 128-token window page, both charged at 0.1 per cached token.
  EXPECT_DOUBLE_EQ(GroupBytes(l, Group(*m, "swa")).per_window_token, 61 * latent);
  const double c4_ring = 8.0 / 128 * 2 * 2 * 512 * 4, c4i_ring = 8.0 / 128 * 2 * 2 * 128 * 4;
  EXPECT_DOUBLE_EQ(GroupBytes(l, Group(*m, "c4_state")).per_window_token, c4 * c4_ring);
  EXPECT_DOUBLE_EQ(GroupBytes(l, Group(*m, "c4_indexer_state")).per_window_token, c4 * c4i_ring);
  // Per running request: the c128 ring, 128 fp32 slots of kv + score per layer.
  EXPECT_DOUBLE_EQ(KvBytesPerRunningRequest(l), c128 * 128.0 * 2 * 512 * 4);  // 16.25 MB

  const double per_token = c4 * latent / 4 + c128 * latent / 128 + c4 * index_key / 4 +
                           0.1 * (61 * latent + c4 * c4_ring + c4 * c4i_ring);
  EXPECT_DOUBLE_EQ(KvBytesPerCachedToken(l), per_token);
  EXPECT_NEAR(per_token, 10993.84, 0.01);
  EXPECT_EQ(m->KvBytesPerToken(), 10994u);
  EXPECT_EQ(m->kv_bytes_per_token, 10994u);

  // One request of 100,000 tokens: 391 pages of each token group, a full window per layer and
  // every ring.
  const double pages = std::ceil(100000 / 256.0);
  const double one = pages * (c4 * 64 * latent + c128 * 2 * latent + c4 * 64 * index_key) +
                     61 * 128 * latent + c4 * 8 * (8192 + 2048) + c128 * 128 * 4096.0;
  EXPECT_DOUBLE_EQ(KvBytesForTokens(l, 100000), one);
}

// AgentX's B300 DEP8 point: each rank is one GPU holding 1/8 of the routed experts and all the
// other weights, 48 of the 384 running requests and the rest as cached tokens.
TEST(HbmBudget, DeepSeekV4ProOnB300Dep8TermByTerm) {
  auto g = LoadGpuProfile("b300");
  auto m = LoadModelProfile("deepseek-v4-pro");
  ASSERT_TRUE(g.ok() && m.ok());
  ServingOptions o;
  o.tp = 8;
  o.dp = 8;
  o.running_per_rank = 384 / 8;
  auto b = ComputeHbmBudget(*g, *m, o);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(b->gpus_per_rank, 1u);
  EXPECT_DOUBLE_EQ(b->usable_bytes, 288e9 * 0.9);
  EXPECT_DOUBLE_EQ(b->expert_bytes, 1572.8e9 * 0.53125 / 8);      // 104.4 GB
  EXPECT_NEAR(b->dense_bytes, (1600 - 1572.8) * 1e9 * 1.1, 1e3);  // 29.9 GB on every rank
  EXPECT_DOUBLE_EQ(b->kv_gpu_bytes, b->usable_bytes - b->expert_bytes - b->dense_bytes);
  EXPECT_DOUBLE_EQ(b->kv_bytes, b->kv_gpu_bytes);
  EXPECT_DOUBLE_EQ(b->fixed_bytes, 48 * KvBytesPerRunningRequest(m->kv_layout));
  EXPECT_EQ(b->tokens, static_cast<uint64_t>((b->kv_bytes - b->fixed_bytes) / b->token_bytes));
  EXPECT_NEAR(static_cast<double>(b->tokens), 11.28e6, 0.01e6);
  // H200 does not hold the weights under DEP8: nothing is left.
  auto h200 = LoadGpuProfile("h200");
  ASSERT_TRUE(h200.ok());
  auto none = ComputeHbmBudget(*h200, *m, o);
  ASSERT_TRUE(none.ok());
  EXPECT_LT(none->kv_gpu_bytes, 0);
  EXPECT_EQ(none->tokens, 0u);
}

// A one-number profile is one full-attention group: its per-token bytes, dtype rescaling and
// pool are what they were before the groups.
TEST(KvGroupLayout, DenseModelUnchanged) {
  auto m = LoadModelProfile("llama-3.1-8b");
  auto g = LoadGpuProfile("h100");
  ASSERT_TRUE(m.ok() && g.ok());
  ASSERT_EQ(m->kv_layout.groups.size(), 1u);
  EXPECT_EQ(m->kv_layout.groups[0].kind, KvGroupKind::kFull);
  EXPECT_EQ(m->KvBytesPerToken(), 32u * 8 * 128 * 2 * 2);
  EXPECT_EQ(m->KvBytesPerToken("fp8"), 32u * 8 * 128 * 2);
  EXPECT_EQ(m->KvBytesPerToken("int3"), 0u);
  EXPECT_DOUBLE_EQ(KvBytesForTokens(m->kv_layout, 1000), 1000.0 * 131072);
  EXPECT_DOUBLE_EQ(KvBytesPerRunningRequest(m->kv_layout), 0);
  ServingOptions o;
  o.tp = 2;
  o.dp = 2;
  o.running_per_rank = 16;
  auto b = ComputeHbmBudget(*g, *m, o);
  ASSERT_TRUE(b.ok());
  // 0.9 x tp x HBM - weights per replica, split between the ranks.
  const double replica = 0.9 * 2 * 80e9 - 8.03e9 * 2;
  EXPECT_NEAR(b->kv_bytes * 2, replica, 1);
  EXPECT_EQ(b->tokens, static_cast<uint64_t>(replica / 2 / 131072));
}

TEST(KvGroupLayout, PagesArePaddedAndBadGroupsNameTheField) {
  const char* json = R"({"block_tokens": 256, "groups": [
      {"name": "c128", "kind": "compressed", "layers": 2, "ratio": 128, "entry_bytes": 584,
       "page_align": 576},
      {"name": "gqa", "kind": "full", "layers": 4, "heads": 8, "head_dim": 128, "dtype": "bf16"},
      {"name": "mamba", "kind": "state", "layers": 3, "slots": 1, "entry_bytes": 1000}]})";
  auto l = ParseKvGroupLayout(nlohmann::json::parse(json), "t.json");
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  // 2 entries x 584 = 1168 B, padded to 3 x 576.
  EXPECT_DOUBLE_EQ(GroupBytes(*l, l->groups[0]).page_bytes, 1728);
  EXPECT_DOUBLE_EQ(GroupBytes(*l, l->groups[0]).per_token, 2 * 1728.0 / 256);
  // K and V of 8 heads x 128 at 2 B; at fp8 half of it.
  EXPECT_DOUBLE_EQ(l->groups[1].entry_bytes, 2 * 8 * 128 * 2);
  EXPECT_DOUBLE_EQ(GroupBytes(*l, l->groups[1], "fp8").per_token, 4 * 2 * 8 * 128);
  EXPECT_DOUBLE_EQ(KvBytesPerRunningRequest(*l), 3000);
  EXPECT_DOUBLE_EQ(KvBytesForTokens(*l, 10), 2 * 1728.0 + 4 * 256 * 4096.0 + 3000);

  auto bad = ParseKvGroupLayout(nlohmann::json::parse(R"({"groups": [{"name": "w",
      "kind": "sliding_window", "layers": 1, "entry_bytes": 8}]})"),
                                "t.json");
  EXPECT_EQ(bad.status().message(),
            "t.json: kv_layout group 'w': a sliding window needs 'window' > 0");
  auto kind =
      ParseKvGroupLayout(nlohmann::json::parse(R"({"groups": [{"kind": "ssm"}]})"), "t.json");
  EXPECT_EQ(kind.status().code(), StatusCode::kInvalidArgument);
}

TEST(KvGroupLayout, TheLibrarysStorageLayoutIsPricedByTheSameAccounting) {
  // Gemma 2-like: a 32-token window on 2 layers beside 2 full layers, fp32, 32-token pages.
  KvLayout lib;
  lib.block_tokens = 128;
  KvLayoutGroup sw;
  sw.kind = kvtier::KvGroupKind::kSlidingWindow;
  sw.num_layers = 2;
  sw.num_kv_heads = 2;
  sw.head_dim = 64;
  sw.dtype = DType::kFp32;
  sw.window = 32;
  sw.page_tokens = 32;
  KvLayoutGroup full = sw;
  full.kind = kvtier::KvGroupKind::kFull;
  full.window = 0;
  full.page_tokens = 0;
  lib.groups = {sw, full};
  ASSERT_TRUE(lib.Validate().ok());
  KvGroupLayout s = FromStorageLayout(lib);
  ASSERT_TRUE(s.Validate().ok());
  ASSERT_EQ(s.groups.size(), 2u);
  EXPECT_EQ(s.groups[0].kind, KvGroupKind::kSlidingWindow);
  EXPECT_EQ(s.groups[1].kind, KvGroupKind::kFull);
  EXPECT_EQ(s.block_tokens, 32u);
  const double per_token_layer = 2.0 * 2 * 64 * 4;
  // 1000 tokens: full layers hold every token (32 whole pages), sliding ones their window.
  EXPECT_DOUBLE_EQ(KvBytesForTokens(s, 1000),
                   2 * 1024 * per_token_layer + 2 * 32 * per_token_layer);
  // An ungrouped MLA layout is one latent group of its width.
  KvLayout mla{4, 1, 576, DType::kBf16, 128, AttentionKind::kMla};
  KvGroupLayout m = FromStorageLayout(mla);
  ASSERT_EQ(m.groups.size(), 1u);
  EXPECT_EQ(m.groups[0].kind, KvGroupKind::kLatent);
  EXPECT_DOUBLE_EQ(m.groups[0].entry_bytes, 576.0 * 2);
}

}  // namespace
}  // namespace kvtier::sim
