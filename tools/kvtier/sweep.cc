// kvtier sweep: timed replays over pool size, concurrency, policies, tiers, replicas with and
// without a shared remote tier, and (synthetic) reuse rate; one row per run, and where the
// offload pool stops paying.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "command.h"
#include "replay_common.h"

namespace kvtier::cli {
namespace {

struct SweepArgs {
  WorkloadArgs workload;
  TimedArgs timed;
  std::vector<double> pools = {0, 0.5, 1, 1.5, 2, 3, 4};
  std::vector<uint32_t> concurrency;
  std::vector<std::string> policies = {"lru-tail"};
  std::vector<uint32_t> replicas;
  bool remote_sweep = false;
  std::vector<double> reuse;
  std::string json_path, csv_path, html_path;
};

int RunSweep(const SweepArgs& a) {
  std::vector<double> reuses = a.reuse.empty() ? std::vector<double>{a.workload.reuse} : a.reuse;
  if (!a.reuse.empty() && a.workload.synthetic_requests == 0) {
    std::fprintf(stderr, "kvtier sweep: --reuse-sweep needs --synthetic N\n");
    return 2;
  }
  const std::vector<uint32_t> concs =
      a.concurrency.empty() ? std::vector<uint32_t>{a.timed.concurrency} : a.concurrency;
  const std::vector<uint32_t> reps =
      a.replicas.empty() ? std::vector<uint32_t>{a.timed.replicas} : a.replicas;
  std::vector<bool> remotes = {a.timed.remote != "off"};
  if (a.remote_sweep) remotes = {false, true};
  std::vector<sim::TimedResult> runs;
  nlohmann::json rows = nlohmann::json::array();
  std::printf("%-6s %-9s %4s %4s %6s %6s %8s %8s %9s %9s %10s %9s\n", "reuse", "policy", "C", "rep",
              "pool", "remote", "hit", "ideal", "TTFT p50", "TTFT p90", "out/s/GPU", "1/ITLp90");
  size_t total = reuses.size() * a.policies.size() * concs.size() * reps.size() * remotes.size() *
                 a.pools.size();
  size_t done = 0;
  Progress progress("sweep");
  for (double reuse : reuses) {
    WorkloadArgs w = a.workload;
    w.reuse = reuse;
    Loaded loaded;
    if (int rc = LoadWorkload(w, &loaded, /*need_traces=*/true); rc != 0) return rc;
    for (const auto& policy : a.policies) {
      for (uint32_t c : concs) {
        for (uint32_t r : reps) {
          for (bool remote : remotes) {
            double prev_hit = -1;
            double prev_pool = 0;
            bool knee_marked = false;  // only the first step from a host pool adding < 1 point
            for (double pool : a.pools) {
              TimedArgs t = a.timed;
              t.concurrency = c;
              t.replicas = r;
              t.host = pool > 0 ? "auto" : "off";
              if (remote && t.remote == "off") t.remote = "100TB";
              if (!remote) t.remote = "off";
              sim::TimedOptions o;
              sim::GpuProfile gpu;
              sim::ModelProfile model;
              if (!MakeTimedOptions(t, policy, &o, &gpu, &model)) return 2;
              o.host_pool_multiple = pool;
              auto res = sim::ReplayTimed(loaded.traces, gpu, model, o);
              if (!res.ok()) {
                std::fprintf(stderr, "kvtier sweep: %s\n", res.status().ToString().c_str());
                return 1;
              }
              const bool knee = !knee_marked && prev_pool > 0 && res->hit_rate() - prev_hit < 0.01;
              knee_marked = knee_marked || knee;
              std::printf(
                  "%-6.2f %-9s %4u %4u %6.2f %6s %7.1f%% %7.1f%% %9.3f %9.3f %10.1f %9.1f%s\n",
                  reuse, policy.c_str(), c, r, pool, remote ? "on" : "off", 100 * res->hit_rate(),
                  100 * res->ideal_hit_rate, res->ttft_s.p50, res->ttft_s.p90,
                  res->output_tokens_per_s_per_gpu, res->interactivity,
                  knee ? "  <- this step adds < 1 pt: the previous pool is the knee" : "");
              std::fflush(stdout);
              prev_hit = res->hit_rate();
              prev_pool = pool;
              nlohmann::json j = sim::TimedJson(*res);
              j["reuse"] = reuse;
              j["pool_multiple"] = pool;
              j["remote_enabled"] = remote;
              rows.push_back(j);
              runs.push_back(std::move(res).value());
              progress.Update(static_cast<double>(++done), static_cast<double>(total));
            }
          }
        }
      }
    }
  }
  sim::PrintDefinitions(sim::TimedMetricDefinitions(), stdout);
  Status s;
  if (!a.json_path.empty()) s = sim::WriteFile(a.json_path, rows.dump(2) + "\n");
  if (s.ok() && !a.csv_path.empty()) s = sim::WriteFile(a.csv_path, sim::TimedCsv(runs));
  if (s.ok() && !a.html_path.empty()) {
    s = sim::WriteFile(a.html_path, sim::TimedHtml(runs, "kvtier sweep"));
  }
  if (!s.ok()) {
    std::fprintf(stderr, "kvtier sweep: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace kvtier::cli

KVTIER_REGISTER_COMMAND(
    sweep, ({"sweep"}),
    "Timed replays over pool size, concurrency, policies, tiers, replicas/remote and reuse",
    [](CLI::App* app) -> kvtier::cli::RunFn {
      auto a = std::make_shared<kvtier::cli::SweepArgs>();
      kvtier::cli::AddWorkloadOptions(app, &a->workload);
      kvtier::cli::AddTimedOptions(app, &a->timed);
      app->add_option("--pool", a->pools,
                      "Host pool sizes as multiples of the HBM KV capacity (0 = no host tier)")
          ->delimiter(',');
      app->add_option("--concurrency-sweep", a->concurrency, "Concurrency values")
          ->delimiter(',')
          ->check(CLI::Range(1u, kvtier::cli::kMaxConcurrency));
      app->add_option("--policy", a->policies, "Policies (comma-separated)")->delimiter(',');
      app->add_option("--replicas-sweep", a->replicas, "Replica counts")->delimiter(',');
      app->add_flag("--remote-sweep", a->remote_sweep,
                    "Each point with and without a shared remote tier");
      app->add_option("--reuse-sweep", a->reuse, "Synthetic reuse values")->delimiter(',');
      app->add_option("--json", a->json_path, "Write every run as JSON");
      app->add_option("--csv", a->csv_path, "Write one CSV row per run");
      app->add_option("--html", a->html_path, "Write an HTML page with SVG charts");
      return [a] { return kvtier::cli::RunSweep(*a); };
    });
