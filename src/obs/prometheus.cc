// Prometheus text exposition (format 0.0.4) of the cache's stats.
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/cache.h"

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

std::string Cache::PrometheusText() const {
  const CacheStats s = stats();
  std::string out;
  auto tier_counter = [&](const char* name, const char* type, const char* help, auto get) {
    Header(&out, name, type, help);
    for (const auto& t : s.tiers)
      Line(&out, name, "tier=\"" + Escape(t.name) + "\"", static_cast<double>(get(t)));
  };
  using T = CacheStats::PerTier;
  tier_counter("kvtier_tier_hit_blocks_total", "counter", "Blocks served from the tier",
               [](const T& t) { return t.hit_blocks; });
  tier_counter("kvtier_tier_get_misses_total", "counter", "Tier reads that missed",
               [](const T& t) { return t.tier.misses; });
  tier_counter("kvtier_tier_get_bytes_total", "counter", "Bytes read from the tier",
               [](const T& t) { return t.tier.get_bytes; });
  tier_counter("kvtier_tier_put_bytes_total", "counter", "Bytes written to the tier",
               [](const T& t) { return t.tier.put_bytes; });
  tier_counter("kvtier_tier_put_failures_total", "counter", "Blocks the tier failed to store",
               [](const T& t) { return t.tier.put_failures; });
  tier_counter("kvtier_tier_evictions_total", "counter", "Blocks evicted by policy",
               [](const T& t) { return t.evictions; });
  tier_counter("kvtier_tier_writebacks_total", "counter", "Victims moved to the next tier",
               [](const T& t) { return t.writebacks; });
  tier_counter("kvtier_tier_admission_rejects_total", "counter", "Blocks refused by admission",
               [](const T& t) { return t.rejected; });
  tier_counter("kvtier_tier_corruptions_total", "counter", "Loads that failed verification",
               [](const T& t) { return t.corruptions; });
  tier_counter("kvtier_tier_write_failures_total", "counter",
               "Background writes into the tier that failed",
               [](const T& t) { return t.write_failures; });
  tier_counter("kvtier_tier_used_bytes", "gauge", "Bytes resident in the tier",
               [](const T& t) { return t.tier.used_bytes; });
  tier_counter("kvtier_tier_capacity_bytes", "gauge", "Capacity of the tier",
               [](const T& t) { return t.tier.capacity_bytes; });
  // Kind-specific counters and gauges, one metric per name over the tiers that have it.
  std::vector<std::string> seen;
  for (const auto& t : s.tiers) {
    for (const auto& c : t.tier.counters) {
      const std::string name = std::string("kvtier_tier_") + c.name + (c.gauge ? "" : "_total");
      if (std::find(seen.begin(), seen.end(), name) != seen.end()) continue;
      seen.push_back(name);
      Header(&out, name.c_str(), c.gauge ? "gauge" : "counter", c.help);
      for (const auto& u : s.tiers) {
        for (const auto& d : u.tier.counters) {
          if (std::string_view(d.name) != c.name) continue;
          Line(&out, name.c_str(), "tier=\"" + Escape(u.name) + "\"", static_cast<double>(d.value));
        }
      }
    }
  }
  Header(&out, "kvtier_tier_get_latency_seconds", "histogram", "Latency of batched tier reads");
  for (const auto& t : s.tiers)
    Histo(&out, "kvtier_tier_get_latency_seconds", "tier=\"" + Escape(t.name) + "\"",
          t.tier.get_latency_ns);
  Header(&out, "kvtier_tier_put_latency_seconds", "histogram", "Latency of batched tier writes");
  for (const auto& t : s.tiers)
    Histo(&out, "kvtier_tier_put_latency_seconds", "tier=\"" + Escape(t.name) + "\"",
          t.tier.put_latency_ns);
  auto counter = [&](const char* name, const char* help, uint64_t v) {
    Header(&out, name, "counter", help);
    Line(&out, name, "", static_cast<double>(v));
  };
  counter("kvtier_lookups_total", "Lookups", s.lookups);
  counter("kvtier_lookup_blocks_total", "Full blocks asked for by lookups", s.lookup_blocks);
  counter("kvtier_hit_blocks_total", "Blocks found loadable by lookups", s.hit_blocks);
  counter("kvtier_load_failed_blocks_total", "Blocks that failed to load (recomputed)",
          s.load_failed_blocks);
  counter("kvtier_stored_blocks_total", "Blocks newly stored", s.stored_blocks);
  counter("kvtier_write_queue_waits_total", "Stores that waited for room in the write queue",
          s.write_queue_waits);
  counter("kvtier_promotions_dropped_total", "Promotions skipped: the write queue was full",
          s.promotions_dropped);
  counter("kvtier_write_through_dropped_blocks_total",
          "Committed blocks not written through: the write queue was full (the daemon never waits)",
          s.write_through_dropped_blocks);
  Header(&out, "kvtier_lookup_latency_seconds", "histogram", "Lookup latency");
  Histo(&out, "kvtier_lookup_latency_seconds", "", s.lookup_latency_ns);
  Header(&out, "kvtier_load_latency_seconds", "histogram", "Load latency");
  Histo(&out, "kvtier_load_latency_seconds", "", s.load_latency_ns);
  Header(&out, "kvtier_store_latency_seconds", "histogram", "Store latency");
  Histo(&out, "kvtier_store_latency_seconds", "", s.store_latency_ns);
  if (const KvEventsInfo e = events_info(); !e.endpoint.empty()) {
    counter("kvtier_events_sent_total", "KV events published", e.events);
    counter("kvtier_events_batches_total", "KV-event batches published", e.batches);
    counter("kvtier_events_dropped_total", "KV events dropped on a full queue", e.dropped);
  }
  return out;
}

}  // namespace kvtier
