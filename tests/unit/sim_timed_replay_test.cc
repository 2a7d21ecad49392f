// Timed replay: sub-agent and think-time timing, determinism, tiers and the load-vs-recompute
// planner behave as the cost model says. The hand trace here also checks the cache-only
// per-request mean and the trace statistics.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>

#include "sim/cache_replay.h"
#include "sim/profiles.h"
#include "sim/report.h"
#include "sim/timed_replay.h"
#include "sim/trace_stats.h"
#include "workload/readers.h"

namespace kvtier::sim {
namespace {

std::vector<uint64_t> Ids(uint64_t from, uint64_t n) {
  std::vector<uint64_t> v;
  for (uint64_t i = 0; i < n; ++i) v.push_back(from + i);
  return v;
}

std::string IdList(const std::vector<uint64_t>& v) {
  std::string s;
  for (auto x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s;
}

workload::Trace HandTrace() {
  const std::string json =
      R"({"id":"hand","block_size":64,"requests":[
      {"t":0,"type":"n","in":640,"out":10,"hash_ids":[)" +
      IdList(Ids(1, 10)) + R"(]},
      {"t":10,"type":"subagent","agent_id":"a1","requests":[
        {"t":0,"type":"n","in":128,"out":4,"hash_ids":[100,101]},
        {"t":5,"type":"n","in":192,"out":4,"hash_ids":[100,101,102],"think_time":3}]},
      {"t":30,"type":"n","in":704,"out":10,"think_time":20,"hash_ids":[)" +
      IdList(Ids(1, 11)) + R"(]}]})";
  auto t = workload::ParseAgentX(json, "hand.json");
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return std::move(t).value();
}

struct Hw {
  GpuProfile gpu;
  ModelProfile model;
};

Hw LoadHw(const char* gpu, const char* model) {
  auto g = LoadGpuProfile(gpu);
  auto m = LoadModelProfile(model);
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return {*g, *m};
}

TEST(TimedReplay, SubAgentsStartAtTheirOffsetAndRequestsWaitTheirThinkTime) {
  const workload::Trace t = HandTrace();
  const Hw hw = LoadHw("h200", "llama-3.1-8b");
  TimedOptions o;
  o.concurrency = 1;
  o.record_requests = true;
  auto r = ReplayTimed(std::span<const workload::Trace>(&t, 1), hw.gpu, hw.model, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->requests, 4u);
  ASSERT_EQ(r->log.size(), 4u);
  std::map<std::pair<uint32_t, uint32_t>, RequestRecord> by;
  for (const auto& rec : r->log) by[std::make_pair(rec.session, rec.request)] = rec;
  const RequestRecord p0 = by[std::make_pair(0u, 0u)], p1 = by[std::make_pair(0u, 1u)];
  const RequestRecord s0 = by[std::make_pair(1u, 0u)], s1 = by[std::make_pair(1u, 1u)];
  EXPECT_DOUBLE_EQ(p0.arrive_s, 0.0);
  EXPECT_DOUBLE_EQ(s0.arrive_s, 10.0);  // parent start + the sub-agent's t
  EXPECT_DOUBLE_EQ(s1.arrive_s, s0.done_s + 3.0);
  EXPECT_DOUBLE_EQ(p1.arrive_s, p0.done_s + 20.0);
  for (const auto& rec : r->log) {
    EXPECT_GT(rec.first_token_s, rec.arrive_s);
    EXPECT_GT(rec.done_s, rec.first_token_s);
  }
  // The parent's second request reuses its first 10 blocks from HBM.
  EXPECT_EQ(r->hbm_tokens, 640u + 128);
  EXPECT_DOUBLE_EQ(r->ideal_hit_rate, static_cast<double>(640 + 128) / (640 + 128 + 192 + 704));
}

std::vector<workload::Trace> Shipped() {
  const char* env = std::getenv("KVTIER_SHARED_DIR");
  const std::string dir = env ? std::string(env) + "/traces/agentx-weka" : "";
  if (dir.empty() || !std::filesystem::exists(dir)) return {};
  auto t = workload::LoadTraces(std::vector<std::string>{dir});
  return t.ok() ? std::move(t).value() : std::vector<workload::Trace>{};
}

TEST(TimedReplay, DeterministicAndMoreMemoryNeverRecomputesMore) {
  const auto traces = Shipped();
  if (traces.empty()) GTEST_SKIP() << "KVTIER_SHARED_DIR/traces/agentx-weka not found";
  const Hw hw = LoadHw("h200", "llama-3.1-70b");
  auto run = [&](double hbm_gb, bool host) {
    TimedOptions o;
    o.concurrency = 6;
    o.hbm_kv_bytes = static_cast<uint64_t>(hbm_gb * 1e9);
    o.host.enabled = host;
    auto r = ReplayTimed(traces, hw.gpu, hw.model, o);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return std::move(r).value();
  };
  const TimedResult a = run(20, false), b = run(20, false);
  EXPECT_EQ(a.recomputed, b.recomputed);
  EXPECT_DOUBLE_EQ(a.ttft_s.mean, b.ttft_s.mean);
  EXPECT_DOUBLE_EQ(a.makespan_s, b.makespan_s);
  const TimedResult big = run(200, false), offload = run(20, true);
  EXPECT_LT(big.recomputed, a.recomputed);
  EXPECT_LT(offload.recomputed, a.recomputed);  // host hits replace recompute
  EXPECT_GT(offload.host_tokens, 0u);
  EXPECT_EQ(a.host_tokens, 0u);
  EXPECT_EQ(a.prompt_tokens, a.hbm_tokens + a.recomputed);
  EXPECT_EQ(offload.prompt_tokens, offload.hbm_tokens + offload.host_tokens + offload.recomputed);
}

TEST(TimedReplay, PlannerRecomputesWhenTheTierIsSlowerThanPrefill) {
  const auto traces = Shipped();
  if (traces.empty()) GTEST_SKIP() << "KVTIER_SHARED_DIR/traces/agentx-weka not found";
  const Hw hw = LoadHw("h200", "llama-3.1-8b");
  auto run = [&](bool planner) {
    TimedOptions o;
    o.concurrency = 6;
    o.hbm_kv_bytes = 5'000'000'000;
    o.host.enabled = true;
    o.host.bandwidth_gbps = 0.05;  // a pathologically slow host link
    o.planner = planner;
    return std::move(ReplayTimed(traces, hw.gpu, hw.model, o)).value();
  };
  const TimedResult with = run(true), without = run(false);
  EXPECT_EQ(with.host_tokens, 0u);
  EXPECT_GT(with.loadable_recomputed, 0u);
  EXPECT_GT(without.host_tokens, 0u);
  EXPECT_LT(with.ttft_s.mean, without.ttft_s.mean);
}

TEST(TimedReplay, InferenceXMetricDefinitions) {
  const auto traces = Shipped();
  if (traces.empty()) GTEST_SKIP() << "KVTIER_SHARED_DIR/traces/agentx-weka not found";
  const Hw hw = LoadHw("h200", "llama-3.1-70b");
  TimedOptions o;
  o.concurrency = 4;
  o.hbm_kv_bytes = 20'000'000'000;
  o.host.enabled = true;
  auto r = ReplayTimed(traces, hw.gpu, hw.model, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  // Interactivity is 1 / percentile(ITL), p90 the headline; a slower percentile, less of it.
  EXPECT_DOUBLE_EQ(r->interactivity, 1.0 / r->itl_s.p90);
  EXPECT_DOUBLE_EQ(r->interactivity_p50, 1.0 / r->itl_s.p50);
  EXPECT_GE(r->interactivity_p50, r->interactivity_p75);
  EXPECT_GE(r->interactivity_p75, r->interactivity);
  // Throughput per GPU counts every prompt token, cached ones included.
  const double gpus = r->replicas * r->tp;
  EXPECT_NEAR(r->input_tokens_per_s_per_gpu, r->prompt_tokens / r->measured_s / gpus, 1e-6);
  EXPECT_NEAR(r->total_tokens_per_s_per_gpu,
              (r->prompt_tokens + r->output_tokens) / r->measured_s / gpus, 1e-6);
  // Shares of all prompt tokens.
  EXPECT_DOUBLE_EQ(r->hbm_hit_share(), static_cast<double>(r->hbm_tokens) / r->prompt_tokens);
  EXPECT_DOUBLE_EQ(r->dram_hit_share(), static_cast<double>(r->host_tokens) / r->prompt_tokens);
  EXPECT_NEAR(r->hbm_hit_share() + r->dram_hit_share(), r->hit_rate(), 1e-12);
  // Concurrency: live session trees, time-averaged; never above the target.
  EXPECT_GT(r->live_trees_mean, 1.0);
  EXPECT_LE(r->live_trees_mean, 4.0 + 1e-9);
  // Every report states its definitions.
  const nlohmann::json j = TimedJson(*r);
  for (const char* k : {"interactivity_tokens_per_s", "throughput_per_gpu", "hbm_hit_share",
                        "dram_hit_share", "concurrency_live_trees", "itl_s"}) {
    EXPECT_TRUE(j.contains(k)) << k;
    EXPECT_TRUE(j["metric_definitions"].contains(k)) << k;
  }
  const std::string html = TimedHtml({*r}, "t");
  EXPECT_NE(html.find("Definitions"), std::string::npos);
}

TEST(TimedReplay, AgentxRulesStartMidSessionWarmedAndMeasureAWindow) {
  const auto traces = Shipped();
  if (traces.empty()) GTEST_SKIP() << "KVTIER_SHARED_DIR/traces/agentx-weka not found";
  const Hw hw = LoadHw("h200", "llama-3.1-70b");
  auto run = [&](bool rules, uint64_t seed) {
    TimedOptions o;
    o.concurrency = 3;
    o.record_requests = true;
    o.agentx_rules = rules;
    o.seed = seed;
    if (rules) {
      o.warmup_s = 100;
      o.window_s = 900;
      o.max_idle_s = 300;
    }
    auto r = ReplayTimed(traces, hw.gpu, hw.model, o);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return std::move(r).value();
  };
  const TimedResult plain = run(false, 1), a = run(true, 1), b = run(true, 1), c = run(true, 7);
  EXPECT_EQ(a.prompt_tokens, b.prompt_tokens);  // seeded
  EXPECT_NE(a.prompt_tokens, c.prompt_tokens);
  EXPECT_DOUBLE_EQ(a.measured_s, 900);
  EXPECT_DOUBLE_EQ(a.window_start_s, 100);
  // Top-level sessions with several requests start 25-75% in: their first replayed request is
  // never request 0, and it finds its context warm in HBM.
  std::map<std::pair<uint32_t, uint32_t>, uint32_t> first;
  for (const auto& rec : a.log) {
    const auto key = std::make_pair(rec.trace, rec.session);
    if (!first.count(key) || rec.request < first[key]) first[key] = rec.request;
  }
  int checked = 0;
  for (const auto& [key, req] : first) {
    const auto& sess = traces[key.first].sessions[key.second];
    if (sess.parent >= 0 || sess.requests.size() < 4) continue;
    EXPECT_GT(req, 0u) << "trace " << key.first;
    const double t0 = sess.requests.front().start_s, span = sess.requests.back().start_s - t0;
    EXPECT_GE(sess.requests[req].start_s - t0, 0.25 * span - 1e-9);
    ++checked;
  }
  EXPECT_GT(checked, 0);
  // Measured requests arrive inside the window; the idle cap bounds every think gap.
  uint64_t in_window = 0;
  for (const auto& rec : a.log) in_window += rec.arrive_s >= 100 && rec.arrive_s < 1000;
  EXPECT_EQ(a.requests, in_window);
  EXPECT_GT(a.hit_rate(), 0.5);  // warmed contexts: high reuse from the first measured request
  EXPECT_GT(plain.requests, 0u);
}

TEST(TimedReplay, DataParallelRanksKeepSessionsOnTheirRankUnderAffinity) {
  const auto traces = Shipped();
  if (traces.empty()) GTEST_SKIP() << "KVTIER_SHARED_DIR/traces/agentx-weka not found";
  const Hw hw = LoadHw("h200", "llama-3.1-70b");
  auto run = [&](uint32_t dp, bool round_robin) {
    TimedOptions o;
    o.concurrency = 6;
    o.hbm_kv_bytes = 4'000'000'000'000;  // no rank runs out: routing alone decides
    o.dp = dp;
    o.dp_round_robin = round_robin;
    return std::move(ReplayTimed(traces, hw.gpu, hw.model, o)).value();
  };
  const TimedResult one = run(1, false), aff = run(4, false), rr = run(4, true);
  // Affinity: a session's blocks stay on its rank; only what a sub-agent shares with its parent
  // (hashed to its own rank) is lost to the split.
  EXPECT_GE(aff.recomputed, one.recomputed);
  EXPECT_NEAR(aff.hit_rate(), one.hit_rate(), 0.02);
  // Round-robin sends a request to a rank holding at best an older prefix of its context.
  EXPECT_LT(rr.hit_rate(), aff.hit_rate() - 0.1) << rr.hit_rate() << " vs " << aff.hit_rate();
  EXPECT_EQ(rr.dp, 4u);
}

TEST(TimedReplay, Fp8KvAndSpeculativeDecoding) {
  const workload::Trace t = HandTrace();
  const Hw hw = LoadHw("h200", "llama-3.1-8b");
  TimedOptions o;
  o.concurrency = 1;
  const TimedResult base =
      std::move(ReplayTimed(std::span<const workload::Trace>(&t, 1), hw.gpu, hw.model, o)).value();
  o.kv_dtype = "fp8";
  o.spec_acceptance_length = 2;
  const TimedResult fast =
      std::move(ReplayTimed(std::span<const workload::Trace>(&t, 1), hw.gpu, hw.model, o)).value();
  EXPECT_EQ(fast.block_bytes * 2, base.block_bytes);
  // Two tokens a step, each step a little cheaper (fp8 KV): under half the ITL.
  EXPECT_LT(fast.itl_s.p50, base.itl_s.p50 / 2);
  EXPECT_GT(fast.itl_s.p50, base.itl_s.p50 / 2 * 0.9);
  o.kv_dtype = "int3";
  EXPECT_FALSE(ReplayTimed(std::span<const workload::Trace>(&t, 1), hw.gpu, hw.model, o).ok());
}

// Mooncake FAST'25's per-request mean beside the token-weighted hit rate.
TEST(CacheOnly, PerRequestMeanIsTheMeanOfEachRequestsShare) {
  const workload::Trace t = HandTrace();
  auto stream = workload::StreamTraces(std::span<const workload::Trace>(&t, 1));
  CacheReplayOptions o;
  o.policy = "ideal";
  auto r = ReplayCacheOnly(*stream, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  // Requests: 640 (0 hit), 128 (0), 192 (128 hit), 704 (640 hit).
  EXPECT_DOUBLE_EQ(r->hit_rate(), (128.0 + 640) / (640 + 128 + 192 + 704));
  EXPECT_DOUBLE_EQ(r->per_request_mean_hit_rate(), (128.0 / 192 + 640.0 / 704) / 4);
}

TEST(TraceStats, ConsecutiveOverlapPerConversation) {
  const workload::Trace t = HandTrace();
  workload::Trace other = HandTrace();
  other.name = "other";
  other.sessions.resize(1);  // the parent alone: 640 of 640 + 704 tokens overlap
  const std::vector<workload::Trace> ts = {t, other};
  const TraceStatsSummary s = ComputeTraceStats(ts);
  ASSERT_EQ(s.conversations.size(), 2u);
  // Parent: request 2 repeats request 1's 10 blocks; sub-agent: 2 blocks of its first request.
  EXPECT_EQ(s.conversations[0].overlap_tokens, 640u + 128);
  EXPECT_EQ(s.conversations[0].prompt_tokens, 640u + 704 + 128 + 192);
  const double a = 768.0 / 1664, b = 640.0 / 1344;
  EXPECT_DOUBLE_EQ(s.min, std::min(a, b));
  EXPECT_DOUBLE_EQ(s.mean, (a + b) / 2);
  EXPECT_DOUBLE_EQ(s.median, (a + b) / 2);
  EXPECT_DOUBLE_EQ(s.p25, std::min(a, b) + 0.25 * std::fabs(a - b));
}

}  // namespace
}  // namespace kvtier::sim
