// kvtier demo: a few multi-turn agentic sessions on the reference engine with offload to the
// embedded host tier. Per turn: TTFT with reuse (pool + host) and without (a full recompute
// on a second engine with the same weights), where the prefix came from, bytes moved, and
// whether the next-token logits matched the recompute bit for bit.
#include <algorithm>
#include <cstdio>
#include <fstream>

#include "command.h"
#include "engine/blas_setup.h"
#include "engine/driver.h"
#include "engine/setup.h"
#include "engine_common.h"

namespace {

using namespace kvtier;

int RunDemo(const cli::SessionFlags& f) {
  if (!cli::OutputWritable("demo", f.json)) return 1;
  cli::PrepareBlas();
  int rc = 0;
  std::optional<engine::EngineSetup> setup = f.engine.Build("demo", f.PoolBlocks(), &rc);
  if (!setup) return rc;
  if (!f.engine.ApplyProfile(setup->engine.get())) return 1;
  engine::EngineOptions ref_opt = setup->engine->options();
  // Any prompt the main engine can hold fits the reference too.
  ref_opt.pool_blocks = std::max<uint64_t>(ref_opt.pool_blocks, 4096 / ref_opt.block_tokens + 64);
  Result<std::unique_ptr<engine::Engine>> reference =
      engine::Engine::CreateSharing(*setup->engine, ref_opt);
  if (!reference.ok()) {
    std::fprintf(stderr, "demo: %s\n", reference.status().ToString().c_str());
    return 1;
  }
  engine::Engine& e = *setup->engine;
  Cache& cache = *setup->cache;
  const uint32_t bt = f.engine.options.block_tokens;
  std::printf("kvtier demo: %u sessions x %u turns on the reference engine\n", f.workload.sessions,
              f.workload.turns);
  std::printf("  model   %s, OpenBLAS %s x%d thread(s)\n", e.config().ToString().c_str(),
              engine::BlasCoreName().c_str(), f.engine.options.threads);
  std::printf("  KV      %s per token, %s per %u-token block\n",
              FormatBytes(e.layout().bytes_per_token()).c_str(),
              FormatBytes(e.layout().bytes_per_block()).c_str(), bt);
  std::printf("  pool    %llu blocks (%s): the engine's \"HBM\"\n",
              (unsigned long long)e.pool().capacity_blocks(),
              FormatBytes(e.pool().capacity_blocks() * e.layout().bytes_per_block()).c_str());
  for (int t = 0; t < cache.num_tiers(); ++t) {
    std::printf("  tier %d  %s, %s (%s)\n", t, cache.tier(t).name().c_str(),
                FormatBytes(cache.tier(t).capacity_bytes()).c_str(),
                f.engine.options.write_back ? "write-back on pool eviction" : "write-through");
  }
  std::printf("\n%4s %4s %7s %8s %8s %8s %12s %14s %8s %10s %10s %7s\n", "sess", "turn", "prompt",
              "pool-hit", "host-hit", "computed", "TTFT reuse", "TTFT recompute", "speedup",
              "loaded", "stored", "logits");
  auto on_turn = [&](const engine::TurnRecord& r) {
    const engine::TurnResult& t = r.reuse;
    std::printf("%4u %4u %7u %8u %8u %8u %9.1f ms %11.1f ms %7.1fx %10s %10s %7s\n", r.session,
                r.turn, t.prompt_tokens, t.pool_hit_blocks * bt, t.loaded_blocks * bt,
                t.computed_tokens, t.ttft_s * 1e3, r.recompute_ttft_s * 1e3,
                r.recompute_ttft_s / t.ttft_s, FormatBytes(t.bytes_loaded).c_str(),
                FormatBytes(t.bytes_stored).c_str(), r.bit_exact ? "match" : "DIFFER");
    std::fflush(stdout);
  };
  Result<engine::WorkloadReport> rep =
      engine::RunWorkload(&e, reference->get(), f.workload, on_turn);
  if (!rep.ok()) {
    std::fprintf(stderr, "demo: %s\n", rep.status().ToString().c_str());
    return 1;
  }
  const double total = static_cast<double>(rep->prompt_tokens);
  std::printf("\nprompt tokens %llu: %.1f%% from the pool", (unsigned long long)rep->prompt_tokens,
              100.0 * rep->pool_hit_tokens / total);
  for (size_t t = 0; t < rep->tier_hit_tokens.size(); ++t) {
    std::printf(", %.1f%% from %s", 100.0 * rep->tier_hit_tokens[t] / total,
                cache.tier(int(t)).name().c_str());
  }
  std::printf(", %.1f%% computed\n", 100.0 * rep->computed_tokens / total);
  std::printf("bytes moved: %s loaded from tiers, %s stored to tiers\n",
              FormatBytes(rep->bytes_loaded).c_str(), FormatBytes(rep->bytes_stored).c_str());
  std::printf("logits matched the full recompute bit for bit in %u of %u turns\n",
              rep->bit_exact_turns, rep->checked_turns);
  std::printf("median TTFT speedup on turns that reused KV: %.1fx; demo took %.1f s\n",
              rep->speedup_median, rep->wall_s);
  if (!f.json.empty()) {
    std::ofstream out(f.json, std::ios::binary | std::ios::trunc);
    out << rep->ToJson();
    out.close();
    if (!out) {
      std::fprintf(stderr, "demo: cannot write %s\n", f.json.c_str());
      return 1;
    }
  }
  return rep->bit_exact_turns == rep->checked_turns ? 0 : 1;
}

}  // namespace

KVTIER_REGISTER_COMMAND(demo, ({"demo"}),
                        "Multi-turn sessions on the reference engine: TTFT with and without "
                        "reuse, hits, bytes, bit-exact logits",
                        [](CLI::App* app) -> kvtier::cli::RunFn {
                          auto f = std::make_shared<kvtier::cli::SessionFlags>();
                          f->Add(app, "Write the turns as JSON");
                          return [f] { return RunDemo(*f); };
                        });
