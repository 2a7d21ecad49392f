// Flags shared by the engine subcommands (demo, engine crossover/run, calibrate), each defined
// once here so that their names, defaults and help read the same in every command.
#ifndef KVTIER_TOOLS_ENGINE_COMMON_H_
#define KVTIER_TOOLS_ENGINE_COMMON_H_

#include <fcntl.h>
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>

#include "engine/blas_setup.h"
#include "engine/driver.h"
#include "engine/engine.h"
#include "kvtier/layout.h"
#include "kvtier/planner.h"

namespace kvtier::cli {

// A cost profile for this engine: one calibrated for another block size or model would
// misprice every plan, so it is refused with both sizes named.
inline Result<CostProfile> LoadProfileFor(const std::string& path, const engine::Engine& e) {
  KVTIER_ASSIGN_OR_RETURN(CostProfile p, LoadCostProfile(path));
  if (p.block_tokens != e.options().block_tokens || p.block_bytes != e.layout().bytes_per_block()) {
    return Status::InvalidArgument(path + ": calibrated for blocks of " +
                                   std::to_string(p.block_tokens) + " tokens (" +
                                   std::to_string(p.block_bytes) + " bytes); this engine's are " +
                                   std::to_string(e.options().block_tokens) + " tokens (" +
                                   std::to_string(e.layout().bytes_per_block()) +
                                   " bytes): run 'kvtier calibrate' with the "
                                   "same --model and --block-tokens");
  }
  return p;
}

struct EngineFlags {
  engine::EngineOptions options;
  std::string host_capacity;
  std::string config;
  std::string profile;                      // planner cost profile (kvtier calibrate --json)
  CLI::Option* pool_blocks_flag = nullptr;  // set by Add: tells whether --pool-blocks was given

  void Add(CLI::App* app, uint64_t default_pool_blocks, std::string default_host = "512MiB") {
    options.pool_blocks = default_pool_blocks;
    host_capacity = std::move(default_host);
    app->add_option("--model", options.model, "Engine preset: tiny or small")
        ->capture_default_str();
    app->add_option("--gguf", options.gguf, "Llama GGUF file (F32/F16) instead of a preset");
    app->add_option("--seed", options.seed, "Seed of the random weights")->capture_default_str();
    app->add_option("--threads", options.threads,
                    "OpenBLAS threads (results are bit-exact "
                    "for a given count)")
        ->capture_default_str();
    app->add_option("--block-tokens", options.block_tokens, "Tokens per KV block")
        ->capture_default_str();
    pool_blocks_flag = app->add_option("--pool-blocks", options.pool_blocks,
                                       "Capacity of the engine's KV pool (the \"HBM\"), in blocks")
                           ->capture_default_str();
    app->add_option("--host-capacity", host_capacity, "Capacity of the embedded host tier")
        ->capture_default_str();
    app->add_option("--config", config,
                    "Cache YAML (tiers, write mode) instead of the embedded host tier");
    app->add_flag("--write-back", options.write_back,
                  "Store blocks when the pool evicts them instead of after prefill");
    app->add_option("--profile", profile,
                    "Planner cost profile from 'kvtier calibrate --json' (default: load every "
                    "cached block)");
  }

  // Gives the engine a planner from --profile; false (after printing why) when it cannot.
  bool ApplyProfile(engine::Engine* e) const {
    if (profile.empty()) return true;
    Result<CostProfile> p = LoadProfileFor(profile, *e);
    if (!p.ok()) {
      std::fprintf(stderr, "%s\n", p.status().ToString().c_str());
      return false;
    }
    e->SetPlanner(std::make_shared<const Planner>(*p));
    return true;
  }

  // Parses --host-capacity and builds the engine with its Cache, its pool holding at least
  // `need_blocks` (what the run holds at once): the default is raised to it when --pool-blocks
  // was not given, and a smaller --pool-blocks is refused naming the minimum. On failure prints
  // why, prefixed by `command`, sets *exit_code (2 for a bad flag, 1 otherwise), returns nullopt.
  std::optional<engine::EngineSetup> Build(const char* command, uint64_t need_blocks,
                                           int* exit_code) const;
};

// The flags of the commands that run the multi-turn driver (demo, engine run).
struct SessionFlags {
  EngineFlags engine;
  engine::WorkloadOptions workload;
  std::string json;

  void Add(CLI::App* app, const std::string& json_help) {
    engine.Add(app, 16);
    app->add_option("--sessions", workload.sessions)->capture_default_str();
    app->add_option("--turns", workload.turns)->capture_default_str();
    app->add_option("--system-tokens", workload.system_tokens, "Shared system prompt")
        ->capture_default_str();
    app->add_option("--first-tokens", workload.first_user_tokens)->capture_default_str();
    app->add_option("--turn-tokens", workload.turn_tokens, "New tokens per later turn")
        ->capture_default_str();
    app->add_option("--decode", workload.decode_tokens, "Greedy tokens per turn")
        ->capture_default_str();
    app->add_option("--json", json, json_help);
  }
  // Pool blocks the workload needs (for EngineFlags::Build).
  uint64_t PoolBlocks() const {
    return engine::WorkloadPoolBlocks(workload, engine.options.block_tokens);
  }
};

// An output file is checked before the run, not after it: true when `path` can be written
// (a file this creates for the check is removed again); else prints why, prefixed by command.
inline bool OutputWritable(const char* command, const std::string& path) {
  if (path.empty()) return true;
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  const bool created = fd >= 0;
  if (fd < 0 && errno == EEXIST) fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) {
    std::fprintf(stderr, "%s: cannot write %s: %s\n", command, path.c_str(), std::strerror(errno));
    return false;
  }
  ::close(fd);
  if (created) ::unlink(path.c_str());
  return true;
}

// Before anything touches OpenBLAS: the faster kernels when OpenBLAS misdetected the CPU.
inline void PrepareBlas() { engine::ReexecWithFasterBlasIfNeeded(); }

inline bool ParseSize(const std::string& text, const char* flag, uint64_t* out) {
  Result<uint64_t> v = ParseByteSize(text);
  if (!v.ok()) {
    std::fprintf(stderr, "%s: %s\n", flag, v.status().ToString().c_str());
    return false;
  }
  *out = *v;
  return true;
}

inline std::optional<engine::EngineSetup> EngineFlags::Build(const char* command,
                                                             uint64_t need_blocks,
                                                             int* exit_code) const {
  uint64_t host_bytes = 0;
  if (!ParseSize(host_capacity, "--host-capacity", &host_bytes)) {
    *exit_code = 2;
    return std::nullopt;
  }
  engine::EngineOptions sized = options;
  if (pool_blocks_flag == nullptr || pool_blocks_flag->count() == 0) {
    sized.pool_blocks = std::max(sized.pool_blocks, need_blocks);
  } else if (sized.pool_blocks < need_blocks) {
    std::fprintf(stderr,
                 "%s: --pool-blocks %llu is too small: this run holds up to %llu blocks of %u "
                 "tokens at once; pass --pool-blocks %llu or more, or leave it out to size the "
                 "pool to the run\n",
                 command, (unsigned long long)sized.pool_blocks, (unsigned long long)need_blocks,
                 sized.block_tokens, (unsigned long long)need_blocks);
    *exit_code = 2;
    return std::nullopt;
  }
  Result<engine::EngineSetup> setup = engine::BuildEngine(sized, host_bytes, config);
  if (!setup.ok()) {
    std::fprintf(stderr, "%s: %s\n", command, setup.status().ToString().c_str());
    *exit_code = 1;
    return std::nullopt;
  }
  return std::move(setup).value();
}

}  // namespace kvtier::cli

#endif  // KVTIER_TOOLS_ENGINE_COMMON_H_
