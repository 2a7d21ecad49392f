// kvtier replay: replays traces (files, folders, or a synthetic corpus) cache-only against
// policies and bounds, or timed against modelled hardware. See doc/replay.md.
#include <sys/resource.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "command.h"
#include "replay_common.h"
#include "replay_through.h"
#include "sim/cache_compare.h"
#include "sim/report.h"
#include "sim/timed_replay.h"
#include "sim/trace_stats.h"
#include "workload/readers.h"
#include "workload/synthetic.h"

namespace kvtier::cli {
namespace {

struct ReplayArgs {
  WorkloadArgs workload;
  bool cache_only = false;
  bool trace_stats = false;
  std::vector<std::string> policies;
  uint64_t capacity_tokens = 0;
  double capacity_live = 0;
  bool no_min = false;
  bool baseline = false;
  std::string touch = "tail";
  std::string json_path, csv_path, html_path;
  TimedArgs timed;
  ThroughArgs through;
};

int RunCacheOnly(const ReplayArgs& a, const Loaded& loaded) {
  workload::RequestStream& stream = *loaded.stream;
  const std::vector<std::string>& names = loaded.names;
  sim::CacheCompareOptions o;
  if (!a.policies.empty()) o.policies = a.policies;
  o.capacity_tokens = a.capacity_tokens;
  o.capacity_live = a.capacity_live;
  if (o.capacity_tokens == 0 && o.capacity_live == 0) o.capacity_live = 1.0;
  o.with_min = !a.no_min;
  o.measure_baseline = a.baseline;
  o.touch = a.touch == "head" ? sim::TouchOrder::kHeadFirst : sim::TouchOrder::kTailFirst;
  Progress progress("replay");
  auto r = sim::CompareCacheOnly(stream, o, [&](double f) { progress.Update(f, 1.0); });
  if (!r.ok()) {
    std::fprintf(stderr, "kvtier replay: %s\n", r.status().ToString().c_str());
    return 1;
  }
  if (!loaded.is_synthetic) {
    std::printf("read %zu trace files, %.1f MB in %.3f s (%.0f MB/s)\n", loaded.traces.size(),
                loaded.read_bytes / 1e6, loaded.read_s,
                loaded.read_s > 0 ? loaded.read_bytes / 1e6 / loaded.read_s : 0.0);
  }
  sim::PrintCacheCompareTable(*r, stdout);
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  std::printf("peak memory (max RSS): %.1f MiB\n", ru.ru_maxrss / 1024.0);
  nlohmann::json j = sim::CacheCompareJson(*r, names);
  j["peak_rss_bytes"] = static_cast<uint64_t>(ru.ru_maxrss) * 1024;
  j["read_s"] = loaded.read_s;
  j["read_bytes"] = loaded.read_bytes;
  if (!a.json_path.empty()) {
    if (Status s = sim::WriteFile(a.json_path, j.dump(2) + "\n"); !s.ok()) {
      std::fprintf(stderr, "kvtier replay: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  if (!a.csv_path.empty()) {
    if (Status s = sim::WriteFile(a.csv_path, sim::CacheCompareCsv(*r)); !s.ok()) {
      std::fprintf(stderr, "kvtier replay: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  if (!a.html_path.empty()) {
    if (Status s =
            sim::WriteFile(a.html_path, sim::CacheCompareHtml(*r, "kvtier cache-only replay"));
        !s.ok()) {
      std::fprintf(stderr, "kvtier replay: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  return 0;
}

int RunTimedOnce(const TimedArgs& t, const Loaded& loaded, const std::vector<std::string>& policies,
                 const std::string& json_path, const std::string& csv_path,
                 const std::string& html_path) {
  if (policies.size() > 1) {
    std::fprintf(stderr, "kvtier replay: timed replay takes one --policy (use kvtier sweep)\n");
    return 2;
  }
  sim::TimedOptions o;
  sim::GpuProfile gpu;
  sim::ModelProfile model;
  if (!MakeTimedOptions(t, policies.empty() ? "" : policies[0], &o, &gpu, &model)) return 2;
  auto r = sim::ReplayTimed(loaded.traces, gpu, model, o);
  if (!r.ok()) {
    std::fprintf(stderr, "kvtier replay: %s\n", r.status().ToString().c_str());
    return 1;
  }
  sim::PrintTimedTable(*r, stdout);
  const std::vector<sim::TimedResult> runs = {*r};
  Status s;
  if (!json_path.empty()) s = sim::WriteFile(json_path, sim::TimedJson(*r).dump(2) + "\n");
  if (s.ok() && !csv_path.empty()) s = sim::WriteFile(csv_path, sim::TimedCsv(runs));
  if (s.ok() && !html_path.empty()) {
    s = sim::WriteFile(html_path, sim::TimedHtml(runs, "kvtier timed replay"));
  }
  if (!s.ok()) {
    std::fprintf(stderr, "kvtier replay: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}

constexpr const char* kTraceStatsDefinition =
    "per-conversation hit rate = sum over its requests of the leading block ids each shares with "
    "the previous request of its session (in tokens, capped at the prompt) / its prompt tokens; "
    "a conversation is one trace file (a session and its sub-agents); no cache model";

int RunTraceStats(const ReplayArgs& a, const Loaded& loaded) {
  const sim::TraceStatsSummary s = sim::ComputeTraceStats(loaded.traces);
  nlohmann::json convs = nlohmann::json::array();
  std::printf("%-32s %9s %14s %9s\n", "conversation", "requests", "prompt tokens", "hit rate");
  for (const auto& c : s.conversations) {
    std::printf("%-32s %9llu %14llu %8.1f%%\n", c.name.c_str(),
                static_cast<unsigned long long>(c.requests),
                static_cast<unsigned long long>(c.prompt_tokens), 100 * c.hit_rate());
    convs.push_back({{"name", c.name},
                     {"requests", c.requests},
                     {"prompt_tokens", c.prompt_tokens},
                     {"hit_rate", c.hit_rate()}});
  }
  std::printf(
      "per-conversation hit rate over %zu conversations: min %.1f%%, P25 %.1f%%, median "
      "%.1f%%, P75 %.1f%%, mean %.1f%%\ndefinition: %s\n",
      s.conversations.size(), 100 * s.min, 100 * s.p25, 100 * s.median, 100 * s.p75, 100 * s.mean,
      kTraceStatsDefinition);
  if (!a.json_path.empty()) {
    nlohmann::json j = {
        {"mode", "trace-stats"},
        {"conversations", convs},
        {"hit_rate",
         {{"min", s.min}, {"p25", s.p25}, {"median", s.median}, {"p75", s.p75}, {"mean", s.mean}}},
        {"metric_definitions", {{"hit_rate", kTraceStatsDefinition}}}};
    if (Status st = sim::WriteFile(a.json_path, j.dump(2) + "\n"); !st.ok()) {
      std::fprintf(stderr, "kvtier replay: %s\n", st.ToString().c_str());
      return 1;
    }
  }
  return 0;
}

int Run(const ReplayArgs& a) {
  Loaded loaded;
  const bool need_traces = (!a.cache_only && a.through.through.empty()) || a.trace_stats;
  if (int rc = LoadWorkload(a.workload, &loaded, need_traces); rc != 0) return rc;
  if (a.trace_stats) return RunTraceStats(a, loaded);
  if (!a.through.through.empty()) {
    ThroughArgs t = a.through;
    t.policies = a.policies;
    t.capacity_tokens = a.capacity_tokens;
    t.capacity_live = a.capacity_live;
    t.json_path = a.json_path;
    t.replicas = a.timed.replicas;
    return t.replicas > 1 ? RunRouted(t, loaded) : RunThrough(t, loaded);
  }
  if (a.cache_only) return RunCacheOnly(a, loaded);
  return RunTimedOnce(a.timed, loaded, a.policies, a.json_path, a.csv_path, a.html_path);
}

}  // namespace
}  // namespace kvtier::cli

KVTIER_REGISTER_COMMAND(
    replay, ({"replay"}), "Replay traces: cache-only against policies and bounds, or timed",
    [](CLI::App* app) -> kvtier::cli::RunFn {
      auto a = std::make_shared<kvtier::cli::ReplayArgs>();
      kvtier::cli::AddWorkloadOptions(app, &a->workload);
      app->add_flag("--cache-only", a->cache_only,
                    "Timing-free replay of the exact definition (doc/replay.md)");
      app->add_option("--through", a->through.through,
                      "Drive a real cache with each request's Lookup and Store (doc/replay.md): "
                      "cache (in process), daemon (a kvtier serve through a Client) or both")
          ->check(CLI::IsMember({"cache", "daemon", "both"}));
      app->add_option("--session-events", a->through.events,
                      "With --through: what the engine tells the cache beyond the session id on "
                      "every call: none, request (request finished) or close (default: and the "
                      "session closed when the trace ends it)")
          ->check(CLI::IsMember({"none", "request", "close"}));
      app->add_option("--disk-live", a->through.disk_live,
                      "With --through cache: an SSD tier below the host tier, this many times the "
                      "mean live context (with --replicas N, each replica's share of it; in a "
                      "temporary folder; the writer drained after each request, so the figures "
                      "repeat)");
      app->add_option("--disk-min-reuse", a->through.disk_min_reuse,
                      "With --disk-live: the SSD tier's admission min_reuse (doc/config.md)");
      app->add_option("--disk-count-reuse-after-eviction",
                      a->through.disk_count_reuse_after_eviction,
                      "With --disk-min-reuse: a miss on a block refused and evicted counts as "
                      "its reuse (doc/config.md; default true)");
      app->add_option("--disk-min-prefix-tokens", a->through.disk_min_prefix_tokens,
                      "With --disk-live: the SSD tier's admission min_prefix_tokens");
      app->add_option("--router", a->through.routers,
                      "With --through cache --replicas N: the routers to compare (repeat or "
                      "comma-separate): medium (announced blocks credited GPU 1.0, CPU 0.8, "
                      "STORAGE 0.5), gpu-only, round-robin, affinity. Default: all")
          ->delimiter(',')
          ->check(CLI::IsMember({"medium", "gpu-only", "round-robin", "affinity"}));
      app->add_option("--device-live", a->through.device_live,
                      "With --through cache --replicas N: each replica's emulated_device (GPU) "
                      "tier, this many times its share of the mean live context (default 0.25)");
      app->add_option("--socket", a->through.socket,
                      "With --through daemon: use the daemon on this socket instead of starting "
                      "one (its config decides layout, capacity and policy)");
      app->add_flag("--trace-stats", a->trace_stats,
                    "Per-conversation hit rate from consecutive-request overlap (min, P25, "
                    "median, P75, mean), no cache model");
      app->add_option("--policy", a->policies,
                      "Policies to compare (repeat or comma-separate): lru, lru-tail, s3fifo, arc, "
                      "session. Default: all")
          ->delimiter(',');
      app->add_option("--capacity-tokens", a->capacity_tokens,
                      "Cache capacity in tokens (with --replicas N: each replica's host tier)");
      app->add_option("--capacity-live", a->capacity_live,
                      "Cache capacity as a multiple of the mean live context of the active "
                      "sessions (default 1 when no capacity is given; with --through cache "
                      "--replicas N, each replica's host tier in its share of it)");
      app->add_flag("--no-min", a->no_min, "Skip Belady's MIN (it holds the trace in memory)");
      app->add_flag("--baseline", a->baseline,
                    "Also time the stream alone and stream + key hashing (the same-run floor)");
      app->add_option("--touch", a->touch,
                      "Touch order for library policies: tail (default) or head")
          ->check(CLI::IsMember({"tail", "head"}));
      app->add_option("--json", a->json_path, "Write the report as JSON");
      app->add_option("--csv", a->csv_path, "Write the report as CSV");
      app->add_option("--html", a->html_path, "Write a self-contained HTML page with SVG charts");
      kvtier::cli::AddTimedOptions(app, &a->timed);
      app->get_option("--replicas")
          ->description(
              "Engine replicas (timed: they share the remote tier; --through cache: each a Cache "
              "of its own, a router picking one per request from their KV events)");
      return [a] { return kvtier::cli::Run(*a); };
    });
