// The load-vs-recompute decision (see include/kvtier/planner.h).
#include "kvtier/planner.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <utility>

namespace kvtier {

std::string_view PlanChoiceName(PlanChoice choice) {
  switch (choice) {
    case PlanChoice::kLoad:
      return "load";
    case PlanChoice::kRecompute:
      return "recompute";
    case PlanChoice::kSplit:
      return "split";
  }
  return "?";
}

std::string Plan::ToString() const {
  char buf[192];
  std::snprintf(buf, sizeof(buf),
                "%s: recompute %u + load %u blocks, predicted %.3f ms (load all %.3f ms, "
                "recompute all %.3f ms)",
                std::string(PlanChoiceName(choice)).c_str(), recompute_blocks, load_blocks,
                predicted_s * 1e3, load_all_s * 1e3, recompute_all_s * 1e3);
  return buf;
}

Planner::Planner(CostProfile profile, DecisionCallback on_decision)
    : profile_(std::move(profile)),
      valid_(profile_.Validate().ok()),
      on_decision_(std::move(on_decision)) {}

double Planner::LoadSeconds(int tier, uint64_t blocks) const {
  if (blocks == 0 || tier < 0 || tier >= static_cast<int>(profile_.tiers.size())) return 0;
  const TierCost& t = profile_.tiers[tier];
  return t.latency_s + static_cast<double>(blocks * profile_.block_bytes) / t.bytes_per_s;
}

Plan Planner::Choose(const PlanRequest& req) const {
  Plan plan;
  const double bt = valid_ ? profile_.block_tokens : 1;
  const uint32_t resident = req.resident_blocks;
  const double n = req.prompt_tokens;
  const double fixed = valid_ ? profile_.prefill.fixed_s : 0;
  const PrefillCost& pc = profile_.prefill;

  // The loadable run: known tiers only, and never the block holding the last prompt token.
  uint32_t run = 0;
  const uint32_t max_blocks =
      req.prompt_tokens == 0 || !valid_
          ? 0
          : (req.prompt_tokens - 1) / static_cast<uint32_t>(profile_.block_tokens);
  while (run < req.block_tier.size() && resident + run < max_blocks && req.block_tier[run] >= 0 &&
         req.block_tier[run] < static_cast<int>(profile_.tiers.size())) {
    ++run;
  }
  const double ctx0 = resident * bt;
  plan.recompute_all_s = fixed + pc.Compute(std::max(0.0, n - ctx0), ctx0);
  plan.choice = PlanChoice::kRecompute;
  plan.recompute_blocks = run;
  plan.load_blocks = 0;
  plan.predicted_s = plan.recompute_all_s;
  plan.load_all_s = plan.recompute_all_s;
  if (run > 0) {
    const double end = (resident + run) * bt;
    const double tail = fixed + pc.Compute(n - end, end);
    std::vector<uint64_t> count(profile_.tiers.size(), 0);
    // cost[r] for r = run .. 0: blocks [r, run) are loaded.
    double best = plan.recompute_all_s;
    uint32_t best_r = run;
    for (uint32_t r = run; r-- > 0;) {
      ++count[req.block_tier[r]];
      double load = profile_.load_fixed_s;
      for (size_t t = 0; t < count.size(); ++t) load += LoadSeconds(static_cast<int>(t), count[t]);
      const double cost = pc.Compute(r * bt, ctx0) + load + tail;
      if (r == 0) plan.load_all_s = cost;
      if (cost <= best) {  // ties go to loading more
        best = cost;
        best_r = r;
      }
    }
    plan.recompute_blocks = best_r;
    plan.load_blocks = run - best_r;
    plan.predicted_s = best;
    plan.choice = best_r == 0     ? PlanChoice::kLoad
                  : best_r == run ? PlanChoice::kRecompute
                                  : PlanChoice::kSplit;
    if (plan.choice == PlanChoice::kRecompute) plan.load_blocks = 0;
  }
  spdlog::debug("planner: {} tokens, {} resident, {} loadable blocks -> {}", req.prompt_tokens,
                resident, run, plan.ToString());
  if (on_decision_) on_decision_(req, plan);
  return plan;
}

}  // namespace kvtier
