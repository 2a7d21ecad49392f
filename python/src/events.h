// The KV events' binding: kvtier.EventsOptions (a Cache's publisher, CacheOptions.events),
// kvtier.EngineBlockHashes (the engine's hashes a store carries) and Cache.events_info().
#ifndef KVTIER_PYTHON_SRC_EVENTS_H_
#define KVTIER_PYTHON_SRC_EVENTS_H_

#include <nanobind/nanobind.h>

#include "kvtier/events.h"

namespace kvtier {

void RegisterEvents(nanobind::module_& m);
nanobind::dict EventsInfoDict(const KvEventsInfo& info);

}  // namespace kvtier

#endif  // KVTIER_PYTHON_SRC_EVENTS_H_
