#include "status_format.h"

#include <cstdio>

#include "obs/stats_schema.h"

namespace kvtier::cli {
namespace {

// Appends " name=value", starting a new indented line past 100 columns.
void Field(std::string* out, size_t* col, std::string_view name, uint64_t value) {
  const std::string item = " " + std::string(name) + "=" + std::to_string(value);
  if (*col + item.size() > 100) {
    *out += "\n   ";
    *col = 3;
  }
  *out += item;
  *col += item.size();
}

// A histogram's summary: samples, mean and tail, in nanoseconds.
nlohmann::json HistogramJson(const Histogram::Snapshot& h) {
  return {{"count", h.count},
          {"mean", h.Mean()},
          {"p50", h.Percentile(0.5)},
          {"p99", h.Percentile(0.99)},
          {"max", h.max}};
}

}  // namespace

nlohmann::json StatusJson(const DaemonStatus& d) {
  const CacheStats& s = d.cache;
  nlohmann::json j;
  for (const StatField& f : StatFields()) {
    if (f.scope == StatScope::kServe) j[std::string(f.name)] = StatValue(f, d);
    if (f.scope == StatScope::kCache) j[std::string(f.name)] = StatValue(f, s);
  }
  for (const StatHistogram& h : StatHistograms())
    if (h.scope == StatScope::kCache) j[std::string(h.name)] = HistogramJson(HistogramValue(h, s));
  j["hit_rate"] = s.lookup_blocks ? static_cast<double>(s.hit_blocks) / s.lookup_blocks : 0.0;
  j["tiers"] = nlohmann::json::array();
  for (const auto& t : s.tiers) {
    nlohmann::json tj;
    tj["name"] = t.name;
    tj["kind"] = std::string(TierKindName(t.kind));
    for (const StatField& f : StatFields())
      if (f.scope == StatScope::kTier) tj[std::string(f.name)] = StatValue(f, t);
    tj["counters"] = nlohmann::json::object();
    for (const auto& c : t.tier.counters) tj["counters"][c.name] = c.value;
    for (const StatHistogram& h : StatHistograms())
      if (h.scope == StatScope::kTier)
        tj[std::string(h.name)] = HistogramJson(HistogramValue(h, t));
    j["tiers"].push_back(tj);
  }
  return j;
}

std::string StatusText(const DaemonStatus& d) {
  const CacheStats& s = d.cache;
  const double hit_rate = s.lookup_blocks ? static_cast<double>(s.hit_blocks) / s.lookup_blocks : 0;
  char line[512];
  std::string out;
  std::snprintf(line, sizeof(line),
                "daemon pid %llu: %llu clients, %llu leases, %llu reservations, %llu refused\n"
                "lookups %llu, blocks %llu, hits %llu (%.1f%%), stores %llu (%llu blocks)\n",
                (unsigned long long)d.pid, (unsigned long long)d.clients,
                (unsigned long long)d.leases, (unsigned long long)d.reservations,
                (unsigned long long)d.refused, (unsigned long long)s.lookups,
                (unsigned long long)s.lookup_blocks, (unsigned long long)s.hit_blocks,
                100 * hit_rate, (unsigned long long)s.stores, (unsigned long long)s.stored_blocks);
  out += line;
  for (const auto& t : s.tiers) {
    std::snprintf(line, sizeof(line),
                  "  tier %-8s %-6s %10llu blocks  %s / %s  hits %llu  evictions %llu\n",
                  t.name.c_str(), std::string(TierKindName(t.kind)).c_str(),
                  (unsigned long long)t.resident_blocks, FormatBytes(t.tier.used_bytes).c_str(),
                  FormatBytes(t.tier.capacity_bytes).c_str(), (unsigned long long)t.hit_blocks,
                  (unsigned long long)t.evictions);
    out += line;
  }
  // Then every field, so that nothing the daemon reports is left out.
  size_t col = 6;
  out += "\ndaemon";
  for (const StatField& f : StatFields())
    if (f.scope == StatScope::kServe) Field(&out, &col, f.name, StatValue(f, d));
  col = 5;
  out += "\ncache";
  for (const StatField& f : StatFields())
    if (f.scope == StatScope::kCache) Field(&out, &col, f.name, StatValue(f, s));
  for (const auto& t : s.tiers) {
    out += "\ntier " + t.name;
    col = 5 + t.name.size();
    for (const StatField& f : StatFields())
      if (f.scope == StatScope::kTier) Field(&out, &col, f.name, StatValue(f, t));
    for (const auto& c : t.tier.counters) Field(&out, &col, c.name, c.value);
  }
  return out + "\n";
}

}  // namespace kvtier::cli
