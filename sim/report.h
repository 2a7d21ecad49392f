// Reports of replays: a table for people on stdout, JSON and CSV for machines, and one
// self-contained HTML page with SVG charts.
//
// Thread-safety: reentrant. Files are written whole; a failure is InvalidArgument naming the path.
#ifndef KVTIER_SIM_REPORT_H_
#define KVTIER_SIM_REPORT_H_

#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvtier/status.h"
#include "sim/cache_compare.h"
#include "sim/timed_replay.h"

namespace kvtier::sim {

// One cache-only comparison as JSON: the fields (requests, prompt_tokens, hit_tokens,
// ideal_hit_rate, hit_rate, tokens_by_source, ttft_s, policy, capacity_tokens) for the first
// policy at the top level, and every policy, MIN and the ideal under "policies".
nlohmann::json CacheCompareJson(const CacheCompareResult& r,
                                const std::vector<std::string>& traces);
void PrintCacheCompareTable(const CacheCompareResult& r, std::FILE* out);
// One CSV row per policy (header first).
std::string CacheCompareCsv(const CacheCompareResult& r);

// What each reported number means, as {"name": "definition"}: every report carries these
// (JSON "metric_definitions", the table's footer, the HTML page's "Definitions").
nlohmann::json TimedMetricDefinitions();
nlohmann::json CacheMetricDefinitions();
void PrintDefinitions(const nlohmann::json& defs, std::FILE* out);

nlohmann::json TimedJson(const TimedResult& r);
void PrintTimedTable(const TimedResult& r, std::FILE* out);
std::string TimedCsv(const std::vector<TimedResult>& runs);

// A page with: hit-split bars per run, the TTFT CDF of each run, the pool-size sweep curve
// (hit rate vs pool multiple, when `sweep` has several pool sizes) and throughput per GPU vs
// interactivity (offload points with a dashed halo).
std::string TimedHtml(const std::vector<TimedResult>& runs, const std::string& title);
std::string CacheCompareHtml(const CacheCompareResult& r, const std::string& title);

Status WriteFile(const std::string& path, const std::string& data);

}  // namespace kvtier::sim

#endif  // KVTIER_SIM_REPORT_H_
