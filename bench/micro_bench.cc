// Micro benchmarks: kvtier_micro_bench [--benchmark_filter=...]. Whole-path figures with
// same-run baselines come from `kvtier bench host`.
#include <benchmark/benchmark.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <random>

#include "index/block_index.h"
#include "kvtier/block_key.h"
#include "kvtier/cache.h"
#include "kvtier/policy.h"

// Every heap allocation of the process, counted so the Cache benchmarks report allocations
// per block (aligned new is not counted; nothing on those paths uses it).
std::atomic<uint64_t> g_allocations{0};

// Not inlined: GCC would otherwise see free() meet a pointer from new and warn.
__attribute__((noinline)) void* operator new(size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
__attribute__((noinline)) void operator delete(void* p) noexcept { std::free(p); }
__attribute__((noinline)) void operator delete(void* p, size_t) noexcept { std::free(p); }

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

// Cache::Store and Load of one turn's blocks on a host tier, with the per-block bookkeeping
// (hashing, index probes, policy, allocation) included; allocs_per_block counts the heap
// allocations (index probes are not counted: the index keeps no probe counter). Small blocks
// (range(1) bytes) make the bookkeeping, not the copy, the figure; a full-size block shows the
// copy.
struct HostCache {
  std::unique_ptr<Cache> cache;
  std::vector<TokenId> tokens;
  std::vector<std::byte> bytes;
  std::vector<ConstBlock> in;
  std::vector<MutableBlock> out;
  HostCache(size_t blocks, uint32_t head_dim) {
    CacheOptions o;
    o.layout = KvLayout{.num_layers = 2,
                        .num_kv_heads = 1,
                        .head_dim = head_dim,
                        .dtype = DType::kFp16,
                        .block_tokens = 16};
    TierSpec host;
    host.kind = "host";
    host.capacity_bytes = 4 * blocks * o.layout.bytes_per_block();
    o.tiers = {host};
    cache = std::move(Cache::Open(o)).value();
    tokens.resize(blocks * 16);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<TokenId>(i * 7);
    const size_t bb = o.layout.bytes_per_block();
    bytes.resize(2 * blocks * bb);
    for (size_t i = 0; i < blocks; ++i) {
      in.emplace_back(bytes.data() + i * bb, bb);
      out.emplace_back(bytes.data() + (blocks + i) * bb, bb);
    }
  }
};

// Heap allocations per block stored or loaded in the timed loop.
void CountAllocationsPerBlock(benchmark::State& state, uint64_t before) {
  const double blocks = static_cast<double>(state.iterations() * state.range(0));
  state.counters["allocs_per_block"] =
      (g_allocations.load(std::memory_order_relaxed) - before) / blocks;
}

void BM_CacheStore(benchmark::State& state) {
  HostCache h(state.range(0), static_cast<uint32_t>(state.range(1)));
  uint32_t salt = 0;
  const uint64_t allocations = g_allocations.load(std::memory_order_relaxed);
  for (auto _ : state) {
    h.tokens[0] = ++salt;  // a new chain each time: every block is a real insert
    auto r = h.cache->Store(h.tokens, h.in);
    benchmark::DoNotOptimize(r);
  }
  CountAllocationsPerBlock(state, allocations);
  state.SetItemsProcessed(state.iterations() * state.range(0));
}
BENCHMARK(BM_CacheStore)->Args({256, 16})->Args({256, 4096})->Unit(benchmark::kMicrosecond);

void BM_CacheLookupLoad(benchmark::State& state) {
  HostCache h(state.range(0), static_cast<uint32_t>(state.range(1)));
  (void)h.cache->Store(h.tokens, h.in);
  const uint64_t allocations = g_allocations.load(std::memory_order_relaxed);
  for (auto _ : state) {
    auto lk = h.cache->Lookup(h.tokens);
    auto r = h.cache->Load(*lk, h.out);
    benchmark::DoNotOptimize(r);
  }
  CountAllocationsPerBlock(state, allocations);
  state.SetItemsProcessed(state.iterations() * state.range(0));
}
BENCHMARK(BM_CacheLookupLoad)->Args({256, 16})->Args({256, 4096})->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace kvtier

BENCHMARK_MAIN();
