// The stats schema: every scalar the cache and the daemon report, listed once (name, unit, help,
// counter or gauge, Prometheus name, where the value lives). The wire's stats reply, the Python
// dict, `kvtier status`, /metrics and the C API's kvtier_cache_stat iterate this list instead of
// copying fields by hand, so a field added here reaches all of them (stats_schema_test checks
// that it does). doc/serve.md lists the fields.
//
// The latency histograms have a table of their own (StatHistograms); a tier's own counters
// (TierStats::counters) are not listed: they describe themselves and travel by name.
//
// Thread-safety: the table is immutable and the functions are pure.
#ifndef KVTIER_SRC_OBS_STATS_SCHEMA_H_
#define KVTIER_SRC_OBS_STATS_SCHEMA_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kvtier/client.h"
#include "kvtier/kv_cache.h"

namespace kvtier {

enum class StatScope : uint8_t {
  kCache,  // one value per cache: CacheStats
  kTier,   // one per tier: CacheStats::PerTier (label tier="<name>" on /metrics)
  kServe,  // the daemon's own: ServeCounters
};
enum class StatKind : uint8_t { kCounter, kGauge };

struct StatField {
  std::string_view name;  // [a-z_]+; unique among kCache and kServe fields, and among kTier's
  StatScope scope;
  StatKind kind;
  std::string_view unit;    // "blocks", "bytes", "calls", ...
  std::string_view metric;  // the Prometheus name (a counter's ends in _total)
  std::string_view help;
  // Where the value lives: the one matching scope is set. A pointer, not a value, so that the
  // wire decoder writes through the same accessor the encoder reads.
  uint64_t* (*cache)(CacheStats*) = nullptr;
  uint64_t* (*tier)(CacheStats::PerTier*) = nullptr;
  uint64_t* (*serve)(ServeCounters*) = nullptr;
};

// A latency histogram, by the same rules (scope kCache or kTier).
struct StatHistogram {
  std::string_view name;  // the key on the wire and in Python
  StatScope scope;
  std::string_view metric;  // the Prometheus name (seconds)
  std::string_view help;
  Histogram::Snapshot* (*cache)(CacheStats*) = nullptr;
  Histogram::Snapshot* (*tier)(CacheStats::PerTier*) = nullptr;
};

// Every field, cache scope first, then tier, then serve.
std::span<const StatField> StatFields();
// The field of `scope` called `name`; nullptr when there is none.
const StatField* FindStatField(StatScope scope, std::string_view name);

std::span<const StatHistogram> StatHistograms();
const StatHistogram* FindStatHistogram(StatScope scope, std::string_view name);

// A field's value (the field's scope must match the argument's).
uint64_t StatValue(const StatField& f, const CacheStats& s);
uint64_t StatValue(const StatField& f, const CacheStats::PerTier& t);
uint64_t StatValue(const StatField& f, const ServeCounters& c);

// A histogram's snapshot (the histogram's scope must match the argument's).
const Histogram::Snapshot& HistogramValue(const StatHistogram& h, const CacheStats& s);
const Histogram::Snapshot& HistogramValue(const StatHistogram& h, const CacheStats::PerTier& t);

// Every scalar as one flat list of (name, value), the C API's view: cache fields by name,
// tier fields and tier counters as "tier.<tier name>.<field>", and the daemon's fields by name
// when serve is not null.
std::vector<std::pair<std::string, uint64_t>> FlatStats(const CacheStats& s,
                                                        const ServeCounters* serve);

}  // namespace kvtier

#endif  // KVTIER_SRC_OBS_STATS_SCHEMA_H_
