// Per-conversation statistics of a trace corpus, in the style of kv-cache-tester's trace table:
// how much of each request's prompt repeats the previous request of the same session, with no
// cache model at all (doc/replay.md, "Trace statistics").
//
// A conversation is one trace file: a top-level session and its sub-agents. Within a session,
// request i's overlap = the leading block ids it shares with request i-1, in tokens (capped at
// its prompt); a session's first request overlaps nothing. The conversation's hit rate = its
// summed overlap / its summed prompt tokens. The corpus is summarised by min, P25, median, P75
// and mean over conversations (percentiles interpolated linearly).
//
// Thread-safety: a function of values; reentrant.
#ifndef KVTIER_SIM_TRACE_STATS_H_
#define KVTIER_SIM_TRACE_STATS_H_

#include <span>
#include <string>
#include <vector>

#include "workload/trace.h"

namespace kvtier::sim {

struct ConversationStats {
  std::string name;
  uint64_t requests = 0;
  uint64_t prompt_tokens = 0;
  uint64_t overlap_tokens = 0;
  double hit_rate() const {
    return prompt_tokens ? static_cast<double>(overlap_tokens) / static_cast<double>(prompt_tokens)
                         : 0;
  }
};

struct TraceStatsSummary {
  std::vector<ConversationStats> conversations;
  double min = 0, p25 = 0, median = 0, p75 = 0, mean = 0;  // of per-conversation hit rates
};

TraceStatsSummary ComputeTraceStats(std::span<const workload::Trace> traces);

}  // namespace kvtier::sim

#endif  // KVTIER_SIM_TRACE_STATS_H_
