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

  const uint32_t run = LoadableRun(req);
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

Plan Planner::ChoosePrefix(const PlanRequest& req) const {
  Plan plan;
  const double bt = valid_ ? profile_.block_tokens : 1;
  const double n = req.prompt_tokens;
  const double fixed = valid_ ? profile_.prefill.fixed_s : 0;
  const PrefillCost& pc = profile_.prefill;
  const uint32_t run = LoadableRun(req);
  const double ctx0 = req.resident_blocks * bt;
  plan.recompute_all_s = fixed + pc.Compute(std::max(0.0, n - ctx0), ctx0);
  plan.predicted_s = plan.recompute_all_s;
  plan.load_all_s = plan.recompute_all_s;
  plan.recompute_blocks = run;
  uint32_t best_l = 0;
  std::vector<uint64_t> count(profile_.tiers.size(), 0);
  for (uint32_t l = 1; l <= run; ++l) {
    ++count[req.block_tier[l - 1]];
    double load = profile_.load_fixed_s;
    for (size_t t = 0; t < count.size(); ++t) load += LoadSeconds(static_cast<int>(t), count[t]);
    const double end = ctx0 + l * bt;
    const double cost = fixed + load + pc.Compute(std::max(0.0, n - end), end);
    if (l == run) plan.load_all_s = cost;
    if (cost <= plan.predicted_s) {  // ties go to loading more
      plan.predicted_s = cost;
      best_l = l;
    }
  }
  plan.load_blocks = best_l;
  plan.recompute_blocks = run - best_l;
  plan.choice = best_l == 0     ? PlanChoice::kRecompute
                : best_l == run ? PlanChoice::kLoad
                                : PlanChoice::kSplit;
  spdlog::debug("planner (prefix): {} tokens, {} resident, {} loadable blocks -> {}",
                req.prompt_tokens, req.resident_blocks, run, plan.ToString());
  if (on_decision_) on_decision_(req, plan);
  return plan;
}

uint32_t Planner::LoadableRun(const PlanRequest& req) const {
  if (req.prompt_tokens == 0 || !valid_) return 0;
  const uint32_t max_blocks = (req.prompt_tokens - 1) / profile_.block_tokens;
  uint32_t run = 0;
  while (run < req.block_tier.size() && req.resident_blocks + run < max_blocks &&
         req.block_tier[run] >= 0 && req.block_tier[run] < static_cast<int>(profile_.tiers.size()))
    ++run;
  return run;
}

namespace {

PlanRequest AllIn(uint32_t block_tokens, int tier, uint64_t tokens) {
  PlanRequest r;
  r.prompt_tokens = static_cast<uint32_t>(tokens);
  if (tier >= 0 && tokens > 0) r.block_tier.assign((tokens - 1) / block_tokens, tier);
  return r;
}

}  // namespace

double Planner::RecomputeAllSeconds(uint64_t tokens) const {
  return Choose(AllIn(profile_.block_tokens, -1, tokens)).recompute_all_s;
}

double Planner::LoadAllSeconds(int tier, uint64_t tokens) const {
  return Choose(AllIn(profile_.block_tokens, tier, tokens)).load_all_s;
}

uint64_t Planner::CrossoverTokens(int tier, uint64_t max_tokens) const {
  if (!valid_ || tier < 0 || tier >= static_cast<int>(profile_.tiers.size())) return 0;
  auto wins = [&](uint64_t n) {
    const Plan p = Choose(AllIn(profile_.block_tokens, tier, n));
    return p.load_all_s < p.recompute_all_s;
  };
  uint64_t lo = profile_.block_tokens;  // nothing loadable yet: loading cannot win
  uint64_t hi = lo + 1;
  while (!wins(hi)) {
    if (hi >= max_tokens) return 0;
    lo = hi;
    hi = std::min(max_tokens, hi * 2);
  }
  while (hi - lo > 1) {  // wins(hi), !wins(lo)
    const uint64_t mid = lo + (hi - lo) / 2;
    (wins(mid) ? hi : lo) = mid;
  }
  return hi;
}

}  // namespace kvtier
