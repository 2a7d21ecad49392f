// `kvtier replay --through cache --replicas N`: the routed replay (sim/routed_replay.h), each
// router over the same trace on fresh replicas, printed side by side with the paired difference
// of the first two routers, per trace and in all (doc/replay.md, doc/events.md).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "command.h"
#include "replay_through.h"
#include "sim/api_replay.h"
#include "sim/routed_replay.h"

namespace kvtier::cli {
namespace {

struct Sizes {
  double live_tokens = 0;  // mean live context of the whole trace
  double share = 0;        // a replica's share of it
  uint64_t device_blocks = 0, host_blocks = 0;
  uint32_t block_tokens = 64;
};

std::string TraceName(const std::string& path) {
  return std::filesystem::path(path).stem().string();
}

double Rate(const sim::CacheReplayResult& r) { return r.hit_rate(); }

// The table of hit rates (tokens): one row per trace, then all.
void PrintRates(const std::vector<sim::RoutedReplayResult>& runs,
                const std::vector<std::string>& names) {
  const bool paired = runs.size() >= 2;
  std::printf("%-18s", "hit rate (tokens)");
  for (const auto& r : runs) std::printf(" %12s", r.router.c_str());
  if (paired) std::printf("  %s - %s", runs[0].router.c_str(), runs[1].router.c_str());
  std::printf("\n");
  auto row = [&](const std::string& name, auto pick) {
    std::printf("%-18s", name.c_str());
    for (const auto& r : runs) std::printf(" %11.2f%%", 100 * Rate(pick(r)));
    if (paired) std::printf("  %+.2f pt", 100 * (Rate(pick(runs[0])) - Rate(pick(runs[1]))));
    std::printf("\n");
  };
  for (size_t t = 0; t < names.size() && names.size() > 1; ++t) {
    row(TraceName(names[t]), [t](const sim::RoutedReplayResult& r) {
      return t < r.per_trace.size() ? r.per_trace[t] : sim::CacheReplayResult{};
    });
  }
  row("all", [](const sim::RoutedReplayResult& r) { return r.total; });
}

void PrintCounts(const std::vector<sim::RoutedReplayResult>& runs) {
  auto line = [&](const char* name, auto value) {
    std::printf("%-18s", name);
    for (const auto& r : runs) std::printf(" %12llu", static_cast<unsigned long long>(value(r)));
    std::printf("\n");
  };
  line("hit blocks", [](const auto& r) { return r.total.hit_blocks; });
  for (size_t t = 0; t < runs[0].tier_kinds.size(); ++t) {
    const std::string name = "  from " + std::string(DefaultMedium(runs[0].tier_kinds[t]));
    line(name.c_str(), [t](const auto& r) { return r.hit_blocks_by_tier[t]; });
  }
  line("requests moved", [](const auto& r) { return r.moved_requests; });
  line("followed a prefix", [](const auto& r) { return r.matched_requests; });
  line("KV events read", [](const auto& r) { return r.events; });
}

nlohmann::json RunJson(const sim::RoutedReplayResult& r, const std::vector<std::string>& names) {
  auto rates = [](const sim::CacheReplayResult& c) {
    return nlohmann::json{
        {"hit_rate", c.hit_rate()},   {"per_request_mean_hit_rate", c.per_request_mean_hit_rate()},
        {"hit_tokens", c.hit_tokens}, {"prompt_tokens", c.prompt_tokens},
        {"hit_blocks", c.hit_blocks}, {"blocks", c.blocks},
        {"requests", c.requests}};
  };
  nlohmann::json j = rates(r.total);
  j["per_trace"] = nlohmann::json::object();
  for (size_t t = 0; t < r.per_trace.size() && t < names.size(); ++t)
    j["per_trace"][TraceName(names[t])] = rates(r.per_trace[t]);
  j["hit_blocks_by_medium"] = nlohmann::json::object();
  for (size_t t = 0; t < r.tier_kinds.size(); ++t)
    j["hit_blocks_by_medium"][std::string(DefaultMedium(r.tier_kinds[t]))] =
        r.hit_blocks_by_tier[t];
  j["requests_per_replica"] = r.requests_per_replica;
  j["moved_requests"] = r.moved_requests;
  j["matched_requests"] = r.matched_requests;
  j["events"] = r.events;
  j["view_matches_caches"] = true;  // ReplayRouted fails otherwise
  j["seconds"] = r.total.seconds;
  return j;
}

// Each replica's Cache: the emulated_device tier above the host tier (both evicting by policy),
// and the SSD tier of --disk-live in a folder of its own.
sim::RoutedReplayOptions MakeOptions(const ThroughArgs& a, const Sizes& z,
                                     const std::string& policy,
                                     std::vector<std::unique_ptr<TempDir>>* dirs) {
  sim::RoutedReplayOptions o;
  o.replicas = a.replicas;
  if (a.events == "none") o.events = sim::EngineEvents::kNone;
  if (a.events == "request") o.events = sim::EngineEvents::kRequestEnd;
  o.cache_options = [&a, z, policy, dirs](uint32_t) -> Result<CacheOptions> {
    const KvLayout layout = sim::ReplayLayout(z.block_tokens);
    CacheOptions co = sim::ReplayCacheOptions(layout, z.host_blocks, policy);
    TierSpec device = co.tiers[0];
    device.kind = "emulated_device";
    device.capacity_bytes = z.device_blocks * layout.bytes_per_block();
    co.tiers.insert(co.tiers.begin(), device);
    if (a.disk_live > 0) {
      dirs->push_back(std::make_unique<TempDir>());
      KVTIER_ASSIGN_OR_RETURN(TierSpec disk, DiskSpec(a, layout, z.share, dirs->back().get()));
      co.tiers.push_back(disk);
    }
    return co;
  };
  return o;
}

}  // namespace

int RunRouted(const ThroughArgs& a, const Loaded& loaded) {
  workload::RequestStream& stream = *loaded.stream;
  if (a.through != "cache" || a.policies.size() > 1) {
    std::fprintf(stderr,
                 "kvtier replay: --replicas drives in-process Caches: --through cache and at "
                 "most one --policy\n");
    return 2;
  }
  std::vector<sim::RouterKind> routers;
  for (const std::string& name : a.routers) {
    auto r = sim::ParseRouter(name);
    if (!r.ok()) {
      std::fprintf(stderr, "kvtier replay: --router: %s\n", r.status().ToString().c_str());
      return 2;
    }
    routers.push_back(*r);
  }
  if (routers.empty())
    routers = {sim::RouterKind::kMedium, sim::RouterKind::kGpuOnly, sim::RouterKind::kRoundRobin,
               sim::RouterKind::kAffinity};
  const std::string policy = a.policies.empty() ? "lru" : a.policies[0];
  auto stats = workload::ComputeStats(stream);
  if (!stats.ok()) {
    std::fprintf(stderr, "kvtier replay: %s\n", stats.status().ToString().c_str());
    return 1;
  }
  workload::ReplayRequest first;
  Sizes z;
  stream.Rewind();
  if (stream.Next(&first)) z.block_tokens = first.block_tokens;
  stream.Rewind();
  z.live_tokens = stats->live_context_mean_tokens;
  z.share = z.live_tokens / a.replicas;
  const double host_tokens = a.capacity_tokens > 0
                                 ? static_cast<double>(a.capacity_tokens)
                                 : (a.capacity_live > 0 ? a.capacity_live : 1) * z.share;
  z.host_blocks = std::max<uint64_t>(1, static_cast<uint64_t>(host_tokens / z.block_tokens));
  z.device_blocks =
      std::max<uint64_t>(1, static_cast<uint64_t>(a.device_live * z.share / z.block_tokens));
  std::vector<sim::RoutedReplayResult> runs;
  for (sim::RouterKind router : routers) {
    std::vector<std::unique_ptr<TempDir>> dirs;
    sim::RoutedReplayOptions o = MakeOptions(a, z, policy, &dirs);
    o.router = router;
    Progress progress("replay");
    auto r = sim::ReplayRouted(stream, o, [&](double f) { progress.Update(f, 1.0); });
    if (!r.ok()) {
      std::fprintf(stderr, "kvtier replay: router %s: %s\n",
                   std::string(sim::RouterName(router)).c_str(), r.status().ToString().c_str());
      return 1;
    }
    runs.push_back(std::move(r).value());
  }
  std::printf(
      "routed replay: %llu requests, %llu sessions over %u replicas; each replica a Cache of an "
      "emulated_device (GPU) tier of %llu blocks (%.2fx its share of the mean live context, "
      "%.0f of %.0f tokens) above a host (CPU) tier of %llu blocks (%.2fx)%s, policy %s; "
      "session events: %s; the router's view equalled the caches after every run\n",
      static_cast<unsigned long long>(stats->requests),
      static_cast<unsigned long long>(stats->sessions), a.replicas,
      static_cast<unsigned long long>(z.device_blocks),
      z.share > 0 ? z.device_blocks * z.block_tokens / z.share : 0.0, z.share, z.live_tokens,
      static_cast<unsigned long long>(z.host_blocks),
      z.share > 0 ? z.host_blocks * z.block_tokens / z.share : 0.0,
      a.disk_live > 0 ? " and a disk (STORAGE) tier" : "", policy.c_str(), a.events.c_str());
  PrintRates(runs, loaded.names);
  PrintCounts(runs);
  if (!a.json_path.empty()) {
    nlohmann::json j = {{"mode", "routed"},
                        {"replicas", a.replicas},
                        {"policy", policy},
                        {"session_events", a.events},
                        {"live_context_mean_tokens", z.live_tokens},
                        {"device_blocks", z.device_blocks},
                        {"host_blocks", z.host_blocks},
                        {"disk_live", a.disk_live},
                        {"routers", nlohmann::json::object()}};
    for (const auto& r : runs) j["routers"][r.router] = RunJson(r, loaded.names);
    if (Status s = sim::WriteFile(a.json_path, j.dump(2) + "\n"); !s.ok()) {
      std::fprintf(stderr, "kvtier replay: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace kvtier::cli
