// The multi-turn driver: N concurrent agentic sessions (a shared system prompt, then turns that
// resend the whole context plus the model's reply and a new user message) run round-robin
// through an Engine, optionally beside a reference engine that recomputes every turn in full
// to check the logits bit for bit and to give the TTFT without reuse.
//
// Thread-safety: none; RunWorkload drives its engines from the calling thread.
#ifndef KVTIER_ENGINE_DRIVER_H_
#define KVTIER_ENGINE_DRIVER_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "kvtier/status.h"

namespace kvtier::engine {

struct WorkloadOptions {
  uint32_t sessions = 3;
  uint32_t turns = 3;
  uint32_t system_tokens = 256;      // shared by every session
  uint32_t first_user_tokens = 192;  // the first turn's own prompt after the system prompt
  uint32_t turn_tokens = 160;        // new user/tool tokens per later turn
  uint32_t decode_tokens = 4;        // greedy reply per turn, resent in the next turn
  uint64_t seed = 7;

  Status Validate() const;
  // Tokens of the longest prompt: a session's last turn.
  uint64_t MaxPromptTokens() const;
};

// Pool blocks an engine of block_tokens needs to run the workload (its longest turn's).
uint64_t WorkloadPoolBlocks(const WorkloadOptions& options, uint32_t block_tokens);

struct TurnRecord {
  uint32_t session = 0;
  uint32_t turn = 0;
  TurnResult reuse;              // the engine under test
  double recompute_ttft_s = -1;  // the reference's full recompute (when checked)
  bool checked = false;
  bool bit_exact = false;
};

struct WorkloadReport {
  std::vector<TurnRecord> turns;
  uint32_t checked_turns = 0;
  uint32_t bit_exact_turns = 0;
  uint64_t prompt_tokens = 0;
  uint64_t pool_hit_tokens = 0;
  std::vector<uint64_t> tier_hit_tokens;  // per cache tier, loaded
  uint64_t computed_tokens = 0;
  uint64_t bytes_loaded = 0;
  uint64_t bytes_stored = 0;
  double speedup_median = 0;  // median over reused turns of recompute TTFT / reuse TTFT
  double wall_s = 0;
  std::string ToJson() const;
};

// Runs the workload on `engine`; with `reference` (an engine with no cache), every turn is
// also recomputed there and compared. on_turn sees each record as it completes.
// InvalidArgument, before any turn, when a pool is smaller than the longest turn needs.
Result<WorkloadReport> RunWorkload(Engine* engine, Engine* reference,
                                   const WorkloadOptions& options,
                                   const std::function<void(const TurnRecord&)>& on_turn = nullptr);

}  // namespace kvtier::engine

#endif  // KVTIER_ENGINE_DRIVER_H_
