#include "engine/setup.h"

#include <string>
#include <utility>

#include "kvtier/config.h"

namespace kvtier::engine {
namespace {

// The engine's layout as the YAML that selects it, for the message that refuses another.
std::string LayoutYaml(const KvLayout& l) {
  return "{num_layers: " + std::to_string(l.num_layers) +
         ", num_kv_heads: " + std::to_string(l.num_kv_heads) +
         ", head_dim: " + std::to_string(l.head_dim) +
         ", dtype: " + std::string(DTypeName(l.dtype)) +
         ", attention: " + std::string(AttentionKindName(l.attention)) +
         ", block_tokens: " + std::to_string(l.block_tokens) + "}";
}

// The keys of a config that the engine decides: a config written for other weights or another
// shape is refused, never silently rewritten, and a model_id it gives is kept.
Status ReconcileConfig(const std::string& path, const Engine& e, CacheOptions* co) {
  if (!(co->layout == e.layout())) {
    return Status::InvalidArgument(path + ": layout: " + co->layout.ToString() +
                                   " is not this engine's KV layout " + e.layout().ToString() +
                                   "; write layout: " + LayoutYaml(e.layout()));
  }
  if (!co->model_revision.empty() && co->model_revision != e.model_revision()) {
    return Status::InvalidArgument(path + ": model_revision: '" + co->model_revision +
                                   "' is not this engine's weights (" + e.model_revision() +
                                   "); leave it out: the engine fingerprints its weights itself");
  }
  co->model_revision = e.model_revision();
  // "default" is CacheOptions' own value: the file named no model.
  if (co->model_id == CacheOptions{}.model_id) co->model_id = e.config().name;
  return Status::Ok();
}

// The engine's layout, model and weights fingerprint key its cache.
void EngineKeys(const Engine& e, CacheOptions* co) {
  co->layout = e.layout();
  co->model_id = e.config().name;
  co->model_revision = e.model_revision();
}

Status Attach(EngineSetup* s, const CacheOptions& co) {
  KVTIER_ASSIGN_OR_RETURN(s->cache, Cache::Open(co));
  return s->engine->AttachCache(s->cache.get());
}

}  // namespace

Result<EngineSetup> BuildEngine(const EngineOptions& options, uint64_t host_bytes,
                                const std::string& config_path) {
  EngineSetup s;
  CacheOptions co;
  if (!config_path.empty()) {
    // Read first: a bad config is refused before the weights are built.
    KVTIER_ASSIGN_OR_RETURN(co, LoadCacheOptionsFile(config_path));
  }
  KVTIER_ASSIGN_OR_RETURN(s.engine, Engine::Create(options));
  if (!config_path.empty()) {
    KVTIER_RETURN_IF_ERROR(ReconcileConfig(config_path, *s.engine, &co));
  } else {
    TierSpec host;
    host.kind = "host";
    host.capacity_bytes = host_bytes;
    co.tiers.push_back(host);
    EngineKeys(*s.engine, &co);
  }
  KVTIER_RETURN_IF_ERROR(Attach(&s, co));
  return s;
}

Result<EngineSetup> BuildEngineWithTiers(const EngineOptions& options,
                                         std::vector<TierSpec> tiers) {
  EngineSetup s;
  CacheOptions co;
  co.tiers = std::move(tiers);
  KVTIER_ASSIGN_OR_RETURN(s.engine, Engine::Create(options));
  EngineKeys(*s.engine, &co);
  KVTIER_RETURN_IF_ERROR(Attach(&s, co));
  return s;
}

}  // namespace kvtier::engine
