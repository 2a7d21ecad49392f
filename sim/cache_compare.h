// Policies compared in one cache-only run, beside the bounds: the infinite-cache ideal and
// Belady's MIN at the same capacity. Capacity is given in tokens or as a multiple of the live
// context of the active sessions (WorkloadStats::live_context_mean_tokens; see doc/replay.md).
//
// Thread-safety: reentrant.
#ifndef KVTIER_SIM_CACHE_COMPARE_H_
#define KVTIER_SIM_CACHE_COMPARE_H_

#include <optional>
#include <string>
#include <vector>

#include "sim/cache_replay.h"
#include "workload/trace.h"

namespace kvtier::sim {

// Policies a comparison runs by default.
std::vector<std::string> DefaultComparePolicies();

struct CacheCompareOptions {
  std::vector<std::string> policies = DefaultComparePolicies();
  uint64_t capacity_tokens = 0;  // used when capacity_live is 0
  double capacity_live = 0;      // > 0: capacity = this x the mean live context
  bool with_min = true;
  uint64_t min_max_blocks = 100'000'000;  // MIN materializes the trace: skip it beyond this
  TouchOrder touch = TouchOrder::kTailFirst;
  bool measure_baseline = false;  // also time the stream alone and stream + hashing

  Status Validate() const;
};

struct CacheCompareResult {
  workload::WorkloadStats stats;
  uint64_t capacity_tokens = 0;
  CacheReplayResult ideal;
  std::optional<CacheReplayResult> min;
  std::string min_skipped;  // why MIN did not run
  std::vector<CacheReplayResult> policies;
  // Better of lru and lru-tail (the baseline every other policy is compared with); -1 if absent.
  double best_lru_hit_rate = -1;
  std::string best_lru;
  std::optional<StreamCost> baseline;
};

Result<CacheCompareResult> CompareCacheOnly(workload::RequestStream& stream,
                                            const CacheCompareOptions& options,
                                            const ProgressFn& progress = {});

}  // namespace kvtier::sim

#endif  // KVTIER_SIM_CACHE_COMPARE_H_
