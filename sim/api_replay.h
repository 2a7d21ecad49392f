// Replay through the API an engine calls: each request of a trace is a LookupKeys (with its
// session id) and a StoreKeys of the blocks it missed (with its session id) on a real KvCache
// (the in-process Cache, or a daemon's Client), plus the session events an engine knows. The
// hit counting is the cache-only replay's (doc/replay.md), so the figures compare.
//
// Thread-safety: reentrant; the stream and the cache are used by one call at a time.
#ifndef KVTIER_SIM_API_REPLAY_H_
#define KVTIER_SIM_API_REPLAY_H_

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "kvtier/cache.h"
#include "kvtier/kv_cache.h"
#include "sim/cache_replay.h"

namespace kvtier::sim {

struct ApiReplayOptions {
  EngineEvents events = EngineEvents::kClose;
  uint64_t capacity_tokens = 0;  // reported only: the cache's own tier sets the capacity
  // Called after each request (e.g. Cache::Flush, so background writes land in trace order).
  std::function<void()> after_request;
  // Set: each request Loads its hit blocks before its Store, as an engine does, so the cache
  // promotes what it read from a lower tier into its first (promote_on_load).
  bool load_hits = false;
};

// The smallest block there is (one layer, one byte per token), for replays whose figure is
// the hit rate.
KvLayout ReplayLayout(uint32_t block_tokens);
// The library policy a replay policy name stands for in a Cache: "lru" and "lru-tail" are the
// library's "lru" (the Cache touches chains last to first), "lib:NAME" is NAME.
std::string ReplayLibraryPolicy(std::string_view policy);
// A cache of one host tier of `blocks` blocks of layout, evicting by policy (a replay name).
CacheOptions ReplayCacheOptions(const KvLayout& layout, uint64_t blocks, std::string_view policy);

// One request of the replay below on cache, its chain hashed by the caller: LookupKeys with
// the session id, with load_hits a Load of the hit blocks, the pins released, StoreKeys of the
// missed blocks (zeros), then the session event of options.events. Returns the lookup (pins
// released) and adds the blocks stored to *inserted. Errors as ReplayThroughApi.
Result<LookupResult> ReplayRequestThroughApi(KvCache& cache, const workload::ReplayRequest& q,
                                             std::span<const BlockKey> keys,
                                             const ApiReplayOptions& options, uint64_t* inserted);

// Replays the stream (rewound first and after) through cache. Every block's payload is
// zeros of the cache's block size. The cache's layout.block_tokens must equal the trace's.
// InvalidArgument when it does not; a Lookup's or Store's own error (a Store that stored
// nothing because the daemon is gone is Unavailable).
Result<CacheReplayResult> ReplayThroughApi(workload::RequestStream& stream, KvCache& cache,
                                           const ApiReplayOptions& options,
                                           const ProgressFn& progress = {});

}  // namespace kvtier::sim

#endif  // KVTIER_SIM_API_REPLAY_H_
