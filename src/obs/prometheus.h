// Prometheus text exposition (format 0.0.4) of a cache's stats and, in the daemon, its own
// counters: every field of the stats schema (obs/stats_schema.h), each tier's own counters, and
// the latency histograms. Pure; any thread.
#ifndef KVTIER_SRC_OBS_PROMETHEUS_H_
#define KVTIER_SRC_OBS_PROMETHEUS_H_

#include <string>

#include "kvtier/client.h"
#include "kvtier/events.h"
#include "kvtier/kv_cache.h"

namespace kvtier {

// The text of s, and of serve's fields when serve is not null (the daemon's /metrics).
std::string PrometheusText(const CacheStats& s, const ServeCounters* serve);
// The KV-event publisher's counters (empty when it is off).
std::string EventsPrometheusText(const KvEventsInfo& e);

}  // namespace kvtier

#endif  // KVTIER_SRC_OBS_PROMETHEUS_H_
