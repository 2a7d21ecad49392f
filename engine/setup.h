// Building an Engine with a Cache of kvtier's embedded default tiers (host DRAM), or of the
// tiers of a YAML cache config (include/kvtier/config.h), for the CLI and benchmarks.
//
// Thread-safety: none. Ownership: EngineSetup owns both; the engine points at the cache, so
// the cache is declared first and destroyed last.
#ifndef KVTIER_ENGINE_SETUP_H_
#define KVTIER_ENGINE_SETUP_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "kvtier/cache.h"

namespace kvtier::engine {

struct EngineSetup {
  std::unique_ptr<Cache> cache;
  std::unique_ptr<Engine> engine;
};

// host_bytes: capacity of the embedded host tier when config_path is empty. With a config,
// its tiers, write mode, tenant and model_id (the preset or GGUF name when it gives none) are
// used; its layout must be the engine's and its model_revision, when given, the engine's
// weights fingerprint (Engine::model_revision, which always goes into the namespace):
// InvalidArgument naming the file and key otherwise. Errors name the file or option at fault.
Result<EngineSetup> BuildEngine(const EngineOptions& options, uint64_t host_bytes,
                                const std::string& config_path = "");
// The same over the given tiers (top first), keyed by the engine's model and weights.
Result<EngineSetup> BuildEngineWithTiers(const EngineOptions& options, std::vector<TierSpec> tiers);

}  // namespace kvtier::engine

#endif  // KVTIER_ENGINE_SETUP_H_
