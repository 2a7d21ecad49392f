#include "replay_through.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>

#include "kvtier/cache.h"
#include "kvtier/client.h"
#include "sim/api_replay.h"
#include "sim/cache_compare.h"
#include "subprocess.h"
#include "tiers/disk/format.h"

namespace kvtier::cli {
namespace {

constexpr const char* kModel = "kvtier-replay";  // ReplayCacheOptions's model id

// A `kvtier serve` of this binary on a private socket; SIGTERMed and reaped when destroyed.
class SpawnedDaemon {
 public:
  ~SpawnedDaemon() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      int st = 0;
      waitpid(pid_, &st, 0);
    }
  }
  Status Start(const KvLayout& l, uint64_t blocks, const std::string& policy) {
    KVTIER_RETURN_IF_ERROR(dir_.Make("kvtier-replay-"));
    socket_ = dir_.path() + "/kvtier.sock";
    const std::string config = dir_.path() + "/kvtier.yaml";
    std::ofstream(config) << "model_id: " << kModel << "\nlayout: {num_layers: 1, num_kv_heads: 1, "
                          << "head_dim: 1, dtype: fp8, attention: mla, block_tokens: "
                          << l.block_tokens << "}\ntiers:\n  - kind: host\n    capacity: "
                          << blocks * l.bytes_per_block()
                          << "B\n    threads: 1\n    eviction: " << sim::ReplayLibraryPolicy(policy)
                          << "\n    params: {prefault: false}\n";
    pid_ = Spawn(
        {"/proc/self/exe", "serve", "--config", config, "--socket", socket_, "--log-level", "warn"},
        nullptr);
    if (pid_ < 0) return Status::Internal("could not start kvtier serve");
    return Status::Ok();
  }
  const std::string& socket() const { return socket_; }

 private:
  TempDir dir_;  // destroyed after the daemon is reaped
  std::string socket_;
  pid_t pid_ = -1;
};

Result<sim::CacheReplayResult> ThroughDaemon(workload::RequestStream& stream, const KvLayout& l,
                                             uint64_t blocks, const std::string& policy,
                                             const ThroughArgs& a, const sim::ApiReplayOptions& o) {
  SpawnedDaemon daemon;
  ClientOptions co;
  co.socket_path = a.socket;
  if (a.socket.empty()) {
    KVTIER_RETURN_IF_ERROR(daemon.Start(l, blocks, policy));
    co.socket_path = daemon.socket();
  }
  co.layout = l;
  co.model_id = kModel;
  co.timeout_ms = 60000;  // a time-out is a miss, which would change the figure
  KVTIER_ASSIGN_OR_RETURN(auto client, Client::Open(co));
  KVTIER_RETURN_IF_ERROR(client->WaitConnected(20000));
  KVTIER_ASSIGN_OR_RETURN(sim::CacheReplayResult r, sim::ReplayThroughApi(stream, *client, o));
  if (r.capacity_blocks != blocks)
    std::fprintf(stderr,
                 "kvtier replay: note: the daemon's first tier holds %llu blocks, the cache-only "
                 "replay %llu: the columns do not compare\n",
                 static_cast<unsigned long long>(r.capacity_blocks),
                 static_cast<unsigned long long>(blocks));
  const ClientStats cs = client->client_stats();
  if (cs.disconnects + cs.timeouts + cs.missed_lookups + cs.dropped_stores > 0)
    return Status::Unavailable("the daemon connection failed during the replay (" +
                               std::to_string(cs.timeouts) + " time-outs, " +
                               std::to_string(cs.dropped_stores) + " dropped stores)");
  return r;
}

struct Row {
  std::string policy;
  sim::CacheReplayResult trace, engine;
  std::optional<sim::CacheReplayResult> cache, daemon;
  std::optional<CacheStats::PerTier> disk;  // --disk-live: the SSD tier after the replay
};

void PrintRows(const std::vector<Row>& rows, bool per_request) {
  std::printf("%-9s %13s %13s %13s %13s %9s\n", per_request ? "req mean" : "hit rate", "cache-only",
              "cache-only", "in-process", "daemon", "daemon -");
  std::printf("%-9s %13s %13s %13s %13s %9s\n", "policy", "trace events", "engine events", "Cache",
              "Client", "Cache");
  auto pct = [&](const std::optional<sim::CacheReplayResult>& r, char* buf) {
    if (!r) return std::snprintf(buf, 16, "-"), buf;
    std::snprintf(buf, 16, "%.2f%%",
                  100 * (per_request ? r->per_request_mean_hit_rate() : r->hit_rate()));
    return buf;
  };
  for (const Row& r : rows) {
    char b[5][16];
    std::snprintf(b[4], 16, "-");
    if (r.cache && r.daemon) {
      const double d =
          per_request ? r.daemon->per_request_mean_hit_rate() - r.cache->per_request_mean_hit_rate()
                      : r.daemon->hit_rate() - r.cache->hit_rate();
      std::snprintf(b[4], 16, "%+.2f pt", 100 * d);
    }
    std::printf("%-9s %13s %13s %13s %13s %9s\n", r.policy.c_str(), pct(r.trace, b[0]),
                pct(r.engine, b[1]), pct(r.cache, b[2]), pct(r.daemon, b[3]), b[4]);
  }
}

nlohmann::json RowJson(const sim::CacheReplayResult& r) {
  return {{"hit_rate", r.hit_rate()},
          {"per_request_mean_hit_rate", r.per_request_mean_hit_rate()},
          {"hit_blocks", r.hit_blocks},
          {"blocks", r.blocks},
          {"evicted_blocks", r.evicted_blocks},
          {"seconds", r.seconds}};
}

}  // namespace

Result<TierSpec> DiskSpec(const ThroughArgs& a, const KvLayout& l, double live_tokens,
                          TempDir* dir) {
  KVTIER_RETURN_IF_ERROR(dir->Make("kvtier-replay-disk-"));
  TierSpec d;
  d.kind = "disk";
  const uint64_t blocks =
      std::max<uint64_t>(1, static_cast<uint64_t>(a.disk_live * live_tokens / l.block_tokens));
  // The SSD's capacity counts records as they lie on disk (a header page and the payload padded
  // to a page: 8 KiB for the replay's 64-byte blocks), not payload bytes.
  disk::RecordHeader record;
  record.payload_bytes = l.bytes_per_block();
  d.capacity_bytes = blocks * record.record_bytes();
  d.params["path"] = dir->path();
  d.params["sync"] = "none";  // the figure is bytes and hits, not durability
  d.admission.min_reuse = a.disk_min_reuse;
  d.admission.min_prefix_tokens = a.disk_min_prefix_tokens;
  d.admission.count_reuse_after_eviction = a.disk_count_reuse_after_eviction;
  KVTIER_RETURN_IF_ERROR(d.admission.Validate().WithContext("--disk-min-reuse"));
  return d;
}

int RunThrough(const ThroughArgs& a, const Loaded& loaded) {
  workload::RequestStream& stream = *loaded.stream;
  const bool cache = a.through == "cache" || a.through == "both";
  const bool daemon = a.through == "daemon" || a.through == "both";
  std::vector<std::string> policies = a.policies;
  if (policies.empty()) policies = {"lru-tail", "session"};
  if (!a.socket.empty() && (policies.size() != 1 || !daemon)) {
    std::fprintf(stderr,
                 "kvtier replay: --socket drives one daemon: give one --policy (the "
                 "daemon's) and --through daemon\n");
    return 2;
  }
  sim::EngineEvents events = sim::EngineEvents::kClose;
  if (a.events == "none") events = sim::EngineEvents::kNone;
  if (a.events == "request") events = sim::EngineEvents::kRequestEnd;
  // Capacity and the trace-driven figures: the cache-only replay itself.
  sim::CacheCompareOptions co;
  co.policies = policies;
  co.capacity_tokens = a.capacity_tokens;
  co.capacity_live = a.capacity_live;
  if (co.capacity_tokens == 0 && co.capacity_live == 0) co.capacity_live = 1.0;
  co.with_min = false;
  auto cmp = sim::CompareCacheOnly(stream, co);
  if (!cmp.ok()) {
    std::fprintf(stderr, "kvtier replay: %s\n", cmp.status().ToString().c_str());
    return 1;
  }
  workload::ReplayRequest first;
  stream.Rewind();
  const uint32_t bt = stream.Next(&first) ? first.block_tokens : 64;
  stream.Rewind();
  const KvLayout layout = sim::ReplayLayout(bt);
  const uint64_t blocks = cmp->capacity_tokens / bt;
  sim::ApiReplayOptions ao;
  ao.events = events;
  ao.capacity_tokens = cmp->capacity_tokens;
  std::vector<Row> rows;
  nlohmann::json j = {{"mode", "through"},
                      {"through", a.through},
                      {"session_events", std::string(sim::EngineEventsName(events))},
                      {"capacity_tokens", cmp->capacity_tokens},
                      {"capacity_blocks", blocks},
                      {"live_context_mean_tokens", cmp->stats.live_context_mean_tokens},
                      {"policies", nlohmann::json::object()}};
  for (size_t i = 0; i < policies.size(); ++i) {
    Row row;
    row.policy = policies[i];
    row.trace = cmp->policies[i];
    sim::CacheReplayOptions eo;
    eo.policy = policies[i];
    eo.capacity_tokens = cmp->capacity_tokens;
    eo.engine = events;
    Result<sim::CacheReplayResult> r = sim::ReplayCacheOnly(stream, eo);
    if (r.ok()) row.engine = *r;
    if (r.ok() && cache) {
      CacheOptions opts = sim::ReplayCacheOptions(layout, blocks, policies[i]);
      TempDir disk_dir;
      if (a.disk_live > 0) {
        const auto disk = DiskSpec(a, layout, cmp->stats.live_context_mean_tokens, &disk_dir);
        if (!disk.ok()) r = disk.status();
        if (disk.ok()) opts.tiers.push_back(*disk);
      }
      auto c = r.ok() ? Cache::Open(std::move(opts)) : Result<std::unique_ptr<Cache>>(r.status());
      sim::ApiReplayOptions run = ao;
      if (a.disk_live > 0 && c.ok()) run.after_request = [cp = c->get()] { cp->WaitForWrites(); };
      r = c.ok() ? sim::ReplayThroughApi(stream, **c, run)
                 : Result<sim::CacheReplayResult>(c.status());
      if (r.ok()) row.cache = *r;
      if (r.ok() && a.disk_live > 0) row.disk = (*c)->stats().tiers.back();
    }
    if (r.ok() && daemon) {
      r = ThroughDaemon(stream, layout, blocks, policies[i], a, ao);
      if (r.ok()) row.daemon = *r;
    }
    if (!r.ok()) {
      std::fprintf(stderr, "kvtier replay: policy %s: %s\n", policies[i].c_str(),
                   r.status().ToString().c_str());
      return 1;
    }
    nlohmann::json& p = j["policies"][policies[i]];
    p["cache_only_trace_events"] = RowJson(row.trace);
    p["cache_only_engine_events"] = RowJson(row.engine);
    if (row.cache) p["cache"] = RowJson(*row.cache);
    if (row.disk) {
      p["disk"] = {
          {"put_blocks", row.disk->tier.puts},        {"put_bytes", row.disk->tier.put_bytes},
          {"hit_blocks", row.disk->hit_blocks},       {"admitted", row.disk->admitted},
          {"skipped_reuse", row.disk->skipped_reuse}, {"skipped_prefix", row.disk->skipped_prefix}};
    }
    if (row.daemon) p["daemon"] = RowJson(*row.daemon);
    rows.push_back(std::move(row));
  }
  std::printf(
      "replay through %s: %llu requests, %llu sessions; host tier %llu blocks of %u tokens "
      "(%.2fx mean live context %.0f tokens); session events: %s\n",
      a.through.c_str(), static_cast<unsigned long long>(cmp->stats.requests),
      static_cast<unsigned long long>(cmp->stats.sessions), static_cast<unsigned long long>(blocks),
      bt,
      cmp->stats.live_context_mean_tokens > 0
          ? cmp->capacity_tokens / cmp->stats.live_context_mean_tokens
          : 0.0,
      cmp->stats.live_context_mean_tokens, std::string(sim::EngineEventsName(events)).c_str());
  PrintRows(rows, false);
  PrintRows(rows, true);
  for (const Row& r : rows) {
    if (!r.disk) continue;
    std::printf(
        "%-9s SSD tier (min_reuse %u, min_prefix_tokens %llu, count_reuse_after_eviction %s): "
        "%llu blocks written (%llu bytes), %llu hit blocks served from it, %llu skipped by "
        "reuse, %llu by prefix\n",
        r.policy.c_str(), a.disk_min_reuse,
        static_cast<unsigned long long>(a.disk_min_prefix_tokens),
        a.disk_count_reuse_after_eviction ? "true" : "false",
        static_cast<unsigned long long>(r.disk->tier.puts),
        static_cast<unsigned long long>(r.disk->tier.put_bytes),
        static_cast<unsigned long long>(r.disk->hit_blocks),
        static_cast<unsigned long long>(r.disk->skipped_reuse),
        static_cast<unsigned long long>(r.disk->skipped_prefix));
  }
  if (!a.json_path.empty()) {
    if (Status s = sim::WriteFile(a.json_path, j.dump(2) + "\n"); !s.ok()) {
      std::fprintf(stderr, "kvtier replay: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace kvtier::cli
