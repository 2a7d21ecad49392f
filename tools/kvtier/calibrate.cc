// kvtier calibrate: measures this machine for the planner (tier load latency and bandwidth
// through the Cache, the engine's prefill time against prompt length and context) and writes
// the cost profile that `kvtier engine crossover --profile` and the engine's planner load.
#include <unistd.h>

#include <cstdio>

#include "command.h"
#include "engine/blas_setup.h"
#include "engine/measure.h"
#include "engine/setup.h"
#include "engine_common.h"
#include "kvtier/planner.h"

namespace {

struct CalibrateFlags {
  kvtier::cli::EngineFlags engine;
  std::string json;
  int reps = 3;
};

int RunCalibrate(const CalibrateFlags& f) {
  using namespace kvtier;
  if (!cli::OutputWritable("calibrate", f.json)) return 1;
  cli::PrepareBlas();
  engine::CalibrationOptions opt;
  opt.reps = f.reps;
  int rc = 0;
  std::optional<engine::EngineSetup> setup = f.engine.Build(
      "calibrate", engine::CalibrationPoolBlocks(opt, f.engine.options.block_tokens), &rc);
  if (!setup) return rc;
  engine::Engine& e = *setup->engine;
  char host[256] = "";
  gethostname(host, sizeof(host) - 1);
  opt.machine = std::string(host) + ", OpenBLAS " + engine::BlasCoreName() + " x" +
                std::to_string(f.engine.options.threads);
  std::printf("calibrating %s, %s per block, on %s\n", e.config().ToString().c_str(),
              FormatBytes(e.layout().bytes_per_block()).c_str(), opt.machine.c_str());
  cli::Progress progress("calibrate");
  Result<engine::Calibration> cal =
      engine::Calibrate(&e, opt, [&](double d, double t) { progress.Update(d, t); });
  if (!cal.ok()) {
    std::fprintf(stderr, "calibrate: %s\n", cal.status().ToString().c_str());
    return 1;
  }
  const CostProfile& p = cal->profile;
  std::printf("\nprefill (median of %d):\n  %8s %8s %10s %10s\n", f.reps, "tokens", "context",
              "measured", "fit");
  for (const PrefillSample& s : cal->prefill) {
    std::printf("  %8.0f %8.0f %8.1f ms %8.1f ms\n", s.tokens, s.context, s.seconds * 1e3,
                (p.prefill.fixed_s + p.prefill.Compute(s.tokens, s.context)) * 1e3);
  }
  std::printf("  fit: %.2f ms + %.1f us/token + %.3f ns/(token x context token)\n",
              p.prefill.fixed_s * 1e3, p.prefill.per_token_s * 1e6,
              p.prefill.per_token_context_s * 1e9);
  std::printf("\ntiers (Lookup + Load through the Cache):\n");
  for (const TierCost& t : p.tiers) {
    std::printf("  %-10s latency %7.1f us, %6.2f GB/s   (baseline streaming memcpy %.2f GB/s)\n",
                t.name.c_str(), t.latency_s * 1e6, t.bytes_per_s / 1e9,
                cal->memcpy_bytes_per_s / 1e9);
  }
  const double block_compute = p.prefill.Compute(p.block_tokens, 0);
  for (const TierCost& t : p.tiers) {
    std::printf("  one block: load from %s %.3f ms vs recompute %.3f ms (at zero context)\n",
                t.name.c_str(), (t.latency_s + p.block_bytes / t.bytes_per_s) * 1e3,
                block_compute * 1e3);
  }
  if (!f.json.empty()) {
    Status st = SaveCostProfile(p, f.json);
    if (!st.ok()) {
      std::fprintf(stderr, "calibrate: %s\n", st.ToString().c_str());
      return 1;
    }
    std::printf("\nprofile written to %s\n", f.json.c_str());
  }
  return 0;
}

}  // namespace

KVTIER_REGISTER_COMMAND(
    calibrate, ({"calibrate"}),
    "Measure tier bandwidth/latency and engine prefill speed for the planner",
    [](CLI::App* app) -> kvtier::cli::RunFn {
      auto f = std::make_shared<CalibrateFlags>();
      f->engine.Add(app, 64);
      app->add_option("--json", f->json, "Write the cost profile here");
      app->add_option("--reps", f->reps, "Repetitions per measurement")->capture_default_str();
      return [f] { return RunCalibrate(*f); };
    });
