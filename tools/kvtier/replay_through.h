// `kvtier replay --through cache|daemon|both`: the cache-only replay's requests driven through
// a real KvCache (the in-process Cache, or a `kvtier serve` daemon through a Client), printed
// beside the cache-only replay of the same policy driven the same way (doc/replay.md).
#ifndef KVTIER_TOOLS_REPLAY_THROUGH_H_
#define KVTIER_TOOLS_REPLAY_THROUGH_H_

#include <cstdint>
#include <string>
#include <vector>

#include "replay_common.h"

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
};

// Prints the table; returns the process exit code.
int RunThrough(const ThroughArgs& a, const Loaded& loaded);

}  // namespace kvtier::cli

#endif  // KVTIER_TOOLS_REPLAY_THROUGH_H_
