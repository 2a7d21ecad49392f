#include "engine/setup.h"

#include <utility>

#include "kvtier/config.h"

namespace kvtier::engine {

Result<EngineSetup> BuildEngine(const EngineOptions& options, uint64_t host_bytes,
                                const std::string& config_path) {
  EngineSetup s;
  KVTIER_ASSIGN_OR_RETURN(s.engine, Engine::Create(options));
  CacheOptions co;
  if (!config_path.empty()) {
    KVTIER_ASSIGN_OR_RETURN(co, LoadCacheOptionsFile(config_path));
  } else {
    TierSpec host;
    host.kind = "host";
    host.capacity_bytes = host_bytes;
    co.tiers.push_back(host);
  }
  co.layout = s.engine->layout();
  co.model_id = s.engine->config().name;
  KVTIER_ASSIGN_OR_RETURN(s.cache, Cache::Open(co));
  KVTIER_RETURN_IF_ERROR(s.engine->AttachCache(s.cache.get()));
  return s;
}

}  // namespace kvtier::engine
