// Micro benchmarks: kvtier_micro_bench [--benchmark_filter=...]. Whole-path figures with
// same-run baselines come from `kvtier bench host`.
#include <benchmark/benchmark.h>

#include <random>

#include "kvtier/block_key.h"
#include "kvtier/index.h"
#include "kvtier/policy.h"

namespace kvtier {
namespace {

std::vector<BlockKey> Chain(size_t n) {
  std::vector<BlockKey> c(n);
  BlockKey p{1, 2};
  for (size_t i = 0; i < n; ++i) c[i] = p = ChainKeyFromId(p, i);
  return c;
}

void BM_HashPrefix(benchmark::State& state) {
  std::vector<TokenId> tokens(state.range(0));
  std::mt19937 rng(1);
  for (auto& t : tokens) t = rng();
  std::vector<BlockKey> out;
  BlockKey root{3, 4};
  for (auto _ : state) {
    HashPrefix(root, 64, tokens, &out);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations() * tokens.size());
}
BENCHMARK(BM_HashPrefix)->Arg(1 << 14)->Arg(1 << 20);

void BM_Match(benchmark::State& state) {
  auto chain = Chain(state.range(0));
  BlockIndex index;
  for (auto& k : chain) index.AddTier(k, 0, 0);
  MatchResult m;
  for (auto _ : state) {
    index.Match(chain, &m);
    benchmark::DoNotOptimize(m.any_prefix);
  }
  state.SetItemsProcessed(state.iterations() * chain.size());
}
BENCHMARK(BM_Match)->Arg(15625)->Unit(benchmark::kMicrosecond);

void BM_MatchAndPin(benchmark::State& state) {
  auto chain = Chain(state.range(0));
  BlockIndex index;
  for (auto& k : chain) index.AddTier(k, 0, 0);
  MatchResult m;
  for (auto _ : state) {
    PinSet pins;
    index.MatchAndPin(chain, &m, &pins);
    benchmark::DoNotOptimize(m.any_prefix);
  }
  state.SetItemsProcessed(state.iterations() * chain.size());
}
BENCHMARK(BM_MatchAndPin)->Arg(15625)->Unit(benchmark::kMicrosecond);

void BM_PolicyTouch(benchmark::State& state, const char* name) {
  const uint64_t cap = 1 << 20;
  auto policy = std::move(MakeEvictionPolicy(name, cap)).value();
  auto keys = Chain(cap);
  for (auto& k : keys) policy->OnInsert(k, {});
  std::mt19937 rng(5);
  auto all = [](const BlockKey&) { return true; };
  for (auto _ : state) {
    const BlockKey& k = keys[rng() % cap];
    policy->OnAccess(k, {});
    auto v = policy->PickVictim(all);
    policy->OnInsert(*v, {});
  }
}
BENCHMARK_CAPTURE(BM_PolicyTouch, lru, "lru");
BENCHMARK_CAPTURE(BM_PolicyTouch, s3fifo, "s3fifo");
BENCHMARK_CAPTURE(BM_PolicyTouch, arc, "arc");

}  // namespace
}  // namespace kvtier

BENCHMARK_MAIN();
