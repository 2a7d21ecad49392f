#include "sim/cache_compare.h"

#include <cmath>

namespace kvtier::sim {

std::vector<std::string> DefaultComparePolicies() {
  return {"lru", "lru-tail", "s3fifo", "arc", "session"};
}

Status CacheCompareOptions::Validate() const {
  if (policies.empty()) return Status::InvalidArgument("no policies to compare");
  if (!(capacity_live >= 0) || !std::isfinite(capacity_live)) {
    return Status::InvalidArgument("capacity multiple of live context must be >= 0");
  }
  if (capacity_live == 0 && capacity_tokens == 0) {
    return Status::InvalidArgument("give a capacity in tokens or as a multiple of live context");
  }
  for (const auto& p : policies) {
    if (p == "min" || p == "ideal") {
      return Status::InvalidArgument("'" + p + "' is a bound and always reported; not a policy");
    }
  }
  return Status::Ok();
}

Result<CacheCompareResult> CompareCacheOnly(workload::RequestStream& stream,
                                            const CacheCompareOptions& options,
                                            const ProgressFn& progress) {
  KVTIER_RETURN_IF_ERROR(options.Validate());
  CacheCompareResult out;
  KVTIER_ASSIGN_OR_RETURN(out.stats, workload::ComputeStats(stream));
  out.capacity_tokens =
      options.capacity_live > 0
          ? static_cast<uint64_t>(options.capacity_live * out.stats.live_context_mean_tokens)
          : options.capacity_tokens;
  if (options.measure_baseline) {
    KVTIER_ASSIGN_OR_RETURN(StreamCost c, MeasureStreamCost(stream));
    out.baseline = c;
  }
  const double steps = static_cast<double>(options.policies.size() + 2);
  double step = 0;
  auto sub = [&](double f) {
    if (progress) progress((step + f) / steps);
  };
  KVTIER_ASSIGN_OR_RETURN(out.ideal, ReplayCacheOnly(stream, {.policy = "ideal"}, sub));
  step += 1;
  if (options.with_min) {
    auto m = workload::Materialize(stream, options.min_max_blocks);
    if (m.ok()) {
      KVTIER_ASSIGN_OR_RETURN(CacheReplayResult r, ReplayBelady(*m, out.capacity_tokens));
      out.min = std::move(r);
    } else {
      out.min_skipped = m.status().message();
    }
  } else {
    out.min_skipped = "not asked for";
  }
  step += 1;
  for (const auto& p : options.policies) {
    CacheReplayOptions o;
    o.policy = p;
    o.capacity_tokens = out.capacity_tokens;
    o.touch = options.touch;
    auto r = ReplayCacheOnly(stream, o, sub);
    if (!r.ok()) return r.status().WithContext("policy " + p);
    if ((p == "lru" || p == "lru-tail") && r->hit_rate() > out.best_lru_hit_rate) {
      out.best_lru_hit_rate = r->hit_rate();
      out.best_lru = p;
    }
    out.policies.push_back(std::move(r).value());
    step += 1;
  }
  return out;
}

}  // namespace kvtier::sim
