// The multi-turn driver, calibration and the crossover sweep on the tiny model: every turn and
// point is checked bit for bit against a full recompute, reuse really comes from the pool and
// the host tier, and the reported figures are consistent with the per-point measurements.
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "engine/driver.h"
#include "engine/measure.h"
#include "engine/setup.h"

namespace kvtier::engine {
namespace {

EngineOptions Tiny(uint64_t pool_blocks) {
  EngineOptions o;
  o.model = "tiny";
  o.block_tokens = 16;
  o.pool_blocks = pool_blocks;
  o.threads = 1;
  return o;
}

TEST(EngineDriver, SessionsReuseThePoolAndTheHostAndMatchTheRecompute) {
  SetBlasThreads(1);
  // 14 blocks cannot hold 3 sessions' contexts: later turns must come back from host.
  Result<EngineSetup> s = BuildEngine(Tiny(14), 64 << 20);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  auto reference = Engine::CreateSharing(*s->engine, Tiny(64)).value();
  WorkloadOptions w;
  w.sessions = 3;
  w.turns = 3;
  w.system_tokens = 48;
  w.first_user_tokens = 40;
  w.turn_tokens = 30;
  w.decode_tokens = 3;
  uint32_t seen = 0;
  Result<WorkloadReport> rep =
      RunWorkload(s->engine.get(), reference.get(), w, [&](const TurnRecord&) { ++seen; });
  ASSERT_TRUE(rep.ok()) << rep.status().ToString();
  EXPECT_EQ(seen, 9u);
  EXPECT_EQ(rep->checked_turns, 9u);
  EXPECT_EQ(rep->bit_exact_turns, 9u);
  EXPECT_GT(rep->pool_hit_tokens, 0u);
  ASSERT_EQ(rep->tier_hit_tokens.size(), 1u);
  EXPECT_GT(rep->tier_hit_tokens[0], 0u);
  EXPECT_EQ(rep->prompt_tokens,
            rep->pool_hit_tokens + rep->tier_hit_tokens[0] + rep->computed_tokens);
  EXPECT_GT(rep->bytes_loaded, 0u);
  EXPECT_GT(rep->bytes_stored, 0u);
  EXPECT_GT(rep->speedup_median, 0);
  // Turn t of a session resends turn t-1's prompt plus its reply plus new tokens.
  EXPECT_EQ(rep->turns[3].reuse.prompt_tokens, 48u + 40 + 3 + 30);
  nlohmann::json j = nlohmann::json::parse(rep->ToJson());
  EXPECT_EQ(j["turns"].size(), 9u);
  EXPECT_EQ(j["bit_exact_turns"], 9);
  EXPECT_EQ(j["checked_turns"], 9);
  EXPECT_TRUE(j.contains("speedup_median"));
  EXPECT_TRUE(j["turns"][4].contains("recompute_ttft_ms"));

  w.sessions = 0;
  EXPECT_EQ(RunWorkload(s->engine.get(), nullptr, w).status().code(), StatusCode::kInvalidArgument);
}

// A workload whose last turn exceeds the model's positions computed every turn before it (7 s
// of demo --decode 100000) and only then failed: it is refused before the first turn.
TEST(EngineDriver, WorkloadLongerThanTheModelIsRefusedBeforeAnyTurn) {
  SetBlasThreads(1);
  WorkloadOptions w;
  w.sessions = 1;
  w.turns = 3;
  w.system_tokens = 48;
  w.first_user_tokens = 40;
  w.turn_tokens = 30;
  w.decode_tokens = 2000;  // tiny has 4096 positions: turn 2 holds 4000+ prompt tokens
  Result<EngineSetup> s = BuildEngine(Tiny(WorkloadPoolBlocks(w, 16)), 64 << 20);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  uint32_t seen = 0;
  Result<WorkloadReport> rep =
      RunWorkload(s->engine.get(), nullptr, w, [&](const TurnRecord&) { ++seen; });
  ASSERT_EQ(rep.status().code(), StatusCode::kInvalidArgument) << rep.status().ToString();
  EXPECT_NE(rep.status().message().find("positions"), std::string::npos) << rep.status().message();
  EXPECT_EQ(seen, 0u);
}

TEST(EngineDriver, CalibrationAndCrossoverAreConsistent) {
  SetBlasThreads(1);
  Result<EngineSetup> s = BuildEngine(Tiny(64), 64 << 20);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  CalibrationOptions copt;
  copt.prompt_lengths = {32, 64, 128};
  copt.context_tokens = 128;
  copt.tier_batch_blocks = 8;
  copt.reps = 1;
  Result<Calibration> cal = Calibrate(s->engine.get(), copt);
  ASSERT_TRUE(cal.ok()) << cal.status().ToString();
  EXPECT_TRUE(cal->profile.Validate().ok());
  EXPECT_EQ(cal->profile.block_tokens, 16u);
  EXPECT_EQ(cal->profile.block_bytes, s->engine->layout().bytes_per_block());
  ASSERT_EQ(cal->profile.tiers.size(), 1u);
  EXPECT_EQ(cal->profile.tiers[0].name, "host");
  EXPECT_GT(cal->memcpy_bytes_per_s, 0);
  EXPECT_EQ(cal->prefill.size(), 5u);

  Planner planner(cal->profile);
  Result<CrossoverResult> x = RunCrossover(s->engine.get(), planner, {16, 32, 64, 128}, 1);
  ASSERT_TRUE(x.ok()) << x.status().ToString();
  ASSERT_EQ(x->points.size(), 4u);
  double chosen = 0, best = 0;
  for (const CrossoverPoint& p : x->points) {
    EXPECT_TRUE(p.bit_exact) << p.tokens;
    EXPECT_EQ(p.loaded_blocks, (p.tokens - 1) / 16) << p.tokens;
    EXPECT_GT(p.load_s, 0);
    EXPECT_GT(p.recompute_s, 0);
    chosen += p.chosen_s;
    best += std::min({p.load_s, p.recompute_s, p.split_s < 0 ? 1e9 : p.split_s});
  }
  EXPECT_EQ(x->points[0].plan.choice, PlanChoice::kRecompute);  // 16 tokens: nothing to load
  EXPECT_NEAR(x->regret_pct, 100 * (chosen - best) / best, 1e-9);
  nlohmann::json j = nlohmann::json::parse(x->ToJson());
  ASSERT_EQ(j["points"].size(), 4u);
  for (const char* key : {"tokens", "load_ms", "recompute_ms", "choice", "chosen_ms"}) {
    EXPECT_TRUE(j["points"][3].contains(key)) << key;
  }
  EXPECT_TRUE(j.contains("regret_pct"));
}

// `kvtier calibrate --block-tokens 16` ran out of its 64-block pool: the run needs 65. The
// sizes the CLI now gives its pools are exact: one block less fails, up front, naming it.
TEST(EngineDriver, PoolOfTheComputedSizeIsEnoughAndOneLessIsRefusedUpFront) {
  SetBlasThreads(1);
  EXPECT_EQ(TurnPoolBlocks(16, 1, 16), 1u);
  EXPECT_EQ(TurnPoolBlocks(17, 1, 16), 2u);
  EXPECT_EQ(TurnPoolBlocks(16, 2, 16), 2u);  // the first decoded token's KV starts block 2
  EXPECT_EQ(TurnPoolBlocks(15, 2, 16), 1u);  // the last decoded token has no KV
  EXPECT_EQ(TurnPoolBlocks(15, 0, 16), 1u);  // decode 0 runs as 1
  EXPECT_EQ(TurnPoolBlocks(0, 4, 16), 0u);
  CalibrationOptions defaults;
  EXPECT_EQ(CalibrationPoolBlocks(defaults, 16), 65u);  // 1024 tokens of context + 1 block
  EXPECT_EQ(CalibrationPoolBlocks(defaults, 64), 32u);  // the tier batch
  EXPECT_EQ(CrossoverPoolBlocks({16, 32, 64, 128}, 16), 8u);

  WorkloadOptions w;
  w.sessions = 2;
  w.turns = 2;
  w.system_tokens = 20;
  w.first_user_tokens = 20;
  w.turn_tokens = 10;
  w.decode_tokens = 3;
  EXPECT_EQ(w.MaxPromptTokens(), 53u);
  const uint64_t work_need = WorkloadPoolBlocks(w, 16);
  EXPECT_EQ(work_need, 4u);  // 53 + 3 - 1 positions
  CalibrationOptions copt;
  copt.prompt_lengths = {32, 64, 128};
  copt.context_tokens = 128;
  copt.tier_batch_blocks = 8;
  copt.reps = 1;
  const uint64_t cal_need = CalibrationPoolBlocks(copt, 16);
  EXPECT_EQ(cal_need, 9u);  // 128 tokens of context + 1 block
  const std::vector<uint32_t> lengths = {16, 32, 64, 128};
  const uint64_t cross_need = CrossoverPoolBlocks(lengths, 16);

  for (uint64_t pool : {work_need, work_need - 1}) {
    Result<EngineSetup> s = BuildEngine(Tiny(pool), 16 << 20);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    Result<WorkloadReport> rep = RunWorkload(s->engine.get(), nullptr, w);
    if (pool == work_need) {
      EXPECT_TRUE(rep.ok()) << rep.status().ToString();
    } else {
      EXPECT_EQ(rep.status().code(), StatusCode::kInvalidArgument) << rep.status().ToString();
      EXPECT_NE(rep.status().message().find("needs 4 blocks"), std::string::npos)
          << rep.status().message();
    }
  }
  for (uint64_t pool : {cal_need, cal_need - 1}) {
    Result<EngineSetup> s = BuildEngine(Tiny(pool), 16 << 20);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    Result<Calibration> cal = Calibrate(s->engine.get(), copt);
    if (pool == cal_need) {
      ASSERT_TRUE(cal.ok()) << cal.status().ToString();
    } else {
      EXPECT_EQ(cal.status().code(), StatusCode::kInvalidArgument) << cal.status().ToString();
      EXPECT_NE(cal.status().message().find("needs 9 blocks"), std::string::npos)
          << cal.status().message();
      continue;
    }
    Planner planner(cal->profile);
    for (uint64_t cross_pool : {cross_need, cross_need - 1}) {
      auto e = Engine::CreateSharing(*s->engine, Tiny(cross_pool)).value();
      ASSERT_TRUE(e->AttachCache(s->cache.get()).ok());
      Result<CrossoverResult> x = RunCrossover(e.get(), planner, lengths, 1);
      if (cross_pool == cross_need) {
        EXPECT_TRUE(x.ok()) << x.status().ToString();
      } else {
        EXPECT_EQ(x.status().code(), StatusCode::kInvalidArgument) << x.status().ToString();
        EXPECT_NE(x.status().message().find("needs 8 blocks"), std::string::npos)
            << x.status().message();
      }
    }
  }
}

}  // namespace
}  // namespace kvtier::engine
