// `kvtier replay --through cache|daemon|both`: the cache-only replay's requests driven through
// a real KvCache (the in-process Cache, or a `kvtier serve` daemon through a Client), printed
// beside the cache-only replay of the same policy driven the same way (doc/replay.md).
#ifndef KVTIER_TOOLS_REPLAY_THROUGH_H_
#define KVTIER_TOOLS_REPLAY_THROUGH_H_

#include <cstdint>
#include <string>
#include <vector>

#include "kvtier/tier_factory.h"
#include "replay_common.h"
#include "subprocess.h"

namespace kvtier::cli {

struct ThroughArgs {
  std::string through;                // cache, daemon or both
  std::string events = "close";       // none, request, close (EngineEvents)
  std::string socket;                 // a running daemon to use instead of starting one
  std::vector<std::string> policies;  // empty: lru-tail (what the Cache's LRU is) and session
  uint64_t capacity_tokens = 0;
  double capacity_live = 0;
  std::string json_path;
  // > 0: an SSD tier below the in-process Cache's host tier, in mean live contexts, with this
  // admission (its bytes written and hits are reported).
  double disk_live = 0;
  uint32_t disk_min_reuse = 0;
  uint64_t disk_min_prefix_tokens = 0;
  bool disk_count_reuse_after_eviction = true;
  // > 1 (--through cache): the routed replay over this many replicas (replay_route.cc).
  uint32_t replicas = 1;
  std::vector<std::string> routers;  // empty: medium, gpu-only, round-robin, affinity
  double device_live = 0.25;         // each replica's emulated_device tier, in live contexts
};

// Prints the table; returns the process exit code.
int RunThrough(const ThroughArgs& a, const Loaded& loaded);
// The routed replay (a.replicas > 1): prints its table; returns the process exit code.
int RunRouted(const ThroughArgs& a, const Loaded& loaded);

// The SSD tier of --disk-live: a.disk_live x live_tokens, in a fresh folder *dir, with a's
// admission. InvalidArgument for a bad admission; the folder's error.
Result<TierSpec> DiskSpec(const ThroughArgs& a, const KvLayout& l, double live_tokens,
                          TempDir* dir);

}  // namespace kvtier::cli

#endif  // KVTIER_TOOLS_REPLAY_THROUGH_H_
