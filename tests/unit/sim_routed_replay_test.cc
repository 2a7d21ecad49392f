// The routed replay (sim/routed_replay.h): a router that reads the replicas' KV events keeps
// the view the caches hold, and crediting the host tier's blocks sends a returning session back
// to the replica that still holds its prefix where a GPU-only router cannot.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <numeric>
#include <string>
#include <vector>

#include "sim/api_replay.h"
#include "sim/routed_replay.h"
#include "workload/readers.h"

namespace kvtier::sim {
namespace {

constexpr uint32_t kBt = 64;

// Replica caches of a 2-block emulated_device tier above a 16-block host tier.
RoutedReplayOptions SmallReplicas(RouterKind router) {
  RoutedReplayOptions o;
  o.router = router;
  o.replicas = 2;
  o.cache_options = [](uint32_t) -> Result<CacheOptions> {
    const KvLayout layout = ReplayLayout(kBt);
    CacheOptions co = ReplayCacheOptions(layout, 16, "lru");
    TierSpec device = co.tiers[0];
    device.kind = "emulated_device";
    device.capacity_bytes = 2 * layout.bytes_per_block();
    co.tiers.insert(co.tiers.begin(), device);
    return co;
  };
  return o;
}

// Sessions (id, block ids) in this order, each request a second after the one before.
workload::MaterializedRequests Requests(
    const std::vector<std::pair<uint64_t, std::vector<uint64_t>>>& calls) {
  workload::MaterializedRequests m;
  for (const auto& [session, ids] : calls) m.ids.insert(m.ids.end(), ids.begin(), ids.end());
  size_t at = 0;
  for (size_t i = 0; i < calls.size(); ++i) {
    workload::ReplayRequest q;
    q.session = calls[i].first;
    q.start_s = static_cast<double>(i);
    q.block_tokens = kBt;
    q.prompt_tokens = static_cast<uint32_t>(calls[i].second.size() * kBt);
    q.root = BlockKey{7, 7};
    q.ids = std::span<const uint64_t>(m.ids.data() + at, calls[i].second.size());
    at += calls[i].second.size();
    bool seen = false, again = false;
    for (size_t j = 0; j < calls.size(); ++j) {
      if (calls[j].first != q.session) continue;
      seen = seen || j < i;
      again = again || j > i;
    }
    q.session_first = !seen;
    q.session_last = !again;
    m.requests.push_back(q);
  }
  return m;
}

TEST(EventView, FollowsStoredRemovedAndCleared) {
  EventView view(2);
  const BlockKey a{1, 1}, b{2, 2}, c{3, 3};
  auto event = [](KvEvent::Type type, BlockKey key, int tier) {
    KvEvent e;
    e.type = type;
    e.key = key;
    e.tier = tier;
    return e;
  };
  view.OnEvent(0, event(KvEvent::Type::kStored, a, 0));
  view.OnEvent(0, event(KvEvent::Type::kStored, a, 1));
  view.OnEvent(0, event(KvEvent::Type::kStored, b, 1));
  view.OnEvent(1, event(KvEvent::Type::kStored, a, 1));
  const std::vector<BlockKey> chain = {a, b, c};
  const std::vector<double> medium = {1.0, 0.8}, gpu = {1.0, 0};
  EXPECT_DOUBLE_EQ(view.Score(0, chain, medium), 1.8);  // a at its best (GPU), then b in CPU
  EXPECT_DOUBLE_EQ(view.Score(0, chain, gpu), 1.0);     // b is CPU only: the prefix ends there
  EXPECT_DOUBLE_EQ(view.Score(1, chain, gpu), 0.0);
  view.OnEvent(0, event(KvEvent::Type::kRemoved, a, 0));
  EXPECT_DOUBLE_EQ(view.Score(0, chain, medium), 1.6);
  EXPECT_DOUBLE_EQ(view.Score(0, chain, gpu), 0.0);
  KvEvent clear = event(KvEvent::Type::kCleared, {}, -1);
  clear.resident =
      std::make_shared<const std::vector<KvEventBlock>>(std::vector<KvEventBlock>{{b, 1}});
  view.OnEvent(0, clear);
  EXPECT_DOUBLE_EQ(view.Score(0, chain, medium), 0.0);  // a is gone, so no prefix
  EXPECT_EQ(view.Announced(0, 1), std::vector<BlockKey>{b});
  EXPECT_EQ(view.Announced(1, 1), std::vector<BlockKey>{a});
  EXPECT_EQ(view.events(), 6u);
}

// A (4 blocks) goes to replica 0, B to 1, C to 0 (ties: fewer live sessions, then the lower
// index), and C pushes A out of 0's 2-block GPU tier but not out of its host tier. Crediting
// CPU blocks, each returning session goes back to the replica holding its prefix (4 hits each).
// Crediting GPU blocks only, the router sees no prefix anywhere for any of them (each prefix
// starts with a block the GPU tier dropped) and sends each to the replica with fewer live
// sessions: the other one, every time (no hit).
TEST(RoutedReplay, CreditingCpuBlocksBringsTheSessionBack) {
  const auto m = Requests({{1, {1, 2, 3, 4}},
                           {2, {11, 12, 13, 14}},
                           {3, {21, 22, 23, 24}},
                           {1, {1, 2, 3, 4, 5}},
                           {2, {11, 12, 13, 14, 15}},
                           {3, {21, 22, 23, 24, 25}}});
  auto stream = workload::StreamMaterialized(m);
  auto medium = ReplayRouted(*stream, SmallReplicas(RouterKind::kMedium));
  ASSERT_TRUE(medium.ok()) << medium.status().ToString();
  auto gpu = ReplayRouted(*stream, SmallReplicas(RouterKind::kGpuOnly));
  ASSERT_TRUE(gpu.ok()) << gpu.status().ToString();
  EXPECT_EQ(medium->total.hit_blocks, 12u);
  EXPECT_EQ(medium->hit_blocks_by_tier[0] + medium->hit_blocks_by_tier[1], 12u);
  EXPECT_GE(medium->hit_blocks_by_tier[1], 4u);  // A's prefix came from the host tier
  EXPECT_EQ(medium->matched_requests, 3u);
  EXPECT_EQ(medium->moved_requests, 0u);
  EXPECT_EQ(medium->requests_per_replica, (std::vector<uint64_t>{4, 2}));
  EXPECT_EQ(gpu->total.hit_blocks, 0u);
  EXPECT_EQ(gpu->matched_requests, 0u);
  EXPECT_EQ(gpu->moved_requests, 3u);
  EXPECT_EQ(gpu->requests_per_replica, (std::vector<uint64_t>{3, 3}));
  EXPECT_GT(medium->total.hit_rate(), gpu->total.hit_rate());
  EXPECT_GT(medium->events, 0u);
}

// The check itself fails when the view and a cache disagree.
TEST(RoutedReplay, CheckViewAgainstCachesSeesAMissedEvent) {
  EventView view(1);
  CacheOptions co = *SmallReplicas(RouterKind::kMedium).cache_options(0);
  co.on_event = view.Listener(0);
  co.write_queue_blocks = 0;
  auto cache = Cache::Open(co);
  ASSERT_TRUE(cache.ok()) << cache.status().ToString();
  const KvLayout& layout = (*cache)->layout();
  const std::vector<std::byte> zeros(layout.bytes_per_block());
  const std::vector<BlockKey> keys = {BlockKey{1, 1}, BlockKey{2, 2}};
  const std::vector<ConstBlock> blocks(2, ConstBlock(zeros.data(), zeros.size()));
  ASSERT_TRUE((*cache)->StoreKeys(keys, blocks).ok());
  std::vector<Cache*> caches = {cache->get()};
  EXPECT_TRUE(CheckViewAgainstCaches(view, caches).ok());
  KvEvent lost;
  lost.type = KvEvent::Type::kRemoved;
  lost.key = keys[1];
  lost.tier = 1;
  view.OnEvent(0, lost);  // as if the router had seen a removal the cache never made
  const Status s = CheckViewAgainstCaches(view, caches);
  EXPECT_EQ(s.code(), StatusCode::kInternal) << s.ToString();
}

// On a slice of the shipped AgentX traces: every router's run ends with the view equal to the
// caches (ReplayRouted checks it), the routers replay the same requests, affinity never moves
// a session, and every hit is counted in one medium.
TEST(RoutedReplay, AgentXSliceKeepsTheViewAndCountsEveryHit) {
  const char* env = std::getenv("KVTIER_SHARED_DIR");
  const std::string dir = env ? std::string(env) + "/traces/agentx-weka" : "";
  if (!std::filesystem::exists(dir + "/trace_0274.json"))
    GTEST_SKIP() << "KVTIER_SHARED_DIR/traces/agentx-weka not found (set by ctest)";
  auto traces = workload::LoadTraces(
      std::vector<std::string>{dir + "/trace_0274.json", dir + "/trace_0211.json"});
  ASSERT_TRUE(traces.ok()) << traces.status().ToString();
  auto stream = workload::StreamTraces(*traces);
  auto stats = workload::ComputeStats(*stream);
  ASSERT_TRUE(stats.ok());
  const uint64_t share = static_cast<uint64_t>(stats->live_context_mean_tokens / 2 / kBt);
  std::vector<RoutedReplayResult> runs;
  for (RouterKind router : {RouterKind::kMedium, RouterKind::kGpuOnly, RouterKind::kRoundRobin,
                            RouterKind::kAffinity}) {
    RoutedReplayOptions o;
    o.router = router;
    o.cache_options = [share](uint32_t) -> Result<CacheOptions> {
      const KvLayout layout = ReplayLayout(kBt);
      CacheOptions co = ReplayCacheOptions(layout, share, "lru");
      TierSpec device = co.tiers[0];
      device.kind = "emulated_device";
      device.capacity_bytes = share / 4 * layout.bytes_per_block();
      co.tiers.insert(co.tiers.begin(), device);
      return co;
    };
    auto r = ReplayRouted(*stream, o);
    ASSERT_TRUE(r.ok()) << RouterName(router) << ": " << r.status().ToString();
    runs.push_back(*r);
  }
  for (const RoutedReplayResult& r : runs) {
    SCOPED_TRACE(r.router);
    EXPECT_EQ(r.total.requests, stats->requests);
    EXPECT_EQ(r.total.prompt_tokens, runs[0].total.prompt_tokens);
    EXPECT_EQ(
        std::accumulate(r.hit_blocks_by_tier.begin(), r.hit_blocks_by_tier.end(), uint64_t{0}),
        r.total.hit_blocks);
    EXPECT_EQ(r.per_trace.size(), 2u);
    EXPECT_EQ(r.per_trace[0].hit_tokens + r.per_trace[1].hit_tokens, r.total.hit_tokens);
  }
  EXPECT_GT(runs[0].matched_requests, 0u);  // the slice returns to its contexts
  EXPECT_GT(runs[0].total.hit_rate(), 0.2);
  EXPECT_EQ(runs[3].moved_requests, 0u);
  EXPECT_GT(runs[2].moved_requests, 0u);
}

}  // namespace
}  // namespace kvtier::sim
