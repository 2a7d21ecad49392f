// kvtier bench host: HostTier Store/Load GB/s beside memcpy in the same run, hashing ns/token
// and Match time of a resident 1M-token prefix.
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>

#include "bench_util.h"
#include "command.h"
#include "index/block_index.h"
#include "kvtier/block_key.h"
#include "tiers/host/host_tier.h"

namespace kvtier::cli {
namespace {

struct BenchHostOptions {
  bool json = false;
  std::string working_set = "256MiB";
  int reps = 7;
};

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// One pass of plain memcpy of the same blocks over the same number of threads: the physical
// baseline.
double MemcpyGbps(std::byte* dst, const std::byte* src, size_t block, size_t blocks, int threads) {
  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([=] {
      size_t begin = blocks * t / threads, end = blocks * (t + 1) / threads;
      for (size_t i = begin; i < end; ++i) std::memcpy(dst + i * block, src + i * block, block);
    });
  }
  for (auto& t : ts) t.join();
  return block * blocks / Seconds(t0) / 1e9;
}

int Run(const BenchHostOptions& o) {
  // At least one block of the largest size (8 MiB) per repetition.
  Result<uint64_t> working_set = ParseByteSize(o.working_set);
  if (!working_set.ok() || *working_set < (8ull << 20)) {
    std::fprintf(stderr,
                 "kvtier bench host: --working-set: '%s' is not a byte size of 8MiB or more\n",
                 o.working_set.c_str());
    return 2;
  }
  nlohmann::json out;
  out["host"] = nlohmann::json::array();
  if (!o.json)
    std::printf("%-6s %10s %7s %10s %12s %7s\n", "op", "block", "threads", "GB/s", "memcpy GB/s",
                "ratio");
  // Llama-3.1-8B rows of 128 KiB per token: 2, 16 and 64 tokens make 256 KiB, 2 MiB, 8 MiB.
  for (uint32_t tokens : {2u, 16u, 64u}) {
    auto layout = LayoutPreset("llama-3.1-8b", tokens);
    if (!layout.ok()) return 1;
    const size_t block = layout->bytes_per_block();
    const size_t blocks = *working_set / block;
    PrefaultedBuffer src(block * blocks), dst(block * blocks), base_dst(block * blocks);
    for (PrefaultedBuffer* b : {&src, &dst, &base_dst}) std::memset(b->p, 0x5a, b->n);
    std::vector<BlockKey> keys(blocks);
    std::vector<ConstBlock> in(blocks);
    std::vector<MutableBlock> outb(blocks);
    std::vector<Status> res(blocks);
    for (size_t i = 0; i < blocks; ++i) {
      keys[i] = BlockKey{tokens, i + 1};
      in[i] = ConstBlock(src.p + i * block, block);
      outb[i] = MutableBlock(dst.p + i * block, block);
    }
    for (int threads : {1, 2}) {
      HostTierOptions ho;
      ho.capacity_bytes = block * blocks;
      ho.threads = threads;
      auto tier = HostTier::Open(*layout, ho);
      if (!tier.ok()) {
        std::fprintf(stderr, "kvtier bench host: %s\n", tier.status().ToString().c_str());
        return 1;
      }
      // Each repetition times the tier and then memcpy, so the baseline shares the tier's
      // moment on a machine whose neighbours come and go.
      std::vector<double> store, load, base;
      for (int r = 0; r < o.reps; ++r) {
        (void)(*tier)->Erase(keys);
        auto t0 = std::chrono::steady_clock::now();
        (void)(*tier)->Put(keys, in, res);
        store.push_back(block * blocks / Seconds(t0) / 1e9);
        for (auto& s : res)
          if (!s.ok()) {
            std::fprintf(stderr, "kvtier bench host: store failed: %s\n", s.ToString().c_str());
            return 1;
          }
        t0 = std::chrono::steady_clock::now();
        (void)(*tier)->Get(keys, outb, res);
        load.push_back(block * blocks / Seconds(t0) / 1e9);
        for (auto& s : res)
          if (!s.ok()) return 1;
        base.push_back(MemcpyGbps(base_dst.p, src.p, block, blocks, threads));
      }
      if (std::memcmp(dst.p, src.p, block * blocks) != 0) {
        std::fprintf(stderr, "kvtier bench host: loaded bytes differ from stored bytes\n");
        return 1;
      }
      const double mc = Median(base);
      for (auto [op, v] : {std::pair{"store", Median(store)}, std::pair{"load", Median(load)}}) {
        out["host"].push_back({{"op", op},
                               {"block_bytes", block},
                               {"threads", threads},
                               {"gbps", v},
                               {"memcpy_gbps", mc},
                               {"ratio", v / mc}});
        if (!o.json)
          std::printf("%-6s %10s %7d %10.2f %12.2f %7.2f\n", op, FormatBytes(block).c_str(),
                      threads, v, mc, v / mc);
      }
    }
  }

  // Hashing: a 1M-token prompt into 64-token blocks.
  std::vector<TokenId> tokens(1 << 20);
  std::mt19937 rng(42);
  for (auto& t : tokens) t = rng() % 128256;
  std::vector<BlockKey> chain;
  BlockKey root = Namespace{"bench", "", 0, "", ""}.Root();
  std::vector<double> hash_ns;
  for (int r = 0; r < o.reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    HashPrefix(root, 64, tokens, &chain);
    hash_ns.push_back(Seconds(t0) * 1e9 / tokens.size());
  }
  // Match: the chain of 15,625 blocks (1M tokens of 64), all resident.
  chain.resize(15625);
  BlockIndex index;
  for (const BlockKey& k : chain) index.AddTier(k, 0, 0);
  MatchResult m;
  std::vector<double> match_us;
  // A Match is ~0.1 ms: many repetitions make the median robust to a noisy neighbour.
  for (int r = 0; r < 100 * o.reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    index.Match(chain, &m);
    match_us.push_back(Seconds(t0) * 1e6);
  }
  if (m.any_prefix != chain.size()) {
    std::fprintf(stderr, "kvtier bench host: Match found %u of %zu blocks\n", m.any_prefix,
                 chain.size());
    return 1;
  }
  out["hash_ns_per_token"] = Median(hash_ns);
  out["match_1m_tokens_us"] = Median(match_us);
  if (o.json) {
    std::printf("%s\n", out.dump(2).c_str());
  } else {
    std::printf("hashing (XXH3-128 chain, 64-token blocks): %.3f ns/token\n", Median(hash_ns));
    std::printf("Match of a resident 1M-token prefix (15,625 blocks): %.1f us\n", Median(match_us));
  }
  return 0;
}

}  // namespace
}  // namespace kvtier::cli

KVTIER_REGISTER_COMMAND(bench_host, ({"bench", "host"}),
                        "Host tier Store/Load GB/s beside same-run memcpy; hashing; Match",
                        [](CLI::App* app) -> kvtier::cli::RunFn {
                          auto o = std::make_shared<kvtier::cli::BenchHostOptions>();
                          app->add_flag("--json", o->json, "Print one JSON object");
                          app->add_option("--reps", o->reps, "Repetitions (median reported)")
                              ->check(CLI::Range(1, 100));
                          app->add_option(
                              "--working-set", o->working_set,
                              "Bytes moved per repetition, e.g. 64MiB (default 256MiB)");
                          return [o] { return kvtier::cli::Run(*o); };
                        });
