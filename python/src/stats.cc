#include "stats.h"

#include <nanobind/stl/string.h>

#include <string>

#include "obs/stats_schema.h"

namespace nb = nanobind;

namespace kvtier {
namespace {

nb::dict HistogramDict(const Histogram::Snapshot& h) {
  nb::dict d;
  d["count"] = h.count;
  d["sum"] = h.sum;
  d["max"] = h.max;
  d["mean"] = h.Mean();
  d["p50"] = h.Percentile(0.5);
  d["p99"] = h.Percentile(0.99);
  return d;
}

const char* ScopeName(StatScope s) {
  switch (s) {
    case StatScope::kCache:
      return "cache";
    case StatScope::kTier:
      return "tier";
    case StatScope::kServe:
      return "serve";
  }
  return "unknown";
}

}  // namespace

nb::dict StatsDict(const CacheStats& s, const ServeCounters* serve) {
  nb::list tiers;
  for (const auto& t : s.tiers) {
    nb::dict d;
    d["name"] = t.name;
    d["kind"] = std::string(TierKindName(t.kind));
    for (const StatField& f : StatFields())
      if (f.scope == StatScope::kTier) d[std::string(f.name).c_str()] = StatValue(f, t);
    nb::dict counters;  // the kind's own (remote: breaker_opens, timeouts, corruptions, ...)
    for (const auto& c : t.tier.counters) counters[c.name.c_str()] = c.value;
    d["counters"] = counters;
    for (const StatHistogram& h : StatHistograms())
      if (h.scope == StatScope::kTier)
        d[std::string(h.name).c_str()] = HistogramDict(HistogramValue(h, t));
    tiers.append(d);
  }
  nb::dict d;
  d["tiers"] = tiers;
  for (const StatField& f : StatFields()) {
    if (f.scope == StatScope::kCache) d[std::string(f.name).c_str()] = StatValue(f, s);
    if (f.scope == StatScope::kServe && serve != nullptr)
      d[std::string(f.name).c_str()] = StatValue(f, *serve);
  }
  for (const StatHistogram& h : StatHistograms())
    if (h.scope == StatScope::kCache)
      d[std::string(h.name).c_str()] = HistogramDict(HistogramValue(h, s));
  return d;
}

void RegisterStats(nb::module_& m) {
  m.def(
      "stat_fields",
      [] {
        nb::list out;
        for (const StatField& f : StatFields()) {
          nb::dict d;
          d["name"] = std::string(f.name);
          d["scope"] = ScopeName(f.scope);
          d["kind"] = f.kind == StatKind::kGauge ? "gauge" : "counter";
          d["unit"] = std::string(f.unit);
          d["metric"] = std::string(f.metric);
          d["help"] = std::string(f.help);
          out.append(d);
        }
        return out;
      },
      "The stats schema: every field of stats() (scope cache; tier: in each of stats()['tiers']) "
      "and of Client.daemon_stats() (scope serve), with its unit, kind and Prometheus name.");
}

}  // namespace kvtier
