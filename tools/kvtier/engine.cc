// kvtier engine crossover: on the reference engine, TTFT of prompts of 16..16K tokens loaded
// from the host tier against their full recompute, what the planner chose and its regret.
// kvtier engine run: the multi-turn driver, once with offload (pool + tiers) and once with the
// pool only, TTFT per turn and the hit split by tier.
#include <stdlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "command.h"
#include "engine/blas_setup.h"
#include "engine/driver.h"
#include "engine/measure.h"
#include "engine/setup.h"
#include "engine_common.h"
#include "kvtier/planner.h"

namespace {

using namespace kvtier;

bool WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    return false;
  }
  return true;
}

struct CrossoverFlags {
  cli::EngineFlags engine;
  uint32_t min_tokens = 16;
  uint32_t max_tokens = 16384;
  int reps = 3;
  std::string json;
  // --tier: resumed turns loaded from one tier, synchronous against layer-wise.
  std::string tier;
  std::string disk_dir = "/var/tmp";
  std::string remote_url;
  engine::ResumeOptions resume;
};

// A fresh directory for the disk tier, removed (with what the tier wrote) when done.
struct ScratchDir {
  std::string path;
  ~ScratchDir() {
    if (!path.empty()) std::filesystem::remove_all(path);
  }
};

// The one tier --tier measures, sized to hold every prefix.
std::optional<TierSpec> ResumeTier(const CrossoverFlags& f, uint64_t bytes, ScratchDir* dir) {
  TierSpec t;
  t.kind = f.tier;
  t.capacity_bytes = bytes;
  if (f.tier == "disk") {
    std::string tmpl = f.disk_dir + "/kvtier_crossover_XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) {
      std::fprintf(stderr, "crossover: mkdtemp under %s: %s\n", f.disk_dir.c_str(),
                   std::strerror(errno));
      return std::nullopt;
    }
    dir->path = tmpl;
    t.params["path"] = tmpl;
    t.params["sync"] = "batch";
  } else if (f.tier == "remote") {
    if (f.remote_url.empty()) {
      std::fprintf(stderr, "crossover: --tier remote needs --remote-url redis://host:port\n");
      return std::nullopt;
    }
    t.params["url"] = f.remote_url;
  } else if (f.tier != "host") {
    std::fprintf(stderr, "crossover: --tier: '%s' is not host, disk or remote\n", f.tier.c_str());
    return std::nullopt;
  }
  return t;
}

int RunResumeCommand(const CrossoverFlags& f) {
  if (!cli::OutputWritable("engine crossover", f.json)) return 1;
  cli::PrepareBlas();
  if (!f.engine.config.empty()) {
    std::fprintf(stderr, "crossover: --tier builds a cache of that one tier; leave out --config\n");
    return 2;
  }
  engine::EngineOptions eo = f.engine.options;
  eo.pool_blocks = std::max(eo.pool_blocks, engine::ResumePoolBlocks(f.resume, eo.block_tokens));
  Result<engine::ModelConfig> mc =
      eo.gguf.empty() ? engine::ModelPreset(eo.model) : Result<engine::ModelConfig>(Status::Ok());
  uint32_t max_prefix = 0;
  for (uint32_t p : f.resume.prefix_tokens) max_prefix = std::max(max_prefix, p);
  // Every prefix stays resident: twice the largest, in blocks of the engine's layout (a GGUF
  // model's layout is known once loaded: --host-capacity then sizes the tier).
  uint64_t bytes = 0;
  if (!eo.gguf.empty()) {
    if (!cli::ParseSize(f.engine.host_capacity, "--host-capacity", &bytes)) return 2;
  } else if (mc.ok()) {
    bytes = 2 * (uint64_t{max_prefix} / eo.block_tokens + 2) *
            mc->Layout(eo.block_tokens).bytes_per_block() * f.resume.prefix_tokens.size();
  }
  ScratchDir dir;
  std::optional<TierSpec> tier = ResumeTier(f, bytes, &dir);
  if (!tier) return 2;
  Result<engine::EngineSetup> setup = engine::BuildEngineWithTiers(eo, {*tier});
  if (!setup.ok()) {
    std::fprintf(stderr, "crossover: %s\n", setup.status().ToString().c_str());
    return 1;
  }
  engine::Engine& e = *setup->engine;
  std::printf("engine: %s, %u-token blocks of %s; tier '%s' (%s)\n", e.config().ToString().c_str(),
              eo.block_tokens, FormatBytes(e.layout().bytes_per_block()).c_str(),
              setup->cache->tier(0).name().c_str(), f.tier.c_str());
  cli::Progress progress("crossover");
  Result<engine::ResumeResult> res =
      engine::RunResume(&e, f.resume, [&](double d, double t) { progress.Update(d, t); });
  if (!res.ok()) {
    std::fprintf(stderr, "crossover: %s\n", res.status().ToString().c_str());
    return 1;
  }
  std::printf("\n%8s %6s %9s %12s %12s %10s %12s %10s %9s %6s\n", "prefix", "new", "loaded",
              "load ms", "compute ms", "sync ms", "layerwise ms", "waited ms", "ratio", "exact");
  bool all_exact = true;
  for (const engine::ResumePoint& p : res->points) {
    const double ratio = p.layerwise_s / std::max(p.load_only_s, p.compute_only_s);
    std::printf("%8u %6u %9s %12.1f %12.1f %10.1f %12.1f %10.1f %8.3fx %6s\n", p.prefix_tokens,
                p.new_tokens, FormatBytes(p.loaded_bytes).c_str(), p.load_only_s * 1e3,
                p.compute_only_s * 1e3, p.sync_s * 1e3, p.layerwise_s * 1e3,
                p.layerwise_wait_s * 1e3, ratio, p.bit_exact ? "yes" : "NO");
    all_exact &= p.bit_exact;
  }
  std::printf(
      "\n(medians of %d; load = Lookup + Load of the prefix alone; compute = the new tokens with "
      "the prefix in place; ratio = layerwise / max(load, compute), bar <= 1.1; exact = layer-wise "
      "logits == synchronous%s; sweep %.1f s)\n",
      std::max(1, f.resume.reps),
      f.resume.verify_tokens > 0 ? " (== full recompute up to "
                                   "--verify-tokens)"
                                 : "",
      res->sweep_s);
  if (!f.json.empty() && !WriteText(f.json, res->ToJson())) return 1;
  return all_exact ? 0 : 1;
}

int RunCrossoverCommand(const CrossoverFlags& f) {
  if (!f.tier.empty()) return RunResumeCommand(f);
  if (!cli::OutputWritable("engine crossover", f.json)) return 1;
  cli::PrepareBlas();
  if (f.min_tokens == 0 || f.max_tokens < f.min_tokens) {
    std::fprintf(stderr, "crossover: need 0 < --min <= --max\n");
    return 2;
  }
  const uint32_t bt = f.engine.options.block_tokens;
  std::vector<uint32_t> lengths;
  for (uint64_t n = f.min_tokens; n <= f.max_tokens; n *= 2) lengths.push_back(uint32_t(n));
  engine::CalibrationOptions copt;  // used when no --profile is given
  copt.reps = 3;
  uint64_t pool_need = engine::CrossoverPoolBlocks(lengths, bt);
  if (f.engine.profile.empty()) {
    pool_need = std::max(pool_need, engine::CalibrationPoolBlocks(copt, bt));
  }
  int rc = 0;
  std::optional<engine::EngineSetup> setup = f.engine.Build("crossover", pool_need, &rc);
  if (!setup) return rc;
  engine::Engine& e = *setup->engine;
  const uint64_t need = (uint64_t{f.max_tokens} / bt + 1) * e.layout().bytes_per_block();
  if (setup->cache->tier(0).capacity_bytes() < need) {
    std::fprintf(stderr, "crossover: tier '%s' holds %s; the %u-token point needs %s\n",
                 setup->cache->tier(0).name().c_str(),
                 FormatBytes(setup->cache->tier(0).capacity_bytes()).c_str(), f.max_tokens,
                 FormatBytes(need).c_str());
    return 2;
  }
  std::printf("engine %s; KV %s/block of %u tokens; OpenBLAS %s x%d\n",
              e.config().ToString().c_str(), FormatBytes(e.layout().bytes_per_block()).c_str(), bt,
              engine::BlasCoreName().c_str(), f.engine.options.threads);
  CostProfile profile;
  if (!f.engine.profile.empty()) {
    Result<CostProfile> p = cli::LoadProfileFor(f.engine.profile, e);
    if (!p.ok()) {
      std::fprintf(stderr, "crossover: %s\n", p.status().ToString().c_str());
      return 1;
    }
    profile = *p;
    std::printf("planner profile: %s\n", f.engine.profile.c_str());
  } else {
    std::printf("planner profile: calibrating first (no --profile given)...\n");
    Result<engine::Calibration> cal = engine::Calibrate(&e, copt);
    if (!cal.ok()) {
      std::fprintf(stderr, "crossover: calibrate: %s\n", cal.status().ToString().c_str());
      return 1;
    }
    profile = cal->profile;
  }
  std::printf("  prefill %.2f ms + %.1f us/token + %.3f ns/pair;", profile.prefill.fixed_s * 1e3,
              profile.prefill.per_token_s * 1e6, profile.prefill.per_token_context_s * 1e9);
  for (const TierCost& t : profile.tiers) {
    std::printf(" %s %.1f us + %.2f GB/s", t.name.c_str(), t.latency_s * 1e6, t.bytes_per_s / 1e9);
  }
  std::printf("\n");
  Planner planner(profile);
  cli::Progress progress("crossover");
  Result<engine::CrossoverResult> res = engine::RunCrossover(
      &e, planner, lengths, f.reps, [&](double d, double t) { progress.Update(d, t); });
  if (!res.ok()) {
    std::fprintf(stderr, "crossover: %s\n", res.status().ToString().c_str());
    return 1;
  }
  const std::string tier = setup->cache->tier(0).name();
  std::printf("\n%7s %9s %14s %13s %8s %10s %11s %13s %6s\n", "tokens", "loaded", "load ms",
              "recompute ms", "speedup", "planner", "chosen ms", "predicted ms", "exact");
  bool all_exact = true;
  for (const engine::CrossoverPoint& p : res->points) {
    std::printf("%7u %6u bl %10.2f ms %10.2f ms %7.1fx %10s %8.2f ms %10.2f ms %6s\n", p.tokens,
                p.loaded_blocks, p.load_s * 1e3, p.recompute_s * 1e3, p.recompute_s / p.load_s,
                std::string(PlanChoiceName(p.plan.choice)).c_str(), p.chosen_s * 1e3,
                p.plan.predicted_s * 1e3, p.bit_exact ? "yes" : "NO");
    all_exact &= p.bit_exact;
  }
  std::printf(
      "\n(load = TTFT with the prefix loaded from '%s' into a cold pool, the last block "
      "computed; recompute = TTFT of the full prefill; same run)\n",
      tier.c_str());
  for (const engine::CrossoverPoint& p : res->points) {
    if (p.tokens == 4096) {
      std::printf(
          "4096-token resumed turn from %s: TTFT %.1f ms vs recompute %.1f ms = %.1fx "
          "(bar: >= 10x)\n",
          tier.c_str(), p.load_s * 1e3, p.recompute_s * 1e3, p.recompute_s / p.load_s);
    }
  }
  std::printf(
      "planner regret over the sweep: %.2f%% (bar: <= 5%%); logits bit-exact: %s; "
      "sweep took %.1f s\n",
      res->regret_pct, all_exact ? "all points" : "NOT ALL", res->sweep_s);
  if (!f.json.empty() && !WriteText(f.json, res->ToJson())) return 1;
  return all_exact ? 0 : 1;
}

void PrintTurn(const engine::TurnRecord& r, const char* label, uint32_t bt) {
  const engine::TurnResult& t = r.reuse;
  std::printf("%-9s %4u %4u %7u %8u %8u %8u %10.1f ms %9s %9s\n", label, r.session, r.turn,
              t.prompt_tokens, t.pool_hit_blocks * bt, t.loaded_blocks * bt, t.computed_tokens,
              t.ttft_s * 1e3, FormatBytes(t.bytes_loaded).c_str(),
              FormatBytes(t.bytes_stored).c_str());
}

int RunWorkloadCommand(const cli::SessionFlags& f) {
  if (!cli::OutputWritable("engine run", f.json)) return 1;
  cli::PrepareBlas();
  int rc = 0;
  std::optional<engine::EngineSetup> setup = f.engine.Build("engine run", f.PoolBlocks(), &rc);
  if (!setup) return rc;
  if (!f.engine.ApplyProfile(setup->engine.get())) return 1;
  // The same options (the sized pool included), so the two runs differ only in offload.
  Result<std::unique_ptr<engine::Engine>> pool_only =
      engine::Engine::CreateSharing(*setup->engine, setup->engine->options());
  if (!pool_only.ok()) {
    std::fprintf(stderr, "engine run: %s\n", pool_only.status().ToString().c_str());
    return 1;
  }
  const uint32_t bt = f.engine.options.block_tokens;
  std::printf("%-9s %4s %4s %7s %8s %8s %8s %13s %9s %9s\n", "mode", "sess", "turn", "prompt",
              "pool-hit", "tier-hit", "computed", "TTFT", "loaded", "stored");
  auto offload =
      engine::RunWorkload(setup->engine.get(), nullptr, f.workload,
                          [&](const engine::TurnRecord& r) { PrintTurn(r, "offload", bt); });
  if (!offload.ok()) {
    std::fprintf(stderr, "engine run: %s\n", offload.status().ToString().c_str());
    return 1;
  }
  auto pool =
      engine::RunWorkload(pool_only->get(), nullptr, f.workload,
                          [&](const engine::TurnRecord& r) { PrintTurn(r, "pool-only", bt); });
  if (!pool.ok()) {
    std::fprintf(stderr, "engine run: %s\n", pool.status().ToString().c_str());
    return 1;
  }
  uint32_t same = 0;
  double sum_off = 0, sum_pool = 0;
  for (size_t i = 0; i < offload->turns.size(); ++i) {
    const auto& a = offload->turns[i].reuse;
    const auto& b = pool->turns[i].reuse;
    same += a.logits == b.logits;
    sum_off += a.ttft_s;
    sum_pool += b.ttft_s;
  }
  for (const auto* rep : {&*offload, &*pool}) {
    const char* label = rep == &*offload ? "offload" : "pool-only";
    std::printf("%-9s: prompt tokens %llu: pool %.1f%%", label,
                (unsigned long long)rep->prompt_tokens,
                100.0 * rep->pool_hit_tokens / rep->prompt_tokens);
    for (size_t t = 0; t < rep->tier_hit_tokens.size(); ++t) {
      std::printf(", %s %.1f%%", setup->cache->tier(int(t)).name().c_str(),
                  100.0 * rep->tier_hit_tokens[t] / rep->prompt_tokens);
    }
    std::printf(", computed %.1f%%; loaded %s, stored %s; wall %.1f s\n",
                100.0 * rep->computed_tokens / rep->prompt_tokens,
                FormatBytes(rep->bytes_loaded).c_str(), FormatBytes(rep->bytes_stored).c_str(),
                rep->wall_s);
  }
  std::printf(
      "sum of TTFT: offload %.1f ms vs pool-only %.1f ms (%.2fx); logits equal in %u/%zu "
      "turns\n",
      sum_off * 1e3, sum_pool * 1e3, sum_pool / sum_off, same, offload->turns.size());
  if (!f.json.empty() && !WriteText(f.json, offload->ToJson())) return 1;
  return same == offload->turns.size() ? 0 : 1;
}

}  // namespace

KVTIER_REGISTER_COMMAND(
    engine_crossover, ({"engine", "crossover"}),
    "Load-from-host vs recompute TTFT for 16..16K-token prompts, planner regret",
    [](CLI::App* app) -> kvtier::cli::RunFn {
      auto f = std::make_shared<CrossoverFlags>();
      f->engine.Add(app, 0, "1GiB");
      app->add_option("--min", f->min_tokens, "Shortest prompt")->capture_default_str();
      app->add_option("--max", f->max_tokens,
                      "Longest prompt (powers of two "
                      "from --min)")
          ->capture_default_str();
      app->add_option("--reps", f->reps, "Repetitions (median) for prompts up to 2048 tokens")
          ->capture_default_str();
      app->add_option("--json", f->json, "Write the points as JSON");
      app->add_option("--tier", f->tier,
                      "Measure resumed turns loaded from this one tier (host, disk, remote): "
                      "load alone, compute alone, synchronous and layer-wise");
      app->add_option("--prefixes", f->resume.prefix_tokens,
                      "--tier: cached prefix lengths (tokens, whole blocks)")
          ->delimiter(',')
          ->capture_default_str();
      app->add_option("--new-tokens", f->resume.new_tokens, "--tier: tokens computed per turn")
          ->capture_default_str();
      app->add_option("--verify-tokens", f->resume.verify_tokens,
                      "--tier: a full recompute checks the logits of prompts up to this long")
          ->capture_default_str();
      app->add_option("--disk-dir", f->disk_dir,
                      "--tier disk: the tier's directory is made (and removed) under this")
          ->capture_default_str();
      app->add_option("--remote-url", f->remote_url, "--tier remote: redis://host:port");
      return [f] {
        f->resume.reps = f->reps;
        return RunCrossoverCommand(*f);
      };
    });

KVTIER_REGISTER_COMMAND(engine_run, ({"engine", "run"}),
                        "Multi-turn sessions through the engine, with offload and pool-only",
                        [](CLI::App* app) -> kvtier::cli::RunFn {
                          auto f = std::make_shared<kvtier::cli::SessionFlags>();
                          f->Add(app, "Write the offload run as JSON");
                          return [f] { return RunWorkloadCommand(*f); };
                        });
