// Seeded synthetic agentic workload, generated lazily as a RequestStream: sessions of many turns
// whose context grows every turn over a system prompt shared by all sessions, heavy-tailed think
// times, sub-agents (fresh context over a shared sub-agent prompt) fanned out from parent turns,
// compaction when a context reaches the model's window, and a reuse knob.
//
// Only the live sessions' current contexts are in memory (a few MB for AgentX-sized corpora),
// never the whole corpus. The same options and seed give the same requests on every run and
// every machine (the generator uses its own distributions, not <random>'s).
//
// Thread-safety: none (one stream, one thread). Ownership: the ids span of a request stays valid
// until the next call to Next().
#ifndef KVTIER_WORKLOAD_SYNTHETIC_H_
#define KVTIER_WORKLOAD_SYNTHETIC_H_

#include <cstdint>
#include <memory>

#include "kvtier/status.h"
#include "workload/trace.h"

namespace kvtier::workload {

struct SyntheticOptions {
  uint64_t seed = 1;
  uint64_t requests = 50000;  // in all, sub-agent requests included
  uint32_t block_tokens = 64;
  uint32_t system_tokens = 16800;        // system prompt + tool definitions, shared by all
  uint32_t first_turn_tokens = 24000;    // mean context added by a session's first request
  double growth_median_tokens = 1700;    // per-turn context growth: lognormal, this median
  double growth_sigma = 1.6;             // ... and this log-space spread (mean ~6K)
  uint32_t max_context_tokens = 200000;  // compaction threshold (the model's window)
  uint32_t compact_to_tokens = 70000;    // context after a compaction (over the system prompt)
  double turns_mean = 70;                // parent requests per session (geometric)
  double think_p50_s = 10;               // think time: lognormal with this median ...
  double think_p90_s = 160;              // ... and this 90th percentile
  double output_mean_tokens = 450;
  double subagent_prob = 0.012;  // chance a parent turn spawns a sub-agent
  double subagent_turns_mean = 12;
  uint32_t subagent_system_tokens = 10000;  // shared by all sub-agents
  // Chance a turn extends the previous context; otherwise the context after the system prompt
  // is rebuilt (new content), so 1.0 is AgentX-like reuse and 0 reuses only the system prompt.
  double reuse = 1.0;
  double session_interarrival_s = 0;  // 0: every session starts at time 0, as in AgentX

  // InvalidArgument naming the first bad field.
  Status Validate() const;
};

// InvalidArgument when the options do not validate.
Result<std::unique_ptr<RequestStream>> MakeSyntheticStream(const SyntheticOptions& options);

}  // namespace kvtier::workload

#endif  // KVTIER_WORKLOAD_SYNTHETIC_H_
