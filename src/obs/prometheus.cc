// Prometheus text exposition (format 0.0.4) of the stats schema's fields and histograms.
#include "obs/prometheus.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/cache.h"
#include "obs/stats_schema.h"

namespace kvtier {
namespace {

void Line(std::string* out, const char* name, const std::string& labels, double value) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.17g", value);
  *out += name;
  if (!labels.empty()) *out += "{" + labels + "}";
  *out += " ";
  *out += buf;
  *out += "\n";
}

void Header(std::string* out, const char* name, const char* type, const char* help) {
  *out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

// Label values escape backslash, quote and newline.
std::string Escape(const std::string& v) {
  std::string o;
  for (char c : v) {
    if (c == '\\' || c == '"') o += '\\';
    if (c == '\n') {
      o += "\\n";
      continue;
    }
    o += c;
  }
  return o;
}

void Histo(std::string* out, const char* name, const std::string& labels,
           const Histogram::Snapshot& h) {
  uint64_t cum = 0;
  std::string sep = labels.empty() ? "" : labels + ",";
  for (int b = 0; b < Histogram::kBuckets; ++b) {
    if (h.counts[b] == 0) continue;
    cum += h.counts[b];
    char le[32];
    std::snprintf(le, sizeof(le), "%.9g", Histogram::BucketUpperBound(b) * 1e-9);
    Line(out, (std::string(name) + "_bucket").c_str(), sep + "le=\"" + le + "\"",
         static_cast<double>(cum));
  }
  Line(out, (std::string(name) + "_bucket").c_str(), sep + "le=\"+Inf\"",
       static_cast<double>(h.count));
  Line(out, (std::string(name) + "_sum").c_str(), labels, h.sum * 1e-9);
  Line(out, (std::string(name) + "_count").c_str(), labels, static_cast<double>(h.count));
}

}  // namespace

std::string_view KvEventTypeName(KvEvent::Type type) {
  switch (type) {
    case KvEvent::Type::kStored:
      return "stored";
    case KvEvent::Type::kRemoved:
      return "removed";
    case KvEvent::Type::kCleared:
      return "cleared";
  }
  return "?";
}

std::string PrometheusText(const CacheStats& s, const ServeCounters* serve) {
  std::string out;
  for (const StatField& f : StatFields()) {
    if (f.scope == StatScope::kServe && serve == nullptr) continue;
    const std::string name(f.metric);
    Header(&out, name.c_str(), f.kind == StatKind::kGauge ? "gauge" : "counter",
           std::string(f.help).c_str());
    if (f.scope == StatScope::kCache)
      Line(&out, name.c_str(), "", static_cast<double>(StatValue(f, s)));
    if (f.scope == StatScope::kServe)
      Line(&out, name.c_str(), "", static_cast<double>(StatValue(f, *serve)));
    if (f.scope != StatScope::kTier) continue;
    for (const auto& t : s.tiers)
      Line(&out, name.c_str(), "tier=\"" + Escape(t.name) + "\"",
           static_cast<double>(StatValue(f, t)));
  }
  // Kind-specific counters and gauges, one metric per name over the tiers that have it.
  std::vector<std::string> seen;
  for (const auto& t : s.tiers) {
    for (const auto& c : t.tier.counters) {
      const std::string name = "kvtier_tier_" + c.name + (c.gauge ? "" : "_total");
      if (std::find(seen.begin(), seen.end(), name) != seen.end()) continue;
      seen.push_back(name);
      Header(&out, name.c_str(), c.gauge ? "gauge" : "counter", c.help.c_str());
      for (const auto& u : s.tiers) {
        for (const auto& d : u.tier.counters) {
          if (d.name != c.name) continue;
          Line(&out, name.c_str(), "tier=\"" + Escape(u.name) + "\"", static_cast<double>(d.value));
        }
      }
    }
  }
  for (const StatHistogram& h : StatHistograms()) {
    const std::string name(h.metric);
    Header(&out, name.c_str(), "histogram", std::string(h.help).c_str());
    if (h.scope == StatScope::kCache) Histo(&out, name.c_str(), "", HistogramValue(h, s));
    if (h.scope != StatScope::kTier) continue;
    for (const auto& t : s.tiers)
      Histo(&out, name.c_str(), "tier=\"" + Escape(t.name) + "\"", HistogramValue(h, t));
  }
  return out;
}

std::string EventsPrometheusText(const KvEventsInfo& e) {
  std::string out;
  if (e.endpoint.empty()) return out;
  auto counter = [&](const char* name, const char* help, uint64_t v) {
    Header(&out, name, "counter", help);
    Line(&out, name, "", static_cast<double>(v));
  };
  counter("kvtier_events_sent_total", "KV events published", e.events);
  counter("kvtier_events_batches_total", "KV-event batches published", e.batches);
  counter("kvtier_events_dropped_total", "KV events dropped on a full queue", e.dropped);
  return out;
}

std::string Cache::PrometheusText() const {
  return kvtier::PrometheusText(stats(), nullptr) + EventsPrometheusText(events_info());
}

}  // namespace kvtier
