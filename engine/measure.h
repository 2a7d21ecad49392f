// Measurements on a live Engine + Cache: calibration of the planner's cost profile, and the
// load-vs-recompute crossover sweep that checks the planner against what really happened.
//
// Every figure comes from real runs in this process: TTFT of a full recompute, TTFT of the
// same prompt served from a tier (cold pool, so the tier really serves it), and the bits of
// both logits compared.
//
// Thread-safety: none; these drive the engine from the calling thread.
#ifndef KVTIER_ENGINE_MEASURE_H_
#define KVTIER_ENGINE_MEASURE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "kvtier/cache.h"
#include "kvtier/planner.h"

namespace kvtier::engine {

// done/total progress of a long measurement.
using ProgressFn = std::function<void(double done, double total)>;

// Deterministic pseudo-random prompt of n tokens (salt separates prompts).
std::vector<TokenId> SyntheticTokens(uint32_t n, uint32_t vocab, uint64_t salt);

struct TierSample {
  std::string tier;
  uint32_t blocks = 0;
  uint64_t bytes = 0;
  double seconds = 0;  // median Lookup + Load
};

struct CalibrationOptions {
  std::vector<uint32_t> prompt_lengths = {64, 256, 1024};  // full prefills
  uint32_t context_tokens = 1024;   // plus one block computed after this much loaded context
  uint32_t tier_batch_blocks = 32;  // bandwidth from a batch this large vs one block
  int reps = 3;
  std::string machine;
};

struct Calibration {
  CostProfile profile;
  std::vector<PrefillSample> prefill;
  std::vector<TierSample> tiers;
  double memcpy_bytes_per_s = 0;  // same-run baseline: streaming memcpy of a tier batch
};

// Pool blocks Calibrate needs on an engine of block_tokens: its longest prefill's, or the tier
// batch when larger.
uint64_t CalibrationPoolBlocks(const CalibrationOptions& options, uint32_t block_tokens);

// Measures the engine's prefill time against prompt length and context, and Lookup + Load
// latency and bandwidth of every tier of the cache (attached to the engine), and fits the
// profile. InvalidArgument, before measuring, when the pool is smaller than
// CalibrationPoolBlocks.
Result<Calibration> Calibrate(Engine* engine, const CalibrationOptions& options,
                              const ProgressFn& progress = nullptr);

struct CrossoverPoint {
  uint32_t tokens = 0;
  double load_s = 0;       // TTFT with the prefix loaded from the tier
  double recompute_s = 0;  // TTFT of a full recompute
  double split_s = -1;     // measured only when the planner chose a split
  Plan plan;
  double chosen_s = 0;  // the measured TTFT of the planner's choice
  uint32_t loaded_blocks = 0;
  bool bit_exact = false;  // load-path logits == recompute logits (memcmp)
};

struct CrossoverResult {
  std::vector<CrossoverPoint> points;
  double regret_pct = 0;  // 100 * (sum chosen - sum min) / sum min
  double sweep_s = 0;
  std::string ToJson() const;
};

// Pool blocks RunCrossover needs for these lengths on an engine of block_tokens.
uint64_t CrossoverPoolBlocks(const std::vector<uint32_t>& lengths, uint32_t block_tokens);

// For each length: a full recompute (which stores its blocks), then a cold-pool turn that
// loads the prefix from the cache's tiers; medians over reps (1 for lengths above 2048).
// InvalidArgument, before measuring, when the pool is smaller than CrossoverPoolBlocks.
Result<CrossoverResult> RunCrossover(Engine* engine, const Planner& planner,
                                     const std::vector<uint32_t>& lengths, int reps,
                                     const ProgressFn& progress = nullptr);

// A resumed turn: a cached prefix of prefix_tokens plus new_tokens computed, its prefix loaded
// from the cache's tier (a cold pool) one way or the other, in one run.
struct ResumePoint {
  uint32_t prefix_tokens = 0;
  uint32_t new_tokens = 0;
  uint32_t loaded_blocks = 0;
  uint64_t loaded_bytes = 0;
  double load_only_s = 0;       // Lookup + Load of the prefix alone (median)
  double compute_only_s = 0;    // the new tokens' compute with the prefix in place (median)
  double sync_s = 0;            // TTFT: load, then compute (median)
  double layerwise_s = 0;       // TTFT: layer l + 1 loads while layer l computes (median)
  double layerwise_wait_s = 0;  // of which the compute waited for the load (median)
  double recompute_s = -1;      // TTFT of a full recompute (prompts up to verify_tokens)
  bool bit_exact = false;       // layer-wise logits == synchronous (== recompute when run)
};

struct ResumeResult {
  std::string tier;
  std::vector<ResumePoint> points;
  double sweep_s = 0;
  std::string ToJson() const;
};

struct ResumeOptions {
  std::vector<uint32_t> prefix_tokens = {4096, 16384};
  uint32_t new_tokens = 1024;
  int reps = 3;
  uint32_t verify_tokens = 8192;  // a full recompute checks prompts up to this long
};

// Pool blocks RunResume needs on an engine of block_tokens.
uint64_t ResumePoolBlocks(const ResumeOptions& options, uint32_t block_tokens);

// For each prefix: one turn computes and stores it (then the cache is flushed, so the tier
// holds it); then, reps times over a cold pool, the prefix alone loaded, a synchronous turn
// and a layer-wise turn of prefix + new tokens (neither stores). Every load comes from the
// attached cache's tiers (give it one tier to measure that tier). InvalidArgument, before
// measuring, when the pool is too small or a prefix is not a whole number of blocks.
Result<ResumeResult> RunResume(Engine* engine, const ResumeOptions& options,
                               const ProgressFn& progress = nullptr);

// Median of v (the mean of the middle two for an even count); 0 when empty.
double Median(std::vector<double> v);
// Whether two logit vectors are equal bit for bit (memcmp).
bool SameBits(const std::vector<float>& a, const std::vector<float>& b);

}  // namespace kvtier::engine

#endif  // KVTIER_ENGINE_MEASURE_H_
