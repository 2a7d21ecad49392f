// What `kvtier status` prints, built from the stats schema (src/obs/stats_schema.h) so that
// every field the daemon reports is shown: JSON for --json, text otherwise.
#ifndef KVTIER_TOOLS_KVTIER_STATUS_FORMAT_H_
#define KVTIER_TOOLS_KVTIER_STATUS_FORMAT_H_

#include <string>

#include <nlohmann/json.hpp>

#include "kvtier/client.h"

namespace kvtier::cli {

// Every daemon and cache field by its schema name, each histogram's summary (count, mean, p50,
// p99, max in ns), "hit_rate", and "tiers": one object per tier with "name", "kind", every tier
// field, its histograms and "counters" (the tier's own, by name).
nlohmann::json StatusJson(const DaemonStatus& d);
// A summary (clients, hit rate, each tier's occupancy), then every field as name=value.
std::string StatusText(const DaemonStatus& d);

}  // namespace kvtier::cli

#endif  // KVTIER_TOOLS_KVTIER_STATUS_FORMAT_H_
