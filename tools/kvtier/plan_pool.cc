// kvtier plan pool: the HBM pool an engine leaves for KV on one data-parallel rank, term by term
// (sim/hbm_budget.h), and the model's KV bytes per cached token by layer group (sim/kv_layout.h).
// Every figure comes from the GPU and model profiles, whose `sources` say where each one is from.
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "command.h"
#include "sim/hbm_budget.h"
#include "sim/kv_layout.h"
#include "sim/profiles.h"

namespace kvtier::cli {
namespace {

struct PoolArgs {
  std::vector<std::string> gpus = {"h200", "b200", "b300"};
  std::vector<std::string> models = {"deepseek-v4-pro", "glm-5.2"};
  std::string profiles_dir;
  sim::ServingOptions serving;
  uint32_t concurrency = 384;
  std::string kv_dtype;
  bool json = false;
};

std::string Span(const sim::KvGroup& g) {
  switch (g.kind) {
    case sim::KvGroupKind::kSlidingWindow:
      return "window " + std::to_string(g.window);
    case sim::KvGroupKind::kState:
      return std::to_string(g.slots) + (g.in_window_pool ? " slots/page" : " slots/req");
    default:
      return g.ratio > 1 ? "1 per " + std::to_string(g.ratio) : "1 per token";
  }
}

nlohmann::json Groups(const sim::ModelProfile& m, const std::string& dtype, bool print) {
  const sim::KvGroupLayout& l = m.kv_layout;
  nlohmann::json rows = nlohmann::json::array();
  if (print) {
    std::printf("  KV by layer group (page %u tokens; window pool %.2f x cached tokens):\n",
                l.block_tokens, l.window_pool_ratio);
    std::printf("  %-18s %-15s %6s %8s %-15s %9s %14s %12s\n", "group", "kind", "layers", "entry B",
                "entries", "page B", "B/cached tok", "B/request");
  }
  for (const sim::KvGroup& g : l.groups) {
    const sim::KvGroupBytes b = sim::GroupBytes(l, g, dtype);
    const double per_token = b.per_token + l.window_pool_ratio * b.per_window_token;
    rows.push_back({{"name", g.name},
                    {"kind", sim::KvGroupKindName(g.kind)},
                    {"layers", g.layers},
                    {"entry_bytes", g.entry_bytes},
                    {"dtype", g.dtype},
                    {"entries", Span(g)},
                    {"page_bytes", b.page_bytes},
                    {"bytes_per_cached_token", per_token},
                    {"bytes_per_request", b.per_request}});
    if (print) {
      std::printf("  %-18s %-15s %6u %8.0f %-15s %9.0f %14.1f %12.0f\n", g.name.c_str(),
                  sim::KvGroupKindName(g.kind), g.layers, g.entry_bytes, Span(g).c_str(),
                  b.page_bytes, per_token, b.per_request);
    }
  }
  return rows;
}

nlohmann::json Terms(const sim::ModelProfile& m, const sim::HbmBudget& b, const PoolArgs& a,
                     bool print) {
  const double gb = 1e9;
  const uint32_t dp = a.serving.dp;
  nlohmann::json j = {{"gpu_bytes", b.gpu_bytes},
                      {"memory_utilization", a.serving.memory_utilization},
                      {"usable_bytes_per_gpu", b.usable_bytes},
                      {"expert_bytes_per_gpu", b.expert_bytes},
                      {"other_weight_bytes_per_gpu", b.dense_bytes},
                      {"reserve_bytes_per_gpu", b.reserve_bytes},
                      {"kv_bytes_per_gpu", b.kv_gpu_bytes},
                      {"gpus_per_rank", b.gpus_per_rank},
                      {"kv_bytes_per_rank", b.kv_bytes},
                      {"running_per_rank", b.running},
                      {"bytes_per_running_request", b.per_request_bytes},
                      {"fixed_bytes_per_rank", b.fixed_bytes},
                      {"bytes_per_cached_token", b.token_bytes},
                      {"pool_tokens_per_rank", b.tokens},
                      {"pool_bytes_per_rank", b.pool_bytes},
                      {"pool_tokens_per_replica", b.tokens * dp}};
  if (!print) return j;
  std::printf("  HBM per GPU %.1f GB x memory utilization %.2f = %.1f GB\n", b.gpu_bytes / gb,
              a.serving.memory_utilization, b.usable_bytes / gb);
  if (m.expert_params_b > 0) {
    std::printf("   - routed experts %.1fB params x %.3f B / %u GPUs = %.1f GB\n",
                m.expert_params_b, m.expert_bytes_per_param, a.serving.tp, b.expert_bytes / gb);
    std::printf("   - other weights %.1fB params x %.3f B / %u GPUs per rank = %.1f GB\n",
                m.params_b - m.expert_params_b, m.dense_bytes_per_param, b.gpus_per_rank,
                b.dense_bytes / gb);
  } else {
    std::printf("   - weights %.1fB params x %.3f B / %u GPUs = %.1f GB\n", m.params_b,
                m.weight_bytes_per_param, a.serving.tp, b.dense_bytes / gb);
  }
  std::printf("   - reserve %.1f GB\n   = KV %.1f GB per GPU", b.reserve_bytes / gb,
              b.kv_gpu_bytes / gb);
  std::printf(", %.1f GB per rank (%u GPU%s, %s)\n", b.kv_bytes / gb, b.gpus_per_rank,
              b.gpus_per_rank == 1 ? "" : "s",
              m.kv_layout.replicated_across_tp ? "KV replicated on each" : "KV sharded");
  std::printf("   - per-request state %u running x %.2f MB = %.2f GB\n", b.running,
              b.per_request_bytes / 1e6, b.fixed_bytes / gb);
  if (b.tokens == 0) {
    std::printf("   = nothing left for cached tokens: the weights do not fit\n");
    return j;
  }
  std::printf(
      "   = pool %.1f GB / %.1f B per cached token = %.2f M tokens per rank (%.1f M per "
      "replica of %u ranks)\n",
      b.pool_bytes / gb, b.token_bytes, b.tokens / 1e6, b.tokens * double(dp) / 1e6, dp);
  return j;
}

int RunPool(const PoolArgs& a) {
  nlohmann::json all = nlohmann::json::array();
  for (const std::string& gname : a.gpus) {
    for (const std::string& mname : a.models) {
      auto g = sim::LoadGpuProfile(gname, a.profiles_dir);
      auto m = sim::LoadModelProfile(mname, a.profiles_dir);
      if (!g.ok() || !m.ok()) {
        std::fprintf(stderr, "kvtier plan pool: %s\n",
                     (!g.ok() ? g.status() : m.status()).ToString().c_str());
        return 2;
      }
      sim::ServingOptions so = a.serving;
      so.kv_dtype = a.kv_dtype;
      so.running_per_rank = (a.concurrency + so.dp - 1) / so.dp;
      auto b = sim::ComputeHbmBudget(*g, *m, so);
      if (!b.ok()) {
        std::fprintf(stderr, "kvtier plan pool: %s\n", b.status().ToString().c_str());
        return 2;
      }
      const std::string dtype = a.kv_dtype.empty() ? m->kv_dtype : a.kv_dtype;
      if (!a.json) {
        std::printf("%s on %s: tp %u, dp %u, KV %s, concurrency %u\n", m->name.c_str(),
                    g->name.c_str(), so.tp, so.dp, dtype.c_str(), a.concurrency);
      }
      nlohmann::json row = {{"gpu", g->name}, {"model", m->name}, {"tp", so.tp}, {"dp", so.dp}};
      row["groups"] = Groups(*m, a.kv_dtype, !a.json);
      row["terms"] = Terms(*m, *b, a, !a.json);
      if (!a.json) std::printf("\n");
      all.push_back(row);
    }
  }
  // One pair: its object; several: an array of them (as plan ttft does).
  if (a.json) std::printf("%s\n", (all.size() == 1 ? all[0] : all).dump(2).c_str());
  return 0;
}

}  // namespace
}  // namespace kvtier::cli

KVTIER_REGISTER_COMMAND(
    plan_pool, ({"plan", "pool"}),
    "HBM pool per data-parallel rank, term by term, and KV bytes per token by layer group",
    [](CLI::App* app) -> kvtier::cli::RunFn {
      auto a = std::make_shared<kvtier::cli::PoolArgs>();
      a->serving.tp = 8;
      a->serving.dp = 8;
      app->add_option("--gpu", a->gpus, "GPU profiles")->delimiter(',')->capture_default_str();
      app->add_option("--model", a->models, "Model profiles")
          ->delimiter(',')
          ->capture_default_str();
      app->add_option("--profiles", a->profiles_dir, "Extra folder with gpus/ and models/");
      app->add_option("--tp", a->serving.tp, "GPUs per replica")->capture_default_str();
      app->add_option("--dp", a->serving.dp, "Data-parallel attention ranks per replica")
          ->capture_default_str();
      app->add_option("--memory-utilization", a->serving.memory_utilization,
                      "Engine's share of HBM for weights and KV (gpu_memory_utilization)")
          ->capture_default_str();
      app->add_option("--reserve-gb", a->serving.reserve_gb, "Per GPU, beyond the rest")
          ->capture_default_str();
      app->add_option("--concurrency", a->concurrency, "Running requests per replica")
          ->capture_default_str();
      app->add_option("--kv-dtype", a->kv_dtype, "KV element type (default: the model's)")
          ->check(CLI::IsMember({"bf16", "fp16", "fp8"}));
      app->add_flag("--json", a->json, "Print JSON instead of text");
      return [a] { return kvtier::cli::RunPool(*a); };
    });
