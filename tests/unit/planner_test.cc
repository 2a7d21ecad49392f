// Planner: the cheapest of load / recompute / split under the calibrated cost model, profile
// JSON, and the prefill fit.
#include "kvtier/planner.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace kvtier {
namespace {

CostProfile Profile(double bytes_per_s, double latency_s = 0) {
  CostProfile p;
  p.machine = "test";
  p.model = "m";
  p.block_tokens = 64;
  p.block_bytes = 1 << 20;
  p.prefill = {1e-3, 1e-5, 1e-8};
  p.tiers.push_back({"host", latency_s, bytes_per_s});
  return p;
}

PlanRequest Request(uint32_t tokens, uint32_t blocks, int tier = 0, uint32_t resident = 0) {
  PlanRequest r;
  r.prompt_tokens = tokens;
  r.resident_blocks = resident;
  r.block_tier.assign(blocks, tier);
  return r;
}

// The cost of recomputing r of the run's blocks and loading the rest, by the formula.
double CostOf(const CostProfile& p, const PlanRequest& req, uint32_t run, uint32_t r) {
  const double bt = p.block_tokens, c0 = req.resident_blocks * bt, end = c0 + run * bt;
  double load = 0;
  if (r < run) {
    load = p.tiers[0].latency_s + (run - r) * double(p.block_bytes) / p.tiers[0].bytes_per_s;
  }
  return p.prefill.fixed_s + p.prefill.Compute(r * bt, c0) + load +
         p.prefill.Compute(req.prompt_tokens - end, end);
}

TEST(Planner, FastTierLoadsEverything) {
  Planner planner(Profile(100e9));
  Plan plan = planner.Choose(Request(64 * 10 + 5, 10));
  EXPECT_EQ(plan.choice, PlanChoice::kLoad);
  EXPECT_EQ(plan.load_blocks, 10u);
  EXPECT_EQ(plan.recompute_blocks, 0u);
  EXPECT_LT(plan.predicted_s, plan.recompute_all_s);
  EXPECT_DOUBLE_EQ(plan.predicted_s, plan.load_all_s);
}

TEST(Planner, SlowTierRecomputes) {
  Planner planner(Profile(1e6, 0.5));
  Plan plan = planner.Choose(Request(64 * 4 + 1, 4));
  EXPECT_EQ(plan.choice, PlanChoice::kRecompute);
  EXPECT_EQ(plan.load_blocks, 0u);
  EXPECT_EQ(plan.recompute_blocks, 4u);
  EXPECT_DOUBLE_EQ(plan.predicted_s, plan.recompute_all_s);
}

TEST(Planner, SplitRecomputesTheCheapHeadAndLoadsTheTail) {
  // Loading costs 1 ms a block; computing a block costs less than that below ~22 blocks of
  // context and more above, so the best plan recomputes a head and loads the tail.
  CostProfile p = Profile(1e9 * 1.048576);
  p.prefill = {1e-3, 1e-6, 1e-8};
  Planner planner(p);
  PlanRequest req = Request(64 * 40 + 1, 40);
  Plan plan = planner.Choose(req);
  EXPECT_EQ(plan.choice, PlanChoice::kSplit) << plan.ToString();
  EXPECT_EQ(plan.recompute_blocks + plan.load_blocks, 40u);
  double best = std::numeric_limits<double>::infinity();
  uint32_t best_r = 0;
  for (uint32_t r = 0; r <= 40; ++r) {
    const double c = CostOf(p, req, 40, r);
    if (c < best - 1e-15) {
      best = c;
      best_r = r;
    }
  }
  EXPECT_EQ(plan.recompute_blocks, best_r);
  EXPECT_NEAR(plan.predicted_s, best, 1e-12);
  EXPECT_GT(best_r, 15u);
  EXPECT_LT(best_r, 30u);
  EXPECT_LT(plan.predicted_s, plan.load_all_s);
  EXPECT_LT(plan.predicted_s, plan.recompute_all_s);
}

TEST(Planner, NeverLoadsTheLastTokensBlockAndStopsAtUnknownTiers) {
  Planner planner(Profile(100e9));
  Plan plan = planner.Choose(Request(128, 2));  // block 1 holds token 127
  EXPECT_EQ(plan.load_blocks, 1u);
  PlanRequest req = Request(64 * 8 + 1, 6);
  req.block_tier[3] = 7;  // no such tier in the profile
  plan = planner.Choose(req);
  EXPECT_EQ(plan.load_blocks, 3u);
  EXPECT_EQ(planner.Choose(Request(64, 0)).choice, PlanChoice::kRecompute);
  // Resident blocks are free and shift the run.
  plan = planner.Choose(Request(64 * 8 + 1, 6, 0, /*resident=*/2));
  EXPECT_EQ(plan.load_blocks, 6u);
}

TEST(Planner, InvalidProfileAlwaysRecomputesAndDecisionsAreReported) {
  CostProfile bad = Profile(100e9);
  bad.tiers[0].bytes_per_s = 0;
  EXPECT_FALSE(bad.Validate().ok());
  int calls = 0;
  Planner planner(bad, [&](const PlanRequest&, const Plan& p) {
    ++calls;
    EXPECT_EQ(p.choice, PlanChoice::kRecompute);
  });
  EXPECT_EQ(planner.Choose(Request(1000, 10)).load_blocks, 0u);
  EXPECT_EQ(calls, 1);
}

TEST(Planner, LatencyIsPaidOncePerTier) {
  CostProfile p = Profile(100e9, 1e-4);
  p.tiers.push_back({"disk", 2e-4, 50e9});
  Planner planner(p);
  EXPECT_NEAR(planner.LoadSeconds(0, 4), 1e-4 + 4.0 * (1 << 20) / 100e9, 1e-12);
  EXPECT_EQ(planner.LoadSeconds(1, 0), 0);
  PlanRequest req = Request(64 * 5 + 1, 4);
  req.block_tier = {0, 0, 1, 1};
  Plan plan = planner.Choose(req);
  ASSERT_EQ(plan.choice, PlanChoice::kLoad);
  const double want = p.prefill.fixed_s + p.prefill.Compute(65, 256) + planner.LoadSeconds(0, 2) +
                      planner.LoadSeconds(1, 2);
  EXPECT_NEAR(plan.load_all_s, want, 1e-12);
}

TEST(Planner, LoadFixedCostIsPaidOncePerLoadingRequestAndMovesTheCrossover) {
  CostProfile p = Profile(100e9, 1e-4);
  p.tiers.push_back({"disk", 2e-4, 50e9});
  p.load_fixed_s = 0.013;
  Planner planner(p);
  PlanRequest req = Request(64 * 5 + 1, 4);
  req.block_tier = {0, 0, 1, 1};
  Plan plan = planner.Choose(req);
  // Two tiers, one fixed cost: the request pays it once, on top of each tier's batch.
  const double want = p.load_fixed_s + p.prefill.fixed_s + p.prefill.Compute(65, 256) +
                      planner.LoadSeconds(0, 2) + planner.LoadSeconds(1, 2);
  EXPECT_NEAR(plan.load_all_s, want, 1e-12);
  // Recomputing everything does not pay it.
  EXPECT_NEAR(plan.recompute_all_s, p.prefill.fixed_s + p.prefill.Compute(64 * 5 + 1, 0), 1e-12);
  // Without the fixed cost a 4-block load wins; with 13 ms it does not (recompute is ~1.3 ms).
  CostProfile free_load = p;
  free_load.load_fixed_s = 0;
  EXPECT_EQ(Planner(free_load).Choose(req).choice, PlanChoice::kLoad);
  EXPECT_EQ(plan.choice, PlanChoice::kRecompute);
}

TEST(Planner, ContextCapLimitsAttentionAndStaysAdditive) {
  PrefillCost c{0, 0, 1, 0};
  EXPECT_DOUBLE_EQ(c.Pairs(100, 0), 100.0 * 100 / 2);
  c.context_cap_tokens = 40;
  // Positions 0..40 attend to p keys, the 60 after to 40 each.
  EXPECT_DOUBLE_EQ(c.Pairs(100, 0), 40.0 * 40 / 2 + 60 * 40);
  EXPECT_DOUBLE_EQ(c.Pairs(30, 70), 30.0 * 40);
  for (double split : {10.0, 40.0, 77.0}) {
    EXPECT_NEAR(c.Compute(split, 5) + c.Compute(100 - split, 5 + split), c.Compute(100, 5), 1e-9);
  }
  CostProfile p = Profile(7.5e9);
  p.prefill.context_cap_tokens = 2048;
  p.load_fixed_s = 0.01;
  Result<CostProfile> back = ParseCostProfile(CostProfileToJson(p), "x.json");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_DOUBLE_EQ(back->prefill.context_cap_tokens, 2048);
  EXPECT_DOUBLE_EQ(back->load_fixed_s, 0.01);
  p.load_fixed_s = -1;
  EXPECT_NE(p.Validate().message().find("load_fixed_s"), std::string::npos);
}

TEST(Planner, PrefixPlanLoadsTheFastHeadAndComputesBehindASlowTail) {
  // Host blocks first, then remote blocks behind a 30 ms round trip: loading the host head
  // pays, the remote tail does not (its 8 blocks compute in well under 30 ms).
  CostProfile p = Profile(10e9, 20e-6);
  p.tiers.push_back({"remote", 30e-3, 1e9});
  Planner planner(p);
  PlanRequest req = Request(64 * 20 + 1, 12, 0);
  req.block_tier.insert(req.block_tier.end(), 8, 1);
  Plan plan = planner.ChoosePrefix(req);
  EXPECT_EQ(plan.choice, PlanChoice::kSplit) << plan.ToString();
  EXPECT_EQ(plan.load_blocks, 12u);
  EXPECT_EQ(plan.recompute_blocks, 8u);
  EXPECT_LT(plan.predicted_s, plan.load_all_s);
  EXPECT_LT(plan.predicted_s, plan.recompute_all_s);
  // Every other L costs at least as much, by the formula.
  for (uint32_t l = 0; l <= 20; ++l) {
    const uint32_t host = std::min(l, 12u), remote = l > 12 ? l - 12 : 0;
    double load = 0;
    if (host) load += 20e-6 + host * double(p.block_bytes) / 10e9;
    if (remote) load += 30e-3 + remote * double(p.block_bytes) / 1e9;
    const double end = l * 64.0;
    const double cost = p.prefill.fixed_s + load + p.prefill.Compute(req.prompt_tokens - end, end);
    EXPECT_GE(cost, plan.predicted_s - 1e-12) << "L = " << l;
  }
  // A fast tier loads all; a slow one loads nothing.
  EXPECT_EQ(Planner(Profile(100e9)).ChoosePrefix(Request(64 * 10 + 5, 10)).choice,
            PlanChoice::kLoad);
  Plan none = Planner(Profile(1e6, 0.5)).ChoosePrefix(Request(64 * 4 + 1, 4));
  EXPECT_EQ(none.choice, PlanChoice::kRecompute);
  EXPECT_EQ(none.load_blocks, 0u);
  EXPECT_DOUBLE_EQ(none.predicted_s, none.recompute_all_s);
}

TEST(Planner, CrossoverIsWhereLoadingStartsToWin) {
  Planner planner(Profile(2e9, 5e-3));
  const uint64_t x = planner.CrossoverTokens(0);
  ASSERT_GT(x, 64u);
  EXPECT_LT(planner.LoadAllSeconds(0, x), planner.RecomputeAllSeconds(x));
  EXPECT_GE(planner.LoadAllSeconds(0, x - 1), planner.RecomputeAllSeconds(x - 1));
  // ChoosePrefix agrees on either side of it.
  EXPECT_EQ(planner.ChoosePrefix(Request(uint32_t(x), uint32_t((x - 1) / 64))).choice,
            PlanChoice::kLoad);
  EXPECT_EQ(Planner(Profile(1e3, 10)).CrossoverTokens(0, 1 << 16), 0u);
  EXPECT_EQ(planner.CrossoverTokens(5), 0u);  // no such tier
}

TEST(PlannerProfile, JsonRoundTripAndNamedErrors) {
  CostProfile p = Profile(7.5e9, 2e-5);
  p.threads = 2;
  Result<CostProfile> back = ParseCostProfile(CostProfileToJson(p), "x.json");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->block_bytes, p.block_bytes);
  EXPECT_EQ(back->threads, 2);
  EXPECT_DOUBLE_EQ(back->prefill.per_token_context_s, p.prefill.per_token_context_s);
  ASSERT_EQ(back->tiers.size(), 1u);
  EXPECT_EQ(back->tiers[0].name, "host");
  EXPECT_DOUBLE_EQ(back->tiers[0].bytes_per_s, 7.5e9);
  EXPECT_EQ(back->FindTier("host"), 0);
  EXPECT_EQ(back->FindTier("disk"), -1);

  Status st = ParseCostProfile(
                  R"({"block_tokens": 64, "block_bytes": 10,
                      "prefill": {"fixed_s": 0, "per_token_s": "fast", "per_token_context_s": 0}})",
                  "cal.json")
                  .status();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("cal.json.prefill.per_token_s"), std::string::npos) << st.message();
  st = ParseCostProfile("{not json", "cal.json").status();
  EXPECT_NE(st.message().find("cal.json"), std::string::npos);
  st = ParseCostProfile(
           R"({"block_tokens": 64, "block_bytes": 10,
               "prefill": {"fixed_s": 0, "per_token_s": 1, "per_token_context_s": 0},
               "tiers": [{"name": "host", "latency_s": 0, "bytes_per_s": -1}]})",
           "cal.json")
           .status();
  EXPECT_NE(st.message().find("tiers[0].bytes_per_s"), std::string::npos) << st.message();
  EXPECT_EQ(LoadCostProfile("/nonexistent/kvtier.json").status().code(), StatusCode::kNotFound);
}

TEST(PlannerProfile, FitRecoversTheCoefficients) {
  const PrefillCost truth{0.004, 2.5e-4, 3e-8};
  std::vector<PrefillSample> samples;
  for (double t : {64.0, 256.0, 1024.0, 4096.0}) {
    for (double c : {0.0, 2048.0}) {
      samples.push_back({t, c, truth.fixed_s + truth.Compute(t, c)});
    }
  }
  Result<PrefillCost> fit = FitPrefillCost(samples);
  ASSERT_TRUE(fit.ok()) << fit.status().ToString();
  EXPECT_NEAR(fit->fixed_s, truth.fixed_s, truth.fixed_s * 1e-6);
  EXPECT_NEAR(fit->per_token_s, truth.per_token_s, truth.per_token_s * 1e-6);
  EXPECT_NEAR(fit->per_token_context_s, truth.per_token_context_s,
              truth.per_token_context_s * 1e-6);
  EXPECT_FALSE(FitPrefillCost({samples[0], samples[1]}).ok());
  std::vector<PrefillSample> same(4, samples[0]);  // one point repeated: singular
  EXPECT_FALSE(FitPrefillCost(same).ok());
}

}  // namespace
}  // namespace kvtier
