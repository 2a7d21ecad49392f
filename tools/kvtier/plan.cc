// kvtier plan: the load-vs-recompute cost model of the GPU and model profiles, without a trace.
// `plan crossover` prints, per tier, the prompt length below which recomputing beats loading;
// `plan ttft` the TTFT of one request recomputed and loaded from each tier. Both price with the
// library's Planner through sim/cost_model.h, the same numbers the timed replay uses.
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "command.h"
#include "sim/cost_model.h"
#include "sim/profiles.h"

namespace kvtier::cli {
namespace {

const char* const kTiers[] = {"host", "disk", "remote"};

struct PlanArgs {
  std::vector<std::string> gpus, models;
  std::string profiles_dir;
  uint32_t tp = 0;
  uint32_t block_tokens = 64;
  std::string kv_dtype;
  double disk_gbps = 6, disk_latency_us = 100;
  double remote_gbps = 25, remote_latency_us = 200;
  std::vector<uint64_t> tokens = {1000, 10000, 100000};
  bool json = false;
  std::string cost_profile;  // a CostProfile file instead of GPU x model profiles
};

void AddCommon(CLI::App* app, PlanArgs* a) {
  app->add_option("--gpu", a->gpus, "GPU profiles (comma-separated; default: every shipped one)")
      ->delimiter(',');
  app->add_option("--model", a->models,
                  "Model profiles (comma-separated; default: every shipped one)")
      ->delimiter(',');
  app->add_option("--profiles", a->profiles_dir, "Extra folder with gpus/ and models/ profiles");
  app->add_option("--tp", a->tp, "GPUs per replica (0 = fewest that hold the weights)");
  app->add_option("--block-tokens", a->block_tokens, "Tokens per KV block")->capture_default_str();
  app->add_option("--kv-dtype", a->kv_dtype, "KV element type: bf16, fp8 (default: the model's)")
      ->check(CLI::IsMember({"bf16", "fp16", "fp8"}));
  app->add_option("--disk-gbps", a->disk_gbps, "SSD bandwidth, GB/s")->capture_default_str();
  app->add_option("--disk-latency-us", a->disk_latency_us, "SSD per-op latency, us")
      ->capture_default_str();
  app->add_option("--remote-gbps", a->remote_gbps, "Remote tier bandwidth, GB/s")
      ->capture_default_str();
  app->add_option("--remote-latency-us", a->remote_latency_us, "Remote per-op latency, us")
      ->capture_default_str();
  app->add_flag("--json", a->json, "Print JSON instead of a table");
  app->add_option("--cost-profile", a->cost_profile,
                  "Price with this cost profile (`kvtier calibrate`, or the vLLM connector's "
                  "cost_profile_out) instead of GPU x model profiles");
}

struct Deployment {
  sim::GpuProfile gpu;
  sim::ModelProfile model;
  uint32_t tp = 1;
  std::unique_ptr<Planner> planner;
};

// Every requested (or shipped) GPU x model pair; prints the error and returns false on bad input.
bool Deployments(const PlanArgs& a, std::vector<Deployment>* out) {
  if (!a.cost_profile.empty()) {
    auto p = LoadCostProfile(a.cost_profile);
    if (!p.ok()) {
      std::fprintf(stderr, "kvtier plan: %s\n", p.status().ToString().c_str());
      return false;
    }
    Deployment d;
    d.gpu.name = p->machine.empty() ? a.cost_profile : p->machine;
    d.model.name = p->model;
    d.planner = std::make_unique<Planner>(std::move(p).value());
    out->push_back(std::move(d));
    return true;
  }
  const auto gpus = a.gpus.empty() ? sim::ProfileNames("gpus") : a.gpus;
  const auto models = a.models.empty() ? sim::ProfileNames("models") : a.models;
  for (const auto& g : gpus) {
    for (const auto& m : models) {
      auto gp = sim::LoadGpuProfile(g, a.profiles_dir);
      auto mp = sim::LoadModelProfile(m, a.profiles_dir);
      if (!gp.ok() || !mp.ok()) {
        std::fprintf(stderr, "kvtier plan: %s\n",
                     (!gp.ok() ? gp.status() : mp.status()).ToString().c_str());
        return false;
      }
      Deployment d{*gp, *mp, a.tp ? a.tp : sim::DefaultTp(*gp, *mp), nullptr};
      sim::CostModelOptions o;
      o.tp = d.tp;
      o.block_tokens = a.block_tokens;
      o.kv_dtype = a.kv_dtype;
      o.disk = o.remote = true;
      o.disk_gbps = a.disk_gbps;
      o.disk_latency_s = a.disk_latency_us * 1e-6;
      o.remote_gbps = a.remote_gbps;
      o.remote_latency_s = a.remote_latency_us * 1e-6;
      auto p = sim::MakeCostProfile(d.gpu, d.model, o);
      if (!p.ok()) {
        std::fprintf(stderr, "kvtier plan: %s x %s: %s\n", g.c_str(), m.c_str(),
                     p.status().ToString().c_str());
        return false;
      }
      d.planner = std::make_unique<Planner>(std::move(p).value());
      out->push_back(std::move(d));
    }
  }
  return true;
}

constexpr const char* kCrossoverDefinition =
    "crossover_tokens: the shortest prompt for which loading every cached block (all but the "
    "one holding the last token) from the tier, plus the request's fixed load cost, is cheaper "
    "than recomputing the prompt; shorter prompts recompute. null: loading never wins up to "
    "4M tokens.";

int RunCrossover(const PlanArgs& a) {
  std::vector<Deployment> ds;
  if (!Deployments(a, &ds)) return 2;
  nlohmann::json rows = nlohmann::json::array();
  if (!a.json) {
    std::printf("%-14s %-17s %3s %10s %10s %10s   (prompt tokens below which recompute wins)\n",
                "gpu", "model", "tp", "host", "disk", "remote");
  }
  for (const Deployment& d : ds) {
    nlohmann::json row = {{"gpu", d.gpu.name}, {"model", d.model.name}, {"tp", d.tp}};
    std::string line;
    for (const char* tier : kTiers) {
      const uint64_t x = sim::CrossoverTokens(*d.planner, d.planner->profile().FindTier(tier));
      row["crossover_tokens"][tier] = x ? nlohmann::json(x) : nlohmann::json(nullptr);
      char cell[32];
      std::snprintf(cell, sizeof cell, " %10s", x ? std::to_string(x).c_str() : "never");
      line += cell;
    }
    rows.push_back(row);
    if (!a.json) {
      std::printf("%-14s %-17s %3u%s\n", d.gpu.name.c_str(), d.model.name.c_str(), d.tp,
                  line.c_str());
    }
  }
  if (a.json) {
    nlohmann::json j = {{"rows", rows}, {"definition", kCrossoverDefinition}};
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("%s\n", kCrossoverDefinition);
  }
  return 0;
}

int RunTtft(const PlanArgs& a) {
  std::vector<Deployment> ds;
  if (!Deployments(a, &ds)) return 2;
  nlohmann::json all = nlohmann::json::array();
  for (const Deployment& d : ds) {
    const Planner& p = *d.planner;
    nlohmann::json rows = nlohmann::json::array();
    if (!a.json) {
      std::printf("%s on %u x %s (block %u tokens, %llu B)\n", d.model.name.c_str(), d.tp,
                  d.gpu.name.c_str(), p.profile().block_tokens,
                  static_cast<unsigned long long>(p.profile().block_bytes));
      std::printf("%10s %14s %12s %12s %12s\n", "tokens", "recompute ms", "host ms", "disk ms",
                  "remote ms");
    }
    for (uint64_t n : a.tokens) {
      nlohmann::json row = {{"tokens", n}, {"recompute_s", sim::RecomputeSeconds(p, n)}};
      for (const char* tier : kTiers) {
        row["load_s"][tier] = sim::LoadSeconds(p, p.profile().FindTier(tier), n);
      }
      if (!a.json) {
        std::printf(
            "%10llu %14.1f %12.1f %12.1f %12.1f\n", static_cast<unsigned long long>(n),
            row["recompute_s"].get<double>() * 1e3, row["load_s"]["host"].get<double>() * 1e3,
            row["load_s"]["disk"].get<double>() * 1e3, row["load_s"]["remote"].get<double>() * 1e3);
      }
      rows.push_back(row);
    }
    all.push_back({{"gpu", d.gpu.name}, {"model", d.model.name}, {"tp", d.tp}, {"rows", rows}});
  }
  if (a.json) {
    // One deployment: its object; several: an array of them.
    std::printf("%s\n", (all.size() == 1 ? all[0] : all).dump(2).c_str());
  } else {
    std::printf(
        "TTFT of one request alone: recompute = the whole prompt computed; load = every block "
        "but the last loaded from the tier (fixed cost + latency + bytes / bandwidth), then the "
        "rest computed.\n");
  }
  return 0;
}

}  // namespace
}  // namespace kvtier::cli

KVTIER_REGISTER_COMMAND(plan_crossover, ({"plan", "crossover"}),
                        "Per tier, the prompt length below which recomputing beats loading",
                        [](CLI::App* app) -> kvtier::cli::RunFn {
                          auto a = std::make_shared<kvtier::cli::PlanArgs>();
                          kvtier::cli::AddCommon(app, a.get());
                          return [a] { return kvtier::cli::RunCrossover(*a); };
                        });

KVTIER_REGISTER_COMMAND(plan_ttft, ({"plan", "ttft"}),
                        "TTFT of one request recomputed vs loaded from each tier",
                        [](CLI::App* app) -> kvtier::cli::RunFn {
                          auto a = std::make_shared<kvtier::cli::PlanArgs>();
                          kvtier::cli::AddCommon(app, a.get());
                          app->add_option("--tokens", a->tokens, "Prompt lengths")
                              ->delimiter(',')
                              ->capture_default_str();
                          return [a] { return kvtier::cli::RunTtft(*a); };
                        });
