// Options and helpers shared by `kvtier replay` and `kvtier sweep`: which workload to load
// (trace files and folders, or a synthetic corpus) and the timed-replay hardware options.
#ifndef KVTIER_TOOLS_REPLAY_COMMON_H_
#define KVTIER_TOOLS_REPLAY_COMMON_H_

#include <sys/stat.h>
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "sim/profiles.h"
#include "sim/report.h"
#include "sim/timed_replay.h"
#include "workload/readers.h"
#include "workload/synthetic.h"

namespace kvtier::cli {

struct WorkloadArgs {
  std::vector<std::string> traces;
  std::string format;
  uint64_t synthetic_requests = 0;
  uint64_t seed = 1;
  double reuse = 1.0;
  double subagent_prob = -1;
};

struct Loaded {
  std::vector<workload::Trace> traces;  // what timed replay uses (synthetic: materialized)
  std::unique_ptr<workload::RequestStream> stream;
  std::vector<std::string> names;
  workload::SyntheticOptions synthetic;
  bool is_synthetic = false;
  double read_s = 0;        // time to read and parse the trace files
  uint64_t read_bytes = 0;  // bytes of the files read
};

inline void AddWorkloadOptions(CLI::App* app, WorkloadArgs* a) {
  app->add_option("traces", a->traces, "Trace files or folders (AgentX/WEKA JSON, Mooncake JSONL)");
  app->add_option("--format", a->format, "Force the trace format: agentx or mooncake")
      ->check(CLI::IsMember({"agentx", "weka", "mooncake"}));
  app->add_option("--synthetic", a->synthetic_requests,
                  "Replay a seeded synthetic AgentX-shaped corpus of this many requests");
  app->add_option("--seed", a->seed, "Seed of the synthetic corpus");
  app->add_option("--reuse", a->reuse, "Synthetic reuse knob in [0, 1] (1 = AgentX-like)");
  app->add_option("--subagent-prob", a->subagent_prob,
                  "Synthetic: chance a turn spawns a sub-agent");
}

inline int LoadWorkload(const WorkloadArgs& a, Loaded* out, bool need_traces = false) {
  if (a.synthetic_requests > 0) {
    if (!a.traces.empty()) {
      std::fprintf(stderr, "kvtier: give trace files or --synthetic, not both\n");
      return 2;
    }
    out->is_synthetic = true;
    out->synthetic.requests = a.synthetic_requests;
    out->synthetic.seed = a.seed;
    out->synthetic.reuse = a.reuse;
    if (a.subagent_prob >= 0) out->synthetic.subagent_prob = a.subagent_prob;
    auto s = workload::MakeSyntheticStream(out->synthetic);
    if (!s.ok()) {
      std::fprintf(stderr, "kvtier: %s\n", s.status().ToString().c_str());
      return 2;
    }
    out->stream = std::move(s).value();
    out->names = {"synthetic:seed=" + std::to_string(a.seed) + ",requests=" +
                  std::to_string(a.synthetic_requests) + ",reuse=" + std::to_string(a.reuse)};
    if (need_traces) {
      auto t = workload::StreamToTrace(*out->stream, "synthetic", 400'000'000);
      if (!t.ok()) {
        std::fprintf(stderr, "kvtier: %s\n", t.status().ToString().c_str());
        return 1;
      }
      out->traces.push_back(std::move(t).value());
    }
    return 0;
  }
  if (a.traces.empty()) {
    std::fprintf(stderr, "kvtier: no traces given (files, folders, or --synthetic N)\n");
    return 2;
  }
  std::optional<workload::TraceFormat> fmt;
  if (!a.format.empty()) fmt = workload::ParseTraceFormat(a.format);
  const auto t0 = std::chrono::steady_clock::now();
  auto t = workload::LoadTraces(a.traces, fmt);
  out->read_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!t.ok()) {
    std::fprintf(stderr, "kvtier: %s\n", t.status().ToString().c_str());
    return 1;
  }
  out->traces = std::move(t).value();
  for (const auto& tr : out->traces) {
    out->names.push_back(tr.path);
    struct stat st;
    if (stat(tr.path.c_str(), &st) == 0) out->read_bytes += static_cast<uint64_t>(st.st_size);
  }
  out->stream = workload::StreamTraces(out->traces);
  return 0;
}

struct TimedArgs {
  std::string gpu = "h200";
  std::string model = "llama-3.1-70b";
  std::string profiles_dir;
  uint32_t concurrency = 8;
  uint32_t replicas = 1;
  uint32_t tp = 0;
  uint64_t max_requests = 0;
  std::string host = "auto";  // capacity: "off", "auto" (4x the HBM KV), or bytes ("512GiB")
  std::string disk = "off";
  std::string remote = "off";
  double disk_gbps = 6, disk_latency_us = 100;
  double remote_gbps = 25, remote_latency_us = 200;
  double hbm_kv_gb = 0;
  double memory_utilization = 0.9;
  bool no_planner = false;
  std::string kv_dtype;
  double spec_accept = 0;
  uint32_t dp = 1;
  std::string dp_routing = "affinity";
  bool agentx_rules = false;
  uint64_t start_seed = 1;
  // < 0: unset (0, or with --agentx-rules the rules' defaults below).
  double warmup_s = -1, window_s = -1, max_idle_s = -1;
};

// --agentx-rules defaults (ours: InferenceX's exact figures are not published here): 5 minutes
// of warm-up, a 30-minute measuring window, think time capped at 5 minutes.
constexpr double kAgentxWarmupS = 300, kAgentxWindowS = 1800, kAgentxMaxIdleS = 300;

constexpr uint32_t kMaxConcurrency = 1u << 20;

inline void AddTimedOptions(CLI::App* app, TimedArgs* a) {
  app->add_option("--gpu", a->gpu, "GPU profile (sim/profiles/gpus) or a .json path");
  app->add_option("--model", a->model, "Model profile (sim/profiles/models) or a .json path");
  app->add_option("--profiles", a->profiles_dir, "Extra folder with gpus/ and models/ profiles");
  // Each live tree holds its turn state; beyond about a million nothing simulates faster, and
  // 10^8 took 18 GB before the first request.
  app->add_option("--concurrency", a->concurrency, "Live session trees at once (1..1048576)")
      ->check(CLI::Range(1u, kMaxConcurrency));
  app->add_option("--replicas", a->replicas, "Engine replicas (they share the remote tier)");
  app->add_option("--tp", a->tp, "GPUs per replica (0 = fewest that hold the weights)");
  app->add_option("--requests", a->max_requests, "Stop after this many requests (0 = one pass)");
  app->add_option("--host", a->host, "Host DRAM tier: off, auto (4x HBM KV) or a size like 512GiB");
  app->add_option("--disk", a->disk, "SSD tier: off or a size like 4TiB");
  app->add_option("--remote", a->remote, "Shared remote tier: off or a size like 20TiB");
  app->add_option("--disk-gbps", a->disk_gbps, "SSD bandwidth, GB/s");
  app->add_option("--disk-latency-us", a->disk_latency_us, "SSD per-op latency, us");
  app->add_option("--remote-gbps", a->remote_gbps, "Remote tier bandwidth per replica, GB/s");
  app->add_option("--remote-latency-us", a->remote_latency_us, "Remote per-op latency, us");
  app->add_option("--hbm-kv-gb", a->hbm_kv_gb, "HBM KV capacity per replica, GB (0 = derived)");
  app->add_option("--memory-utilization", a->memory_utilization,
                  "Engine's share of HBM for weights and KV (gpu_memory_utilization)")
      ->capture_default_str();
  app->add_flag("--no-planner", a->no_planner, "Always load what is cached (never recompute)");
  app->add_option("--kv-dtype", a->kv_dtype, "KV element type: bf16, fp8 (default: the model's)")
      ->check(CLI::IsMember({"bf16", "fp16", "fp8"}));
  app->add_option("--spec-accept", a->spec_accept,
                  "Speculative decoding: mean tokens per decode step (0 = the model's, 1 = off)");
  app->add_option("--dp", a->dp, "Data-parallel attention ranks per replica (HBM pool split)");
  app->add_option("--dp-routing", a->dp_routing,
                  "affinity (hash of the session id) or round-robin (per request)")
      ->check(CLI::IsMember({"affinity", "round-robin"}));
  app->add_flag("--agentx-rules", a->agentx_rules,
                "AgentX replay rules: seeded start 25-75% into each session with its context "
                "warmed, idle capped at 5 min, a measuring window after a warm-up");
  app->add_option("--start-seed", a->start_seed, "Seed of the AgentX start points");
  app->add_option("--warmup-s", a->warmup_s,
                  "Seconds before the measuring window (--agentx-rules: 300)");
  app->add_option("--window-s", a->window_s,
                  "Measuring window, seconds (0 = the whole run; --agentx-rules: 1800)");
  app->add_option("--max-idle-s", a->max_idle_s,
                  "Cap on a session's think time, seconds (0 = none; --agentx-rules: 300)");
}

// Parses "off", "auto" or a byte size ("512GiB", "2TB", "1e12").
inline Result<uint64_t> ParseTierSize(const std::string& text, bool* enabled, bool* automatic) {
  *enabled = text != "off";
  *automatic = text == "auto";
  if (!*enabled || *automatic) return uint64_t{0};
  double v = 0;
  size_t used = 0;
  try {
    v = std::stod(text, &used);
  } catch (...) {
    return Status::InvalidArgument("bad size '" + text + "'");
  }
  std::string unit = text.substr(used);
  double mult = 1;
  if (unit == "" || unit == "B")
    mult = 1;
  else if (unit == "KB")
    mult = 1e3;
  else if (unit == "MB")
    mult = 1e6;
  else if (unit == "GB")
    mult = 1e9;
  else if (unit == "TB")
    mult = 1e12;
  else if (unit == "KiB")
    mult = 1024.0;
  else if (unit == "MiB")
    mult = 1024.0 * 1024;
  else if (unit == "GiB")
    mult = 1024.0 * 1024 * 1024;
  else if (unit == "TiB")
    mult = 1024.0 * 1024 * 1024 * 1024;
  else
    return Status::InvalidArgument("bad size unit in '" + text + "' (B, GB, GiB, TB, TiB)");
  if (!(v >= 0)) return Status::InvalidArgument("negative size '" + text + "'");
  return static_cast<uint64_t>(v * mult);
}

// Builds TimedOptions from the arguments; prints the error and returns false on bad input.
inline bool MakeTimedOptions(const TimedArgs& a, const std::string& policy, sim::TimedOptions* o,
                             sim::GpuProfile* gpu, sim::ModelProfile* model) {
  auto g = sim::LoadGpuProfile(a.gpu, a.profiles_dir);
  auto m = sim::LoadModelProfile(a.model, a.profiles_dir);
  if (!g.ok() || !m.ok()) {
    std::fprintf(stderr, "kvtier: %s\n", (!g.ok() ? g.status() : m.status()).ToString().c_str());
    return false;
  }
  *gpu = *g;
  *model = *m;
  o->concurrency = a.concurrency;
  o->replicas = a.replicas;
  o->tp = a.tp;
  o->max_requests = a.max_requests;
  if (!policy.empty()) o->policy = policy;
  o->planner = !a.no_planner;
  o->kv_dtype = a.kv_dtype;
  o->spec_acceptance_length = a.spec_accept;
  o->dp = a.dp;
  o->dp_round_robin = a.dp_routing == "round-robin";
  o->agentx_rules = a.agentx_rules;
  o->seed = a.start_seed;
  auto pick = [&](double given, double rules) {
    return given >= 0 ? given : (a.agentx_rules ? rules : 0.0);
  };
  o->warmup_s = pick(a.warmup_s, kAgentxWarmupS);
  o->window_s = pick(a.window_s, kAgentxWindowS);
  o->max_idle_s = pick(a.max_idle_s, kAgentxMaxIdleS);
  o->hbm_kv_bytes = static_cast<uint64_t>(a.hbm_kv_gb * 1e9);
  o->hbm_kv_fraction = a.memory_utilization;
  struct {
    const std::string& text;
    sim::TierSpec* spec;
    double gbps, lat_us;
  } tiers[] = {{a.host, &o->host, 0, 0},
               {a.disk, &o->disk, a.disk_gbps, a.disk_latency_us},
               {a.remote, &o->remote, a.remote_gbps, a.remote_latency_us}};
  for (auto& t : tiers) {
    bool enabled = false, automatic = false;
    auto size = ParseTierSize(t.text, &enabled, &automatic);
    if (!size.ok()) {
      std::fprintf(stderr, "kvtier: %s\n", size.status().ToString().c_str());
      return false;
    }
    t.spec->enabled = enabled;
    t.spec->capacity_bytes = *size;  // 0 with enabled = automatic size
    t.spec->bandwidth_gbps = t.gbps;
    t.spec->latency_s = t.lat_us * 1e-6;
  }
  if (Status s = o->Validate(); !s.ok()) {
    std::fprintf(stderr, "kvtier: %s\n", s.ToString().c_str());
    return false;
  }
  return true;
}

}  // namespace kvtier::cli

#endif  // KVTIER_TOOLS_REPLAY_COMMON_H_
