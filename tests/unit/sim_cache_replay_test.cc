// Cache-only replay: LRU, LRU-tail, the ideal and Belady's MIN on hand-built traces whose
// results follow from the definition by hand, and on the shipped traces against an independent
// Python implementation of the same definition (tests/replay/cache_only_reference.py).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>

#include "sim/cache_compare.h"
#include "sim/cache_replay.h"
#include "workload/readers.h"

namespace kvtier::sim {
namespace {

using workload::MaterializedRequests;

struct Req {
  uint64_t session;
  uint32_t prompt;
  std::vector<uint64_t> ids;
};

MaterializedRequests Make(const std::vector<Req>& reqs, uint32_t block = 64) {
  MaterializedRequests m;
  for (const auto& r : reqs) m.ids.insert(m.ids.end(), r.ids.begin(), r.ids.end());
  size_t at = 0;
  const BlockKey root = Namespace{.model_id = "test"}.Root();
  for (size_t i = 0; i < reqs.size(); ++i) {
    workload::ReplayRequest q;
    q.session = reqs[i].session;
    q.start_s = static_cast<double>(i);
    q.prompt_tokens = reqs[i].prompt;
    q.block_tokens = block;
    q.root = root;
    q.ids = std::span<const uint64_t>(m.ids.data() + at, reqs[i].ids.size());
    at += reqs[i].ids.size();
    m.requests.push_back(q);
  }
  // First / last request of each session.
  std::map<uint64_t, size_t> last;
  for (size_t i = 0; i < m.requests.size(); ++i) {
    if (!last.count(m.requests[i].session)) m.requests[i].session_first = true;
    last[m.requests[i].session] = i;
  }
  for (auto& [s, i] : last) m.requests[i].session_last = true;
  return m;
}

uint64_t Hits(const MaterializedRequests& m, const std::string& policy, uint64_t capacity) {
  if (policy == "min") return ReplayBelady(m, capacity)->hit_tokens;
  auto stream = workload::StreamMaterialized(m);
  CacheReplayOptions o;
  o.policy = policy;
  o.capacity_tokens = capacity;
  auto r = ReplayCacheOnly(*stream, o);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? r->hit_tokens : 0;
}

// Two blocks of room. Session 1 sends [1,2], session 2 sends [3], session 1 comes back.
//  lru:      [1,2] touched 1 then 2, so inserting 3 evicts 1: the head is gone, 0 hits.
//  lru-tail: touched 2 then 1, so inserting 3 evicts 2: block 1 still hits, 64 tokens.
//  min:      3 is never used again, so MIN drops it: 128 tokens.
TEST(CacheOnly, TouchOrderDecidesWhatAChainKeeps) {
  const auto m = Make({{1, 128, {1, 2}}, {2, 64, {3}}, {1, 128, {1, 2}}});
  EXPECT_EQ(Hits(m, "lru", 128), 0u);
  EXPECT_EQ(Hits(m, "lru-tail", 128), 64u);
  EXPECT_EQ(Hits(m, "min", 128), 128u);
  EXPECT_EQ(Hits(m, "ideal", 0), 128u);
  // Capacity is floor(N / block size): 191 tokens still hold 2 blocks, 127 only 1.
  EXPECT_EQ(Hits(m, "lru-tail", 191), 64u);
  EXPECT_EQ(Hits(m, "lru-tail", 127), 0u);
}

// One block of room and two uses of the chain [1,2]: both blocks have the same next use, and
// only keeping the ancestor (1) scores. MIN must evict the descendant first.
TEST(CacheOnly, MinEvictsTheDescendantAmongEqualNextUses) {
  const auto m = Make({{1, 128, {1, 2}}, {1, 128, {1, 2}}});
  EXPECT_EQ(Hits(m, "min", 64), 64u);
  EXPECT_EQ(Hits(m, "min", 0), 0u);
  EXPECT_EQ(Hits(m, "min", 1 << 20), 128u);
}

TEST(CacheOnly, PartialLastBlockScoresOnlyThePromptTokens) {
  const auto m = Make({{1, 100, {7, 8}}, {1, 100, {7, 8}}, {1, 64, {7}}});
  EXPECT_EQ(Hits(m, "ideal", 0), 100u + 64);
  EXPECT_EQ(Hits(m, "lru", 1 << 20), 100u + 64);
}

TEST(CacheOnly, BlocksChainSoAnIdMeansNothingAfterADifferentPrefix) {
  // Id 2 after 9 is not id 2 after 1.
  const auto m = Make({{1, 128, {1, 2}}, {2, 128, {9, 2}}, {3, 128, {1, 5}}});
  EXPECT_EQ(Hits(m, "ideal", 0), 64u);  // only the third request's head [1]
}

TEST(CacheOnly, UnknownPolicyIsAnError) {
  const auto m = Make({{1, 64, {1}}});
  auto stream = workload::StreamMaterialized(m);
  CacheReplayOptions o;
  o.policy = "no-such-policy";
  o.capacity_tokens = 64;
  EXPECT_FALSE(ReplayCacheOnly(*stream, o).ok());
  o.policy = "min";
  EXPECT_EQ(ReplayCacheOnly(*stream, o).status().code(), StatusCode::kInvalidArgument);
}

// ---- Shipped traces against the independent reference script. ----

std::string SharedTraces() {
  const char* env = std::getenv("KVTIER_SHARED_DIR");
  std::string dir = env ? std::string(env) + "/traces" : "";
  return std::filesystem::exists(dir) ? dir : "";
}

std::string ReferenceScript() {
  return (std::filesystem::path(__FILE__).parent_path().parent_path() / "replay" /
          "cache_only_reference.py")
      .string();
}

// Runs the script; policy -> (prompt tokens, hit tokens).
std::map<std::string, std::pair<uint64_t, uint64_t>> RunReference(const std::string& args) {
  std::map<std::string, std::pair<uint64_t, uint64_t>> out;
  const std::string cmd = "python3 " + ReferenceScript() + " " + args;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return out;
  char line[256];
  while (fgets(line, sizeof line, p)) {
    std::istringstream in(line);
    std::string policy;
    uint64_t requests, prompt, hit;
    if (in >> policy >> requests >> prompt >> hit) out[policy] = {prompt, hit};
  }
  pclose(p);
  return out;
}

Result<CacheReplayResult> ReplayTraces(const std::vector<std::string>& paths,
                                       const std::string& policy, uint64_t capacity) {
  KVTIER_ASSIGN_OR_RETURN(auto traces, workload::LoadTraces(paths));
  auto stream = workload::StreamTraces(traces);
  CacheReplayOptions o;
  o.policy = policy;
  o.capacity_tokens = capacity;
  return ReplayCacheOnly(*stream, o);
}

TEST(CacheOnlyShipped, MooncakeIdealIs37Point4PercentAndMatchesTheReference) {
  const std::string dir = SharedTraces();
  if (dir.empty()) GTEST_SKIP() << "KVTIER_SHARED_DIR/traces not found (set by ctest)";
  if (std::system("python3 -c pass") != 0) GTEST_SKIP() << "python3 is not installed";
  auto ref = RunReference(dir + "/mooncake");
  ASSERT_TRUE(ref.count("ideal")) << "reference script printed nothing";
  auto ours = ReplayTraces({dir + "/mooncake"}, "ideal", 0);
  ASSERT_TRUE(ours.ok()) << ours.status().ToString();
  EXPECT_EQ(ours->prompt_tokens, ref["ideal"].first);
  EXPECT_EQ(ours->hit_tokens, ref["ideal"].second);
  EXPECT_NEAR(ours->hit_rate(), 0.374, 0.003);
}

TEST(CacheOnlyShipped, AgentXLruAndLruTailMatchTheReference) {
  const std::string dir = SharedTraces();
  if (dir.empty()) GTEST_SKIP() << "KVTIER_SHARED_DIR/traces not found (set by ctest)";
  if (std::system("python3 -c pass") != 0) GTEST_SKIP() << "python3 is not installed";
  const uint64_t capacity = 200000;
  auto ref =
      RunReference("--capacity-tokens " + std::to_string(capacity) + " " + dir + "/agentx-weka");
  ASSERT_EQ(ref.size(), 3u) << "reference script failed";
  for (const std::string policy : {"ideal", "lru", "lru-tail"}) {
    auto ours = ReplayTraces({dir + "/agentx-weka"}, policy, capacity);
    ASSERT_TRUE(ours.ok()) << ours.status().ToString();
    EXPECT_EQ(ours->prompt_tokens, ref[policy].first) << policy;
    EXPECT_EQ(ours->hit_tokens, ref[policy].second) << policy;
  }
}

TEST(CacheOnlyShipped, MinBoundsTheOnlinePoliciesOnAgentX) {
  const std::string dir = SharedTraces();
  if (dir.empty()) GTEST_SKIP() << "KVTIER_SHARED_DIR/traces not found (set by ctest)";
  auto traces = workload::LoadTraces(std::vector<std::string>{dir + "/agentx-weka"});
  ASSERT_TRUE(traces.ok());
  auto stream = workload::StreamTraces(*traces);
  for (double live : {0.2, 0.5, 1.0}) {
    CacheCompareOptions o;
    o.policies = {"lru", "lru-tail", "session"};
    o.capacity_live = live;
    auto r = CompareCacheOnly(*stream, o);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_TRUE(r->min.has_value());
    EXPECT_LE(r->min->hit_rate(), r->ideal.hit_rate());
    for (const auto& p : r->policies) {
      EXPECT_LE(p.hit_rate(), r->min->hit_rate()) << p.policy << " at " << live << "x live";
    }
    // On chained AgentX contexts, aging the tail first keeps more useful prefixes.
    EXPECT_GT(r->policies[1].hit_rate(), r->policies[0].hit_rate()) << live;
  }
}

TEST(CacheOnlyShipped, LibraryLruTouchedTailFirstEqualsLruTail) {
  const std::string dir = SharedTraces();
  if (dir.empty()) GTEST_SKIP() << "KVTIER_SHARED_DIR/traces not found (set by ctest)";
  if (!MakeEvictionPolicy("lru", 16).ok()) {
    GTEST_SKIP() << "the library's MakeEvictionPolicy(\"lru\") is not available in this build";
  }
  auto lib = ReplayTraces({dir + "/agentx-weka"}, "lib:lru", 300000);
  auto ours = ReplayTraces({dir + "/agentx-weka"}, "lru-tail", 300000);
  ASSERT_TRUE(lib.ok() && ours.ok());
  EXPECT_EQ(lib->hit_tokens, ours->hit_tokens);
}

}  // namespace
}  // namespace kvtier::sim
