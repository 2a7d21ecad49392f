#include "obs/stats_schema.h"

#include <array>

namespace kvtier {
namespace {

using PerTier = CacheStats::PerTier;
constexpr StatKind kCounter = StatKind::kCounter;
constexpr StatKind kGauge = StatKind::kGauge;

constexpr StatField Cache(std::string_view name, StatKind kind, std::string_view unit,
                          std::string_view metric, std::string_view help,
                          uint64_t* (*at)(CacheStats*)) {
  return {name, StatScope::kCache, kind, unit, metric, help, at, nullptr, nullptr};
}
constexpr StatField Tier(std::string_view name, StatKind kind, std::string_view unit,
                         std::string_view metric, std::string_view help,
                         uint64_t* (*at)(PerTier*)) {
  return {name, StatScope::kTier, kind, unit, metric, help, nullptr, at, nullptr};
}
constexpr StatField Serve(std::string_view name, StatKind kind, std::string_view unit,
                          std::string_view metric, std::string_view help,
                          uint64_t* (*at)(ServeCounters*)) {
  return {name, StatScope::kServe, kind, unit, metric, help, nullptr, nullptr, at};
}

// The Prometheus names of the fields /metrics had before this table are kept as they were
// (dashboards use them); the rest follow them.
constexpr std::array kStatFields = {
    Cache("lookups", kCounter, "calls", "kvtier_lookups_total", "Lookups",
          [](CacheStats* s) { return &s->lookups; }),
    Cache("lookup_blocks", kCounter, "blocks", "kvtier_lookup_blocks_total",
          "Full blocks asked for by lookups", [](CacheStats* s) { return &s->lookup_blocks; }),
    Cache("hit_blocks", kCounter, "blocks", "kvtier_hit_blocks_total",
          "Blocks found loadable by lookups", [](CacheStats* s) { return &s->hit_blocks; }),
    Cache("loads", kCounter, "calls", "kvtier_loads_total", "Loads",
          [](CacheStats* s) { return &s->loads; }),
    Cache("load_failed_blocks", kCounter, "blocks", "kvtier_load_failed_blocks_total",
          "Blocks that failed to load (recomputed)",
          [](CacheStats* s) { return &s->load_failed_blocks; }),
    Cache("stores", kCounter, "calls", "kvtier_stores_total", "Stores",
          [](CacheStats* s) { return &s->stores; }),
    Cache("stored_blocks", kCounter, "blocks", "kvtier_stored_blocks_total", "Blocks newly stored",
          [](CacheStats* s) { return &s->stored_blocks; }),
    Cache("write_queue_waits", kCounter, "calls", "kvtier_write_queue_waits_total",
          "Stores that waited for room in the write queue",
          [](CacheStats* s) { return &s->write_queue_waits; }),
    Cache("promotions_dropped", kCounter, "blocks", "kvtier_promotions_dropped_total",
          "Promotions skipped: the write queue was full",
          [](CacheStats* s) { return &s->promotions_dropped; }),
    Cache("write_through_dropped_blocks", kCounter, "blocks",
          "kvtier_write_through_dropped_blocks_total",
          "Blocks not written through: the write queue was full (a daemon commit and a lookup's "
          "reuse write never wait)",
          [](CacheStats* s) { return &s->write_through_dropped_blocks; }),

    Tier("resident_blocks", kGauge, "blocks", "kvtier_tier_resident_blocks",
         "Blocks resident in the tier", [](PerTier* t) { return &t->resident_blocks; }),
    Tier("used_bytes", kGauge, "bytes", "kvtier_tier_used_bytes", "Bytes resident in the tier",
         [](PerTier* t) { return &t->tier.used_bytes; }),
    Tier("capacity_bytes", kGauge, "bytes", "kvtier_tier_capacity_bytes", "Capacity of the tier",
         [](PerTier* t) { return &t->tier.capacity_bytes; }),
    Tier("hit_blocks", kCounter, "blocks", "kvtier_tier_hit_blocks_total",
         "Blocks served from the tier", [](PerTier* t) { return &t->hit_blocks; }),
    Tier("evictions", kCounter, "blocks", "kvtier_tier_evictions_total", "Blocks evicted by policy",
         [](PerTier* t) { return &t->evictions; }),
    Tier("writebacks", kCounter, "blocks", "kvtier_tier_writebacks_total",
         "Victims moved to the next tier", [](PerTier* t) { return &t->writebacks; }),
    Tier("rejected", kCounter, "blocks", "kvtier_tier_admission_rejects_total",
         "Blocks refused by admission (skipped_prefix + skipped_reuse)",
         [](PerTier* t) { return &t->rejected; }),
    Tier("admitted", kCounter, "blocks", "kvtier_tier_admitted_total",
         "Blocks offered to a tier below the first that its admission took",
         [](PerTier* t) { return &t->admitted; }),
    Tier("skipped_prefix", kCounter, "blocks", "kvtier_tier_admission_skipped_prefix_total",
         "Blocks refused: their request was shorter than min_prefix_tokens",
         [](PerTier* t) { return &t->skipped_prefix; }),
    Tier("skipped_reuse", kCounter, "blocks", "kvtier_tier_admission_skipped_reuse_total",
         "Blocks refused for now: fewer lookup hits than min_reuse",
         [](PerTier* t) { return &t->skipped_reuse; }),
    Tier("declined_blocks", kCounter, "blocks", "kvtier_tier_declined_blocks_total",
         "Hit blocks the engine chose to recompute rather than load (its planner)",
         [](PerTier* t) { return &t->declined_blocks; }),
    Tier("corruptions", kCounter, "blocks", "kvtier_tier_corruptions_total",
         "Loads that failed verification", [](PerTier* t) { return &t->corruptions; }),
    Tier("write_failures", kCounter, "blocks", "kvtier_tier_write_failures_total",
         "Background writes into the tier that failed",
         [](PerTier* t) { return &t->write_failures; }),
    Tier("puts", kCounter, "blocks", "kvtier_tier_put_blocks_total", "Blocks written to the tier",
         [](PerTier* t) { return &t->tier.puts; }),
    Tier("put_bytes", kCounter, "bytes", "kvtier_tier_put_bytes_total", "Bytes written to the tier",
         [](PerTier* t) { return &t->tier.put_bytes; }),
    Tier("put_failures", kCounter, "blocks", "kvtier_tier_put_failures_total",
         "Blocks the tier failed to store", [](PerTier* t) { return &t->tier.put_failures; }),
    Tier("gets", kCounter, "blocks", "kvtier_tier_get_blocks_total", "Blocks asked of the tier",
         [](PerTier* t) { return &t->tier.gets; }),
    Tier("hits", kCounter, "blocks", "kvtier_tier_get_hits_total", "Blocks the tier returned",
         [](PerTier* t) { return &t->tier.hits; }),
    Tier("misses", kCounter, "blocks", "kvtier_tier_get_misses_total", "Tier reads that missed",
         [](PerTier* t) { return &t->tier.misses; }),
    Tier("get_failures", kCounter, "blocks", "kvtier_tier_get_failures_total",
         "Tier reads that failed (corruption, unavailable, ...)",
         [](PerTier* t) { return &t->tier.get_failures; }),
    Tier("get_bytes", kCounter, "bytes", "kvtier_tier_get_bytes_total", "Bytes read from the tier",
         [](PerTier* t) { return &t->tier.get_bytes; }),
    Tier("erases", kCounter, "blocks", "kvtier_tier_erases_total", "Blocks erased from the tier",
         [](PerTier* t) { return &t->tier.erases; }),

    Serve("pid", kGauge, "pid", "kvtier_serve_pid", "The daemon's process id",
          [](ServeCounters* c) { return &c->pid; }),
    Serve("clients", kGauge, "connections", "kvtier_serve_clients", "Connected clients",
          [](ServeCounters* c) { return &c->clients; }),
    Serve("leases", kGauge, "leases", "kvtier_serve_leases", "Lookups pinning blocks now",
          [](ServeCounters* c) { return &c->leases; }),
    Serve("reservations", kGauge, "reservations", "kvtier_serve_reservations",
          "Stores between reserve and commit now",
          [](ServeCounters* c) { return &c->reservations; }),
    Serve("refused", kCounter, "connections", "kvtier_serve_refused_total",
          "Hellos refused (version, layout, credentials)",
          [](ServeCounters* c) { return &c->refused; }),
    Serve("protocol_errors", kCounter, "connections", "kvtier_serve_protocol_errors_total",
          "Connections closed for a protocol error",
          [](ServeCounters* c) { return &c->disconnects; }),
    Serve("corrupt_blocks", kCounter, "blocks", "kvtier_serve_corrupt_blocks_total",
          "Blocks a client found corrupt that the daemon checked and dropped",
          [](ServeCounters* c) { return &c->corrupt_blocks; }),
    Serve("warm_claimed_blocks", kCounter, "blocks", "kvtier_serve_warm_claimed_blocks_total",
          "Free arena slots claimed ahead for tenants, whose clients fault them in early",
          [](ServeCounters* c) { return &c->warm_claimed_blocks; }),
};

constexpr std::array kStatHistograms = {
    StatHistogram{"lookup_latency_ns", StatScope::kCache, "kvtier_lookup_latency_seconds",
                  "Lookup latency", [](CacheStats* s) { return &s->lookup_latency_ns; }},
    StatHistogram{"load_latency_ns", StatScope::kCache, "kvtier_load_latency_seconds",
                  "Load latency", [](CacheStats* s) { return &s->load_latency_ns; }},
    StatHistogram{"store_latency_ns", StatScope::kCache, "kvtier_store_latency_seconds",
                  "Store latency", [](CacheStats* s) { return &s->store_latency_ns; }},
    StatHistogram{"get_latency_ns", StatScope::kTier, "kvtier_tier_get_latency_seconds",
                  "Latency of batched tier reads", nullptr,
                  [](PerTier* t) { return &t->tier.get_latency_ns; }},
    StatHistogram{"put_latency_ns", StatScope::kTier, "kvtier_tier_put_latency_seconds",
                  "Latency of batched tier writes", nullptr,
                  [](PerTier* t) { return &t->tier.put_latency_ns; }},
};

}  // namespace

std::span<const StatField> StatFields() { return kStatFields; }
std::span<const StatHistogram> StatHistograms() { return kStatHistograms; }

const StatHistogram* FindStatHistogram(StatScope scope, std::string_view name) {
  for (const StatHistogram& h : kStatHistograms)
    if (h.scope == scope && h.name == name) return &h;
  return nullptr;
}

const StatField* FindStatField(StatScope scope, std::string_view name) {
  for (const StatField& f : kStatFields)
    if (f.scope == scope && f.name == name) return &f;
  return nullptr;
}

// The accessors only read through the pointer here.
uint64_t StatValue(const StatField& f, const CacheStats& s) {
  return *f.cache(const_cast<CacheStats*>(&s));
}
uint64_t StatValue(const StatField& f, const CacheStats::PerTier& t) {
  return *f.tier(const_cast<CacheStats::PerTier*>(&t));
}
uint64_t StatValue(const StatField& f, const ServeCounters& c) {
  return *f.serve(const_cast<ServeCounters*>(&c));
}

const Histogram::Snapshot& HistogramValue(const StatHistogram& h, const CacheStats& s) {
  return *h.cache(const_cast<CacheStats*>(&s));
}
const Histogram::Snapshot& HistogramValue(const StatHistogram& h, const CacheStats::PerTier& t) {
  return *h.tier(const_cast<CacheStats::PerTier*>(&t));
}

std::vector<std::pair<std::string, uint64_t>> FlatStats(const CacheStats& s,
                                                        const ServeCounters* serve) {
  std::vector<std::pair<std::string, uint64_t>> out;
  for (const StatField& f : kStatFields) {
    if (f.scope == StatScope::kCache) out.emplace_back(std::string(f.name), StatValue(f, s));
    if (f.scope == StatScope::kServe && serve != nullptr)
      out.emplace_back(std::string(f.name), StatValue(f, *serve));
  }
  for (const CacheStats::PerTier& t : s.tiers) {
    const std::string prefix = "tier." + t.name + ".";
    for (const StatField& f : kStatFields)
      if (f.scope == StatScope::kTier)
        out.emplace_back(prefix + std::string(f.name), StatValue(f, t));
    for (const TierStats::Counter& c : t.tier.counters) out.emplace_back(prefix + c.name, c.value);
  }
  return out;
}

}  // namespace kvtier
