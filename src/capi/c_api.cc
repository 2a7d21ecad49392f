// The C API over KvCache (c_api.h). Nothing here may throw across the boundary: every entry
// point catches what the C++ side could throw (std::bad_alloc above all) and reports it.
#include "kvtier/c_api.h"

#include <chrono>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "kvtier/async_store.h"
#include "kvtier/cache.h"
#include "kvtier/client.h"
#include "kvtier/config.h"
#include "kvtier/kv_cache.h"
#include "obs/stats_schema.h"
#include "serve/serve_options.h"

struct kvtier_cache {
  std::unique_ptr<kvtier::KvCache> impl;
  // The asynchronous stores' queue, made by the first kvtier_store_async (or
  // kvtier_store_queue_open); declared after impl, so it drains and goes first.
  mutable std::mutex saves_mu;
  std::unique_ptr<kvtier::AsyncStore> saves;

  kvtier::AsyncStore& Saves(const kvtier::AsyncStoreOptions& o = {}) {
    std::lock_guard<std::mutex> l(saves_mu);
    if (!saves) saves = std::make_unique<kvtier::AsyncStore>(*impl, o);
    return *saves;
  }
  kvtier::AsyncStore* SavesIfOpen() const {
    std::lock_guard<std::mutex> l(saves_mu);
    return saves.get();
  }
};

struct kvtier_lookup {
  kvtier::LookupResult result;
};

namespace {

thread_local std::string last_error;
thread_local std::string stat_names;  // kvtier_cache_stat_names' last list

kvtier_code CodeOf(kvtier::StatusCode code) {
  switch (code) {
    case kvtier::StatusCode::kOk:
      return KVTIER_OK;
    case kvtier::StatusCode::kNotFound:
      return KVTIER_NOT_FOUND;
    case kvtier::StatusCode::kInvalidArgument:
      return KVTIER_INVALID_ARGUMENT;
    case kvtier::StatusCode::kUnavailable:
      return KVTIER_UNAVAILABLE;
    case kvtier::StatusCode::kResourceExhausted:
      return KVTIER_RESOURCE_EXHAUSTED;
    case kvtier::StatusCode::kCorruption:
      return KVTIER_CORRUPTION;
    case kvtier::StatusCode::kInternal:
      return KVTIER_INTERNAL;
  }
  return KVTIER_INTERNAL;
}

kvtier_code Fail(kvtier_code code, std::string message) {
  last_error = std::move(message);
  return code;
}

kvtier_code Report(const kvtier::Status& status) {
  if (status.ok()) return KVTIER_OK;
  return Fail(CodeOf(status.code()), status.message());
}

// Runs fn, turning an escaping exception into a code: C callers cannot catch.
template <typename Fn>
kvtier_code Guard(const char* what, Fn&& fn) {
  last_error.clear();
  try {
    return fn();
  } catch (const std::bad_alloc&) {
    return Fail(KVTIER_RESOURCE_EXHAUSTED, std::string(what) + ": out of memory");
  } catch (const std::exception& e) {
    return Fail(KVTIER_INTERNAL, std::string(what) + ": " + e.what());
  } catch (...) {
    return Fail(KVTIER_INTERNAL, std::string(what) + ": unknown exception");
  }
}

// Every stat of the cache by name (obs/stats_schema.h); a daemon's client adds the daemon's own.
// Unavailable when a client cannot reach its daemon.
kvtier::Result<std::vector<std::pair<std::string, uint64_t>>> FlatStatsOf(
    const kvtier_cache* cache) {
  std::vector<std::pair<std::string, uint64_t>> out;
  if (auto* client = dynamic_cast<kvtier::Client*>(cache->impl.get())) {
    kvtier::Result<kvtier::DaemonStatus> d = client->GetDaemonStatus();
    if (!d.ok()) return d.status();
    out = kvtier::FlatStats(d->cache, &*d);
  } else {
    out = kvtier::FlatStats(cache->impl->stats(), nullptr);
  }
  // The store queue's own, in this process (zero until it is opened).
  kvtier::AsyncStoreStats a;
  if (const kvtier::AsyncStore* saves = cache->SavesIfOpen()) a = saves->stats();
  for (const auto& [n, v] : kvtier::AsyncStoreFields(a)) out.emplace_back(n, v);
  return out;
}

kvtier::RequestOptions ToRequest(const kvtier_request* r) {
  kvtier::RequestOptions o;
  if (r == nullptr) return o;
  if (r->tenant != nullptr) o.tenant = r->tenant;
  if (r->lora_id != nullptr) o.lora_id = r->lora_id;
  o.session_id = r->session_id;
  return o;
}

kvtier_store_result ToResult(const kvtier::StoreResult& r) {
  return kvtier_store_result{r.stored_blocks, r.present_blocks, r.failed_blocks};
}

// A store's blocks and engine hashes, checked and converted (kvtier_store, kvtier_store_async).
struct StoreArgs {
  std::vector<kvtier::ConstBlock> spans;
  std::vector<kvtier::EngineBlockHashes> hashes;

  kvtier_code Read(const std::string& what, const kvtier_cache* cache, const uint32_t* tokens,
                   size_t num_tokens, const void* const* blocks, size_t num_blocks,
                   const kvtier_engine_hashes* engine) {
    if (cache == nullptr || (tokens == nullptr && num_tokens > 0) ||
        (blocks == nullptr && num_blocks > 0))
      return Fail(KVTIER_INVALID_ARGUMENT, what + ": cache, tokens or blocks is NULL");
    const size_t bytes = cache->impl->layout().bytes_per_block();
    spans.resize(num_blocks);
    for (size_t i = 0; i < num_blocks; ++i) {
      if (blocks[i] == nullptr)
        return Fail(KVTIER_INVALID_ARGUMENT, what + ": blocks[" + std::to_string(i) + "] is NULL");
      spans[i] = {static_cast<const std::byte*>(blocks[i]), bytes};
    }
    if (engine == nullptr) return KVTIER_OK;
    hashes.resize(num_blocks);
    for (size_t i = 0; i < num_blocks; ++i) {
      const kvtier_engine_hashes& e = engine[i];
      const std::string at = what + ": engine[" + std::to_string(i) + "]";
      if (e.num_hashes == 0) continue;
      if (e.hash_bytes == 0 || e.hash_bytes > 64)
        return Fail(KVTIER_INVALID_ARGUMENT,
                    at + ".hash_bytes " + std::to_string(e.hash_bytes) + " is not 1..64");
      if (e.hashes == nullptr || (e.token_ids == nullptr && e.num_tokens > 0))
        return Fail(KVTIER_INVALID_ARGUMENT, at + ": hashes or token_ids is NULL");
      const char* h = reinterpret_cast<const char*>(e.hashes);
      for (size_t j = 0; j < e.num_hashes; ++j)
        hashes[i].hashes.emplace_back(h + j * e.hash_bytes, e.hash_bytes);
      if (e.parent != nullptr)
        hashes[i].parent_hash.assign(reinterpret_cast<const char*>(e.parent), e.hash_bytes);
      hashes[i].token_ids.assign(e.token_ids, e.token_ids + e.num_tokens);
      if (e.lora_name != nullptr) hashes[i].lora_name = e.lora_name;
    }
    return KVTIER_OK;
  }
};

kvtier_code OpenFrom(kvtier::Result<kvtier::CacheOptions> options, kvtier_cache** out) {
  if (!options.ok()) return Report(options.status());
  auto cache = kvtier::Cache::Open(std::move(options).value());
  if (!cache.ok()) return Report(cache.status());
  *out = new kvtier_cache{std::move(cache).value()};
  return KVTIER_OK;
}

}  // namespace

extern "C" {

const char* kvtier_version(void) { return KVTIER_VERSION; }

int kvtier_api_version(void) { return KVTIER_C_API_VERSION; }

const char* kvtier_code_name(kvtier_code code) {
  switch (code) {
    case KVTIER_OK:
      return "OK";
    case KVTIER_NOT_FOUND:
      return "NotFound";
    case KVTIER_INVALID_ARGUMENT:
      return "InvalidArgument";
    case KVTIER_UNAVAILABLE:
      return "Unavailable";
    case KVTIER_RESOURCE_EXHAUSTED:
      return "ResourceExhausted";
    case KVTIER_CORRUPTION:
      return "Corruption";
    case KVTIER_INTERNAL:
      return "Internal";
  }
  return "Unknown";
}

const char* kvtier_last_error(void) { return last_error.c_str(); }

kvtier_code kvtier_cache_open_yaml(const char* yaml_text, const char* source, kvtier_cache** out) {
  return Guard("kvtier_cache_open_yaml", [&] {
    if (out == nullptr) return Fail(KVTIER_INVALID_ARGUMENT, "kvtier_cache_open_yaml: out is NULL");
    *out = nullptr;
    if (yaml_text == nullptr)
      return Fail(KVTIER_INVALID_ARGUMENT, "kvtier_cache_open_yaml: yaml_text is NULL");
    return OpenFrom(kvtier::serve::CacheOptionsWithEvents(yaml_text, source ? source : "<config>"),
                    out);
  });
}

kvtier_code kvtier_cache_open_file(const char* path, kvtier_cache** out) {
  return Guard("kvtier_cache_open_file", [&] {
    if (out == nullptr) return Fail(KVTIER_INVALID_ARGUMENT, "kvtier_cache_open_file: out is NULL");
    *out = nullptr;
    if (path == nullptr)
      return Fail(KVTIER_INVALID_ARGUMENT, "kvtier_cache_open_file: path is NULL");
    return OpenFrom(kvtier::serve::CacheOptionsWithEventsFile(path), out);
  });
}

kvtier_code kvtier_client_open(const kvtier_client_options* options, kvtier_cache** out) {
  return Guard("kvtier_client_open", [&] {
    if (out == nullptr) return Fail(KVTIER_INVALID_ARGUMENT, "kvtier_client_open: out is NULL");
    *out = nullptr;
    if (options == nullptr)
      return Fail(KVTIER_INVALID_ARGUMENT, "kvtier_client_open: options is NULL");
    kvtier::ClientOptions o;
    if (options->socket_path != nullptr) o.socket_path = options->socket_path;
    o.layout.num_layers = options->num_layers;
    o.layout.num_kv_heads = options->num_kv_heads;
    o.layout.head_dim = options->head_dim;
    o.layout.block_tokens = options->block_tokens ? options->block_tokens : 64;
    if (options->dtype != nullptr) {
      auto d = kvtier::ParseDType(options->dtype);
      if (!d)
        return Fail(KVTIER_INVALID_ARGUMENT,
                    std::string("kvtier_client_open: dtype '") + options->dtype + "' is unknown");
      o.layout.dtype = *d;
    }
    if (options->attention != nullptr) {
      auto a = kvtier::ParseAttentionKind(options->attention);
      if (!a)
        return Fail(KVTIER_INVALID_ARGUMENT, std::string("kvtier_client_open: attention '") +
                                                 options->attention + "' is unknown");
      o.layout.attention = *a;
    }
    if (options->layout_yaml != nullptr) {
      auto l = kvtier::ParseLayoutYaml(options->layout_yaml, "layout_yaml");
      if (!l.ok())
        return Fail(KVTIER_INVALID_ARGUMENT,
                    "kvtier_client_open: " + std::string(l.status().message()));
      o.layout = *std::move(l);
    }
    if (options->model_id != nullptr) o.model_id = options->model_id;
    if (options->model_revision != nullptr) o.model_revision = options->model_revision;
    if (options->tenant != nullptr) o.tenant = options->tenant;
    if (options->lora_id != nullptr) o.lora_id = options->lora_id;
    if (options->token != nullptr) o.token = options->token;
    if (options->timeout_ms != 0) o.timeout_ms = options->timeout_ms;
    auto client = kvtier::Client::Open(std::move(o));
    if (!client.ok()) return Report(client.status());
    *out = new kvtier_cache{std::move(client).value()};
    return KVTIER_OK;
  });
}

void kvtier_cache_close(kvtier_cache* cache) { delete cache; }

uint64_t kvtier_cache_block_bytes(const kvtier_cache* cache) {
  return cache ? cache->impl->layout().bytes_per_block() : 0;
}

uint32_t kvtier_cache_block_tokens(const kvtier_cache* cache) {
  return cache ? cache->impl->layout().block_tokens : 0;
}

uint32_t kvtier_cache_state_blocks(const kvtier_cache* cache) {
  return cache ? cache->impl->layout().state_blocks() : 0;
}

namespace {
// Keys of blocks 0..block of tokens (with_chain) or none, then block's state keys.
kvtier_code StateRecordKeys(const char* what, kvtier_cache* cache, const uint32_t* tokens,
                            size_t num_tokens, uint32_t block, const kvtier_request* request,
                            bool with_chain, std::vector<kvtier::BlockKey>* keys) {
  if (cache == nullptr || (tokens == nullptr && num_tokens > 0))
    return Fail(KVTIER_INVALID_ARGUMENT, std::string(what) + ": cache or tokens is NULL");
  const uint32_t m = cache->impl->layout().state_blocks();
  if (m == 0)
    return Fail(KVTIER_INVALID_ARGUMENT, std::string(what) + ": the layout has no state group (" +
                                             cache->impl->layout().ToString() + ")");
  const uint32_t first = with_chain ? 0 : block;
  auto chain = cache->impl->KeysOf(std::span<const uint32_t>(tokens, num_tokens), first,
                                   size_t{block} - first + 1, ToRequest(request));
  if (!chain.ok()) return Report(chain.status());
  *keys = std::move(chain).value();
  const std::vector<kvtier::BlockKey> state = kvtier::StateKeys(keys->back(), m);
  if (!with_chain) keys->clear();
  keys->insert(keys->end(), state.begin(), state.end());
  return KVTIER_OK;
}
}  // namespace

kvtier_code kvtier_lookup_state(kvtier_cache* cache, const uint32_t* tokens, size_t num_tokens,
                                uint32_t block, const kvtier_request* request,
                                kvtier_lookup** out) {
  return Guard("kvtier_lookup_state", [&] {
    if (out == nullptr) return Fail(KVTIER_INVALID_ARGUMENT, "kvtier_lookup_state: out is NULL");
    *out = nullptr;
    std::vector<kvtier::BlockKey> keys;
    if (kvtier_code c = StateRecordKeys("kvtier_lookup_state", cache, tokens, num_tokens, block,
                                        request, true, &keys);
        c != KVTIER_OK)
      return c;
    auto r = cache->impl->LookupKeys(keys, ToRequest(request));
    if (!r.ok()) return Report(r.status());
    *out = new kvtier_lookup{std::move(r).value()};
    return KVTIER_OK;
  });
}

kvtier_code kvtier_store_state(kvtier_cache* cache, const uint32_t* tokens, size_t num_tokens,
                               uint32_t block, const void* const* record,
                               const kvtier_request* request, kvtier_store_result* result) {
  return Guard("kvtier_store_state", [&] {
    if (result != nullptr) *result = kvtier_store_result{};
    std::vector<kvtier::BlockKey> keys;
    if (kvtier_code c = StateRecordKeys("kvtier_store_state", cache, tokens, num_tokens, block,
                                        request, false, &keys);
        c != KVTIER_OK)
      return c;
    StoreArgs a;
    if (kvtier_code c =
            a.Read("kvtier_store_state", cache, tokens, num_tokens, record, keys.size(), nullptr);
        c != KVTIER_OK)
      return c;
    auto r = cache->impl->StoreKeys(keys, a.spans, block, ToRequest(request));
    if (!r.ok()) return Report(r.status());
    if (result != nullptr) *result = ToResult(*r);
    return KVTIER_OK;
  });
}

kvtier_code kvtier_lookup_tokens(kvtier_cache* cache, const uint32_t* tokens, size_t num_tokens,
                                 const kvtier_request* request, kvtier_lookup** out) {
  return Guard("kvtier_lookup_tokens", [&] {
    if (out == nullptr) return Fail(KVTIER_INVALID_ARGUMENT, "kvtier_lookup_tokens: out is NULL");
    *out = nullptr;
    if (cache == nullptr || (tokens == nullptr && num_tokens > 0))
      return Fail(KVTIER_INVALID_ARGUMENT, "kvtier_lookup_tokens: cache or tokens is NULL");
    auto r = cache->impl->Lookup(std::span<const uint32_t>(tokens, num_tokens), ToRequest(request));
    if (!r.ok()) return Report(r.status());
    *out = new kvtier_lookup{std::move(r).value()};
    return KVTIER_OK;
  });
}

void kvtier_lookup_free(kvtier_lookup* lookup) { delete lookup; }

uint32_t kvtier_lookup_num_blocks(const kvtier_lookup* lookup) {
  return lookup ? static_cast<uint32_t>(lookup->result.keys.size()) : 0;
}

uint32_t kvtier_lookup_hit_blocks(const kvtier_lookup* lookup) {
  return lookup ? lookup->result.hit_blocks : 0;
}

kvtier_code kvtier_load(kvtier_cache* cache, const kvtier_lookup* lookup, void* const* dst,
                        size_t num_blocks, uint32_t* loaded_blocks) {
  return kvtier_load_range(cache, lookup, 0, dst, num_blocks, loaded_blocks);
}

namespace {

// bufs[0..n) as block spans of the cache's block size; INVALID_ARGUMENT (naming `what`) for a
// NULL one.
kvtier_code BlockSpans(const kvtier_cache* cache, void* const* bufs, size_t n, const char* what,
                       std::vector<kvtier::MutableBlock>* out) {
  const size_t bytes = cache->impl->layout().bytes_per_block();
  out->resize(n);
  for (size_t i = 0; i < n; ++i) {
    if (bufs[i] == nullptr)
      return Fail(KVTIER_INVALID_ARGUMENT,
                  std::string(what) + "[" + std::to_string(i) + "] is NULL");
    (*out)[i] = {static_cast<std::byte*>(bufs[i]), bytes};
  }
  return KVTIER_OK;
}

}  // namespace

kvtier_code kvtier_load_range(kvtier_cache* cache, const kvtier_lookup* lookup, uint32_t first,
                              void* const* dst, size_t num_blocks, uint32_t* loaded_blocks) {
  return Guard("kvtier_load", [&] {
    if (loaded_blocks != nullptr) *loaded_blocks = 0;
    if (cache == nullptr || lookup == nullptr || (dst == nullptr && num_blocks > 0))
      return Fail(KVTIER_INVALID_ARGUMENT, "kvtier_load: cache, lookup or dst is NULL");
    std::vector<kvtier::MutableBlock> spans;
    if (kvtier_code c = BlockSpans(cache, dst, num_blocks, "kvtier_load: dst", &spans)) return c;
    auto r = cache->impl->Load(lookup->result, first, spans);
    if (!r.ok()) return Report(r.status());
    if (loaded_blocks != nullptr) *loaded_blocks = r->loaded_blocks;
    return KVTIER_OK;
  });
}

kvtier_code kvtier_load_visit(kvtier_cache* cache, const kvtier_lookup* lookup, uint32_t first,
                              size_t num_blocks, void* const* scratch, size_t num_scratch,
                              kvtier_block_visitor visit, void* user, uint32_t* loaded_blocks) {
  return Guard("kvtier_load_visit", [&] {
    if (loaded_blocks != nullptr) *loaded_blocks = 0;
    if (cache == nullptr || lookup == nullptr || visit == nullptr ||
        (scratch == nullptr && num_scratch > 0))
      return Fail(KVTIER_INVALID_ARGUMENT,
                  "kvtier_load_visit: cache, lookup, visit or scratch is NULL");
    if (num_blocks > UINT32_MAX)
      return Fail(KVTIER_INVALID_ARGUMENT, "kvtier_load_visit: num_blocks past 2^32");
    std::vector<kvtier::MutableBlock> spans;
    if (kvtier_code c =
            BlockSpans(cache, scratch, num_scratch, "kvtier_load_visit: scratch", &spans))
      return c;
    auto r = cache->impl->LoadVisit(
        lookup->result, first, static_cast<uint32_t>(num_blocks), spans,
        [&](uint32_t i, kvtier::ConstBlock b) { visit(user, i, b.data(), b.size()); });
    if (!r.ok()) return Report(r.status());
    if (loaded_blocks != nullptr) *loaded_blocks = r->loaded_blocks;
    return KVTIER_OK;
  });
}

kvtier_code kvtier_store(kvtier_cache* cache, const uint32_t* tokens, size_t num_tokens,
                         const void* const* blocks, size_t num_blocks, uint32_t first_block,
                         const kvtier_request* request, kvtier_store_result* result) {
  return kvtier_store_with_hashes(cache, tokens, num_tokens, blocks, num_blocks, first_block,
                                  request, nullptr, result);
}

kvtier_code kvtier_store_with_hashes(kvtier_cache* cache, const uint32_t* tokens, size_t num_tokens,
                                     const void* const* blocks, size_t num_blocks,
                                     uint32_t first_block, const kvtier_request* request,
                                     const kvtier_engine_hashes* engine,
                                     kvtier_store_result* result) {
  return Guard("kvtier_store", [&] {
    if (result != nullptr) *result = kvtier_store_result{};
    StoreArgs a;
    if (kvtier_code c =
            a.Read("kvtier_store", cache, tokens, num_tokens, blocks, num_blocks, engine);
        c != KVTIER_OK)
      return c;
    kvtier::RequestOptions rq = ToRequest(request);
    rq.engine_hashes = a.hashes;
    auto r =
        cache->impl->Store(std::span<const uint32_t>(tokens, num_tokens), a.spans, first_block, rq);
    if (!r.ok()) return Report(r.status());
    if (result != nullptr) *result = ToResult(*r);
    return KVTIER_OK;
  });
}

kvtier_code kvtier_store_queue_open(kvtier_cache* cache,
                                    const kvtier_store_queue_options* options) {
  return Guard("kvtier_store_queue_open", [&] {
    if (cache == nullptr || options == nullptr)
      return Fail(KVTIER_INVALID_ARGUMENT, "kvtier_store_queue_open: cache or options is NULL");
    kvtier::AsyncStoreOptions o;
    if (options->max_batches != 0) o.max_batches = options->max_batches;
    switch (options->priority) {
      case KVTIER_PRIORITY_IDLE:
        o.priority = kvtier::AsyncStoreOptions::Priority::kIdle;
        break;
      case KVTIER_PRIORITY_NICE:
        if (options->nice < -20 || options->nice > 19)
          return Fail(
              KVTIER_INVALID_ARGUMENT,
              "kvtier_store_queue_open: nice " + std::to_string(options->nice) + " is not -20..19");
        o.priority = kvtier::AsyncStoreOptions::Priority::kNice;
        o.nice = options->nice;
        break;
      case KVTIER_PRIORITY_INHERIT:
        o.priority = kvtier::AsyncStoreOptions::Priority::kInherit;
        break;
      default:
        return Fail(KVTIER_INVALID_ARGUMENT, "kvtier_store_queue_open: unknown priority " +
                                                 std::to_string(options->priority));
    }
    if (cache->SavesIfOpen() != nullptr)
      return Fail(KVTIER_INVALID_ARGUMENT,
                  "kvtier_store_queue_open: the queue is open already (opened by an earlier "
                  "kvtier_store_queue_open or kvtier_store_async)");
    cache->Saves(o);
    return KVTIER_OK;
  });
}

kvtier_code kvtier_store_async(kvtier_cache* cache, const uint32_t* tokens, size_t num_tokens,
                               const void* const* blocks, size_t num_blocks, uint32_t first_block,
                               const kvtier_request* request, const kvtier_engine_hashes* engine,
                               kvtier_store_done done, void* user) {
  return Guard("kvtier_store_async", [&] {
    StoreArgs a;
    if (kvtier_code c =
            a.Read("kvtier_store_async", cache, tokens, num_tokens, blocks, num_blocks, engine);
        c != KVTIER_OK)
      return c;
    kvtier::RequestOptions rq = ToRequest(request);
    auto keys = cache->impl->KeysOf(std::span<const uint32_t>(tokens, num_tokens), first_block,
                                    num_blocks, rq);
    if (!keys.ok()) return Report(keys.status());
    std::vector<kvtier::StoreJob> batch(1);
    kvtier::StoreJob& job = batch[0];
    job.keys = *std::move(keys);
    job.blocks = std::move(a.spans);
    job.first_block = first_block;
    job.tenant = rq.tenant;
    job.lora_id = rq.lora_id;
    job.session_id = rq.session_id;
    job.engine_hashes = std::move(a.hashes);
    const bool queued = cache->Saves().Submit(std::move(batch), [done, user](auto& results) {
      if (done == nullptr) return;
      const auto& r = results[0];
      if (r.ok()) {
        const kvtier_store_result out = ToResult(*r);
        done(user, KVTIER_OK, &out);
      } else {
        const kvtier_store_result none{};
        done(user, CodeOf(r.status().code()), &none);
      }
    });
    if (!queued)
      return Fail(KVTIER_RESOURCE_EXHAUSTED,
                  "kvtier_store_async: the store queue is full (the tiers fall behind); the "
                  "blocks were not stored (counted as async.dropped_blocks)");
    return KVTIER_OK;
  });
}

kvtier_code kvtier_store_wait(kvtier_cache* cache, const uint32_t* tokens, size_t num_tokens,
                              const kvtier_request* request, uint32_t timeout_ms) {
  return Guard("kvtier_store_wait", [&] {
    if (cache == nullptr || (tokens == nullptr && num_tokens > 0))
      return Fail(KVTIER_INVALID_ARGUMENT, "kvtier_store_wait: cache or tokens is NULL");
    kvtier::AsyncStore* saves = cache->SavesIfOpen();
    if (saves == nullptr) return KVTIER_OK;
    const uint32_t bt = cache->impl->layout().block_tokens;
    auto keys = cache->impl->KeysOf(std::span<const uint32_t>(tokens, num_tokens), 0,
                                    bt ? num_tokens / bt : 0, ToRequest(request));
    if (!keys.ok()) return Report(keys.status());
    if (!saves->WaitFor(*keys, std::chrono::milliseconds(timeout_ms)))
      return Fail(KVTIER_UNAVAILABLE,
                  "kvtier_store_wait: stores of these blocks still running "
                  "after " +
                      std::to_string(timeout_ms) + " ms");
    return KVTIER_OK;
  });
}

kvtier_code kvtier_store_wait_idle(kvtier_cache* cache, uint32_t timeout_ms) {
  return Guard("kvtier_store_wait_idle", [&] {
    if (cache == nullptr) return Fail(KVTIER_INVALID_ARGUMENT, "kvtier_store_wait_idle: NULL");
    kvtier::AsyncStore* saves = cache->SavesIfOpen();
    if (saves != nullptr && !saves->WaitIdle(std::chrono::milliseconds(timeout_ms)))
      return Fail(KVTIER_UNAVAILABLE, "kvtier_store_wait_idle: stores still running after " +
                                          std::to_string(timeout_ms) + " ms");
    return KVTIER_OK;
  });
}

int kvtier_cache_wants_engine_hashes(const kvtier_cache* cache) {
  return cache != nullptr && cache->impl->WantsEngineHashes() ? 1 : 0;
}

kvtier_code kvtier_session_notify(kvtier_cache* cache, uint64_t session_id,
                                  kvtier_session_event event) {
  return Guard("kvtier_session_notify", [&] {
    if (cache == nullptr)
      return Fail(KVTIER_INVALID_ARGUMENT, "kvtier_session_notify: cache is NULL");
    if (session_id == 0)
      return Fail(KVTIER_INVALID_ARGUMENT, "kvtier_session_notify: session 0 means no session");
    if (event < KVTIER_SESSION_THINKING || event > KVTIER_SESSION_RESET)
      return Fail(KVTIER_INVALID_ARGUMENT, "kvtier_session_notify: unknown event " +
                                               std::to_string(static_cast<int>(event)));
    cache->impl->NotifySession(session_id, static_cast<kvtier::SessionEvent>(event));
    return KVTIER_OK;
  });
}

kvtier_code kvtier_cache_note_declined(kvtier_cache* cache, const uint32_t* blocks_by_tier,
                                       size_t n) {
  return Guard("kvtier_cache_note_declined", [&] {
    if (cache == nullptr || (blocks_by_tier == nullptr && n > 0))
      return Fail(KVTIER_INVALID_ARGUMENT,
                  "kvtier_cache_note_declined: cache or blocks_by_tier is NULL");
    cache->impl->NoteDeclined(std::span<const uint32_t>(blocks_by_tier, n));
    return KVTIER_OK;
  });
}

kvtier_code kvtier_cache_stats(const kvtier_cache* cache, kvtier_stats* out) {
  return Guard("kvtier_cache_stats", [&] {
    if (cache == nullptr || out == nullptr)
      return Fail(KVTIER_INVALID_ARGUMENT, "kvtier_cache_stats: cache or out is NULL");
    kvtier::CacheStats s = cache->impl->stats();
    *out = kvtier_stats{s.lookups, s.lookup_blocks, s.hit_blocks, s.loads, s.load_failed_blocks,
                        s.stores,  s.stored_blocks};
    return KVTIER_OK;
  });
}

kvtier_code kvtier_cache_stat(const kvtier_cache* cache, const char* name, uint64_t* value) {
  return Guard("kvtier_cache_stat", [&] {
    if (cache == nullptr || name == nullptr || value == nullptr)
      return Fail(KVTIER_INVALID_ARGUMENT, "kvtier_cache_stat: cache, name or value is NULL");
    auto stats = FlatStatsOf(cache);
    if (!stats.ok()) return Report(stats.status());
    for (const auto& [n, v] : *stats) {
      if (n != name) continue;
      *value = v;
      return KVTIER_OK;
    }
    return Fail(KVTIER_NOT_FOUND, std::string("kvtier_cache_stat: no stat named '") + name +
                                      "' (kvtier_cache_stat_names lists them)");
  });
}

kvtier_code kvtier_cache_stat_names(const kvtier_cache* cache, const char** names) {
  return Guard("kvtier_cache_stat_names", [&] {
    if (cache == nullptr || names == nullptr)
      return Fail(KVTIER_INVALID_ARGUMENT, "kvtier_cache_stat_names: cache or names is NULL");
    auto stats = FlatStatsOf(cache);
    if (!stats.ok()) return Report(stats.status());
    stat_names.clear();
    for (const auto& [n, v] : *stats) stat_names += (stat_names.empty() ? "" : "\n") + n;
    *names = stat_names.c_str();
    return KVTIER_OK;
  });
}

}  // extern "C"
