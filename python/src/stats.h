// The stats dicts of the Python binding, iterated from the stats schema (src/obs/stats_schema.h)
// so that every field the cache or the daemon reports is a key.
#ifndef KVTIER_PYTHON_SRC_STATS_H_
#define KVTIER_PYTHON_SRC_STATS_H_

#include <nanobind/nanobind.h>

#include "kvtier/client.h"
#include "kvtier/kv_cache.h"

namespace kvtier {

// Every cache field by name, "tiers" (a list: name, kind, every tier field, "counters", its
// histograms), the histograms' summaries, and the daemon's fields when serve is not null.
nanobind::dict StatsDict(const CacheStats& s, const ServeCounters* serve = nullptr);
// kvtier.stat_fields(): the schema itself, one dict per field.
void RegisterStats(nanobind::module_& m);

}  // namespace kvtier

#endif  // KVTIER_PYTHON_SRC_STATS_H_
