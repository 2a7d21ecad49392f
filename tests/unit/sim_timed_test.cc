// Timed replay: sub-agent and think-time timing, determinism, tiers and the load-vs-recompute
// planner behave as the cost model says; profiles load and validate.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <map>

#include "sim/profiles.h"
#include "sim/timed_replay.h"
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
