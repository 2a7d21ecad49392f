// Planner: the load-vs-recompute cost model, calibrated on the machine it runs on.
//
// For a request of N prompt tokens whose first `resident_blocks` are already in the engine's
// pool and whose next blocks are cached in tiers, the planner prices
//   load(bytes, tier)      = latency_s + bytes / bytes_per_s          (one batch per tier)
//   prefill(t, context)    = per_token_s * t + per_token_context_s * (key tokens attended)
// (plus prefill.fixed_s once per request, and load_fixed_s once when anything is loaded: the
// connector's per-request cost) and picks, among "recompute the first r cached blocks and
// load the rest" for every r, the cheapest: r = 0 is kLoad, r = all is kRecompute, anything in
// between is kSplit (recompute the head, load the tail). ChoosePrefix prices the other shape,
// the one a paged engine such as vLLM can run: load the first L blocks of the run, compute the
// rest (kSplit there loads the head). The model is serial: loads and compute
// are priced as if they did not overlap, which is how the reference engine runs them. At
// least the last block of a prompt is always computed (its logits are needed).
//
// A CostProfile is the calibration: tiers' latency and bandwidth and the engine's prefill
// coefficients, saved as JSON by `kvtier calibrate` (format in doc/engine.md).
//
// Thread-safety: a Planner is immutable after construction; Choose() may be called from any
// thread. Every decision is logged at debug level (spdlog) and passed to the decision callback.
#ifndef KVTIER_PLANNER_H_
#define KVTIER_PLANNER_H_

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/status.h"

namespace kvtier {

struct TierCost {
  std::string name;        // matches the Cache tier's name ("host", "disk", ...)
  double latency_s = 0;    // fixed cost of one batched load
  double bytes_per_s = 0;  // sustained load bandwidth, > 0
};

struct PrefillCost {
  double fixed_s = 0;              // per request (hashing, lookup, output head, ...)
  double per_token_s = 0;          // dense layers, per prompt token computed
  double per_token_context_s = 0;  // attention, per (query token x key token) pair
  // > 0: a query attends to at most this many key tokens (sparse / top-k attention such as
  // DeepSeek's DSA); 0 = every earlier token.
  double context_cap_tokens = 0;

  // Key tokens attended by queries at positions [context, context + tokens): the sum over those
  // positions p of min(p, cap) (continuous form: p runs over the interval). Additive over
  // adjacent intervals, so a split prefill costs what the whole one does.
  double Pairs(double tokens, double context) const {
    auto upto = [&](double x) {  // integral of min(p, cap) dp over [0, x]
      if (context_cap_tokens <= 0 || x <= context_cap_tokens) return x * x / 2;
      return context_cap_tokens * context_cap_tokens / 2 +
             (x - context_cap_tokens) * context_cap_tokens;
    };
    return upto(context + tokens) - upto(context);
  }
  // Seconds to compute `tokens` new tokens after `context` tokens of KV (fixed_s excluded).
  double Compute(double tokens, double context) const {
    return per_token_s * tokens + per_token_context_s * Pairs(tokens, context);
  }
};

struct CostProfile {
  std::string machine;  // free text: where it was measured
  std::string model;    // the engine config it was measured with
  int threads = 1;      // BLAS threads during the measurement
  uint32_t block_tokens = 64;
  uint64_t block_bytes = 0;  // bytes of one KV block of `model`
  PrefillCost prefill;
  double load_fixed_s = 0;  // once per request that loads anything (connector setup, sync)
  std::vector<TierCost> tiers;

  // OK, or InvalidArgument naming the field ("tiers[0].bytes_per_s: must be > 0").
  Status Validate() const;
  // Index of the tier named `name`, or -1.
  int FindTier(std::string_view name) const;
};

// JSON <-> profile. Parse errors name `source` (a file name) and the offending key.
Result<CostProfile> ParseCostProfile(std::string_view json, std::string_view source = "profile");
std::string CostProfileToJson(const CostProfile& profile);
Result<CostProfile> LoadCostProfile(const std::string& path);
Status SaveCostProfile(const CostProfile& profile, const std::string& path);

// Least-squares fit of PrefillCost to samples (tokens computed, context before them, seconds),
// weighted by relative error. InvalidArgument with fewer than 3 samples or a singular system.
struct PrefillSample {
  double tokens = 0;
  double context = 0;
  double seconds = 0;
  // >= 0: the key tokens attended, given directly (a step that batched several requests, whose
  // pairs are their sum; context is then ignored); < 0: from tokens and context.
  double pairs = -1;
};
Result<PrefillCost> FitPrefillCost(const std::vector<PrefillSample>& samples);

enum class PlanChoice : uint8_t { kLoad, kRecompute, kSplit };
std::string_view PlanChoiceName(PlanChoice choice);

struct PlanRequest {
  uint32_t prompt_tokens = 0;
  uint32_t resident_blocks = 0;  // leading blocks already in the pool: free
  // block_tier[i]: profile tier index holding block resident_blocks + i (the loadable run).
  std::vector<int> block_tier;
};

struct Plan {
  PlanChoice choice = PlanChoice::kRecompute;
  uint32_t recompute_blocks = 0;  // leading blocks of the loadable run to recompute
  uint32_t load_blocks = 0;       // the rest of the run, loaded
  double predicted_s = 0;         // cost of this plan
  double load_all_s = 0;          // cost of r = 0
  double recompute_all_s = 0;     // cost of recomputing the whole run
  std::string ToString() const;
};

class Planner {
 public:
  using DecisionCallback = std::function<void(const PlanRequest&, const Plan&)>;

  // The profile must be valid (CostProfile::Validate); an invalid one plans kRecompute always.
  explicit Planner(CostProfile profile, DecisionCallback on_decision = nullptr);

  const CostProfile& profile() const { return profile_; }
  // The cheapest plan. A request with no loadable blocks (or an unknown tier index in
  // block_tier, which then ends the run there) is kRecompute with load_blocks = 0.
  Plan Choose(const PlanRequest& request) const;
  // The cheapest "load blocks [0, L) of the run, compute the rest" over L (an engine that can
  // only extend its own prefix by loading). load_blocks = L, recompute_blocks = run - L; kLoad
  // when L is the whole run, kRecompute when L = 0, kSplit between. Within one tier the cost is
  // concave in L, so the optimum sits at a run end or a tier change; every L is priced anyway.
  Plan ChoosePrefix(const PlanRequest& request) const;
  // load(bytes, tier) for `blocks` blocks of tier `tier`; 0 for no blocks. Excludes
  // load_fixed_s, which a request pays once whatever it loads.
  double LoadSeconds(int tier, uint64_t blocks) const;

  // TTFT of one request of `tokens` prompt tokens with nothing cached (RecomputeAllSeconds) or
  // with every loadable block in `tier` (LoadAllSeconds), as Choose prices them.
  double RecomputeAllSeconds(uint64_t tokens) const;
  double LoadAllSeconds(int tier, uint64_t tokens) const;
  // The smallest prompt length (to a token) at which loading every loadable block from `tier`
  // beats recomputing them, found by doubling then bisection; 0 when loading does not win up
  // to max_tokens. `plan crossover` and the vLLM connector report this one figure.
  uint64_t CrossoverTokens(int tier, uint64_t max_tokens = 1u << 22) const;

 private:
  // The loadable run: known tiers only, and never the block holding the last prompt token.
  uint32_t LoadableRun(const PlanRequest& request) const;

  CostProfile profile_;
  bool valid_;
  DecisionCallback on_decision_;
};

}  // namespace kvtier

#endif  // KVTIER_PLANNER_H_
