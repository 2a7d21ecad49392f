// Cache-only reports (JSON, table, CSV) and file output.
#include <cstdio>
#include <fstream>

#include "sim/report.h"

namespace kvtier::sim {
namespace {

double Share(double v, double of) { return of > 0 ? v / of : 0; }

nlohmann::json PolicyJson(const CacheReplayResult& p, const CacheCompareResult& r) {
  nlohmann::json j;
  j["policy"] = p.policy;
  j["capacity_tokens"] = p.capacity_tokens;
  j["capacity_blocks"] = p.capacity_blocks;
  j["requests"] = p.requests;
  j["prompt_tokens"] = p.prompt_tokens;
  j["hit_tokens"] = p.hit_tokens;
  j["hit_rate"] = p.hit_rate();
  j["per_request_mean_hit_rate"] = p.per_request_mean_hit_rate();
  j["share_of_ideal"] = Share(p.hit_rate(), r.ideal.hit_rate());
  j["share_of_min"] = r.min ? nlohmann::json(Share(p.hit_rate(), r.min->hit_rate())) : nullptr;
  j["points_over_best_lru"] = r.best_lru_hit_rate >= 0
                                  ? nlohmann::json(100 * (p.hit_rate() - r.best_lru_hit_rate))
                                  : nullptr;
  j["blocks"] = p.blocks;
  j["hit_blocks"] = p.hit_blocks;
  j["inserted_blocks"] = p.inserted_blocks;
  j["evicted_blocks"] = p.evicted_blocks;
  j["peak_resident_blocks"] = p.peak_resident_blocks;
  j["seconds"] = p.seconds;
  j["blocks_per_s"] = p.seconds > 0 ? p.blocks / p.seconds : 0;
  return j;
}

}  // namespace

nlohmann::json CacheCompareJson(const CacheCompareResult& r,
                                const std::vector<std::string>& traces) {
  nlohmann::json j;
  const CacheReplayResult& first = r.policies.empty() ? r.ideal : r.policies.front();
  j["mode"] = "cache-only";
  j["traces"] = traces;
  j["requests"] = r.stats.requests;
  j["sessions"] = r.stats.sessions;
  j["prompt_tokens"] = r.stats.prompt_tokens;
  j["output_tokens"] = r.stats.output_tokens;
  j["policy"] = first.policy;
  j["capacity_tokens"] = r.capacity_tokens;
  j["hit_tokens"] = first.hit_tokens;
  j["hit_rate"] = first.hit_rate();
  j["ideal_hit_rate"] = r.ideal.hit_rate();
  j["min_hit_rate"] = r.min ? nlohmann::json(r.min->hit_rate()) : nullptr;
  j["live_context_mean_tokens"] = r.stats.live_context_mean_tokens;
  j["live_context_peak_tokens"] = r.stats.live_context_peak_tokens;
  // Cache-only replay has one cache: its hits are reported as HBM, the rest as recomputed.
  j["tokens_by_source"] = {{"hbm", first.hit_tokens},
                           {"host", 0},
                           {"disk", 0},
                           {"remote", 0},
                           {"recomputed", first.prompt_tokens - first.hit_tokens}};
  j["ttft_s"] = {
      {"mean", nullptr}, {"p50", nullptr}, {"p90", nullptr}, {"p95", nullptr}, {"p99", nullptr}};
  j["best_lru"] = r.best_lru;
  if (r.baseline) {
    j["baseline"] = {{"read_s", r.baseline->read_s},
                     {"read_and_hash_s", r.baseline->read_and_hash_s},
                     {"blocks", r.baseline->blocks}};
  }
  nlohmann::json ps = nlohmann::json::array();
  for (const auto& p : r.policies) ps.push_back(PolicyJson(p, r));
  j["policies"] = ps;
  j["ideal"] = PolicyJson(r.ideal, r);
  if (r.min) {
    j["min"] = PolicyJson(*r.min, r);
  } else {
    j["min"] = nullptr;
    j["min_skipped"] = r.min_skipped;
  }
  j["per_request_mean_hit_rate"] = first.per_request_mean_hit_rate();
  j["metric_definitions"] = CacheMetricDefinitions();
  return j;
}

void PrintCacheCompareTable(const CacheCompareResult& r, std::FILE* out) {
  std::fprintf(out,
               "cache-only replay: %llu requests, %llu sessions, %.3f G prompt tokens; capacity "
               "%llu tokens (%.2fx mean live context %.0f, peak %llu)\n",
               static_cast<unsigned long long>(r.stats.requests),
               static_cast<unsigned long long>(r.stats.sessions), r.stats.prompt_tokens / 1e9,
               static_cast<unsigned long long>(r.capacity_tokens),
               Share(static_cast<double>(r.capacity_tokens), r.stats.live_context_mean_tokens),
               r.stats.live_context_mean_tokens,
               static_cast<unsigned long long>(r.stats.live_context_peak_tokens));
  std::fprintf(out, "%-10s %9s %9s %9s %9s %10s %9s %10s\n", "policy", "hit rate", "req mean",
               "of ideal", "of MIN", "vs bestLRU", "seconds", "Mblocks/s");
  auto row = [&](const CacheReplayResult& p) {
    char min_share[16] = "-";
    if (r.min)
      std::snprintf(min_share, sizeof min_share, "%.1f%%",
                    100 * Share(p.hit_rate(), r.min->hit_rate()));
    char vs[16] = "-";
    if (r.best_lru_hit_rate >= 0) {
      std::snprintf(vs, sizeof vs, "%+.2f pt", 100 * (p.hit_rate() - r.best_lru_hit_rate));
    }
    std::fprintf(out, "%-10s %8.2f%% %8.2f%% %8.1f%% %9s %10s %9.2f %10.1f\n", p.policy.c_str(),
                 100 * p.hit_rate(), 100 * p.per_request_mean_hit_rate(),
                 100 * Share(p.hit_rate(), r.ideal.hit_rate()), min_share, vs, p.seconds,
                 p.seconds > 0 ? p.blocks / p.seconds / 1e6 : 0.0);
  };
  row(r.ideal);
  if (r.min) {
    row(*r.min);
  } else {
    std::fprintf(out, "%-10s skipped: %s\n", "min", r.min_skipped.c_str());
  }
  for (const auto& p : r.policies) row(p);
  if (r.baseline) {
    std::fprintf(out,
                 "same-run baseline: reading the stream %.2f s, reading + chaining %llu keys "
                 "%.2f s (%.1f Mblocks/s), no cache\n",
                 r.baseline->read_s, static_cast<unsigned long long>(r.baseline->blocks),
                 r.baseline->read_and_hash_s,
                 r.baseline->read_and_hash_s > 0
                     ? r.baseline->blocks / r.baseline->read_and_hash_s / 1e6
                     : 0.0);
  }
  PrintDefinitions(CacheMetricDefinitions(), out);
}

std::string CacheCompareCsv(const CacheCompareResult& r) {
  std::string s =
      "policy,capacity_tokens,requests,prompt_tokens,hit_tokens,hit_rate,ideal_hit_rate,"
      "min_hit_rate,share_of_min,seconds\n";
  auto row = [&](const CacheReplayResult& p) {
    char buf[512];
    std::snprintf(buf, sizeof buf, "%s,%llu,%llu,%llu,%llu,%.6f,%.6f,%s,%s,%.4f\n",
                  p.policy.c_str(), static_cast<unsigned long long>(r.capacity_tokens),
                  static_cast<unsigned long long>(p.requests),
                  static_cast<unsigned long long>(p.prompt_tokens),
                  static_cast<unsigned long long>(p.hit_tokens), p.hit_rate(), r.ideal.hit_rate(),
                  r.min ? std::to_string(r.min->hit_rate()).c_str() : "",
                  r.min ? std::to_string(Share(p.hit_rate(), r.min->hit_rate())).c_str() : "",
                  p.seconds);
    s += buf;
  };
  row(r.ideal);
  if (r.min) row(*r.min);
  for (const auto& p : r.policies) row(p);
  return s;
}

Status WriteFile(const std::string& path, const std::string& data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return Status::InvalidArgument(path + ": cannot open for writing");
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
  out.close();
  if (!out) return Status::InvalidArgument(path + ": write failed");
  return Status::Ok();
}

}  // namespace kvtier::sim
