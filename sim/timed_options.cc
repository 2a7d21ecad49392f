// TimedOptions' checks and the percentile summaries of a timed replay.
#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "sim/timed_replay.h"
#include "sim/timed_replay_impl.h"

namespace kvtier::sim {

Status TimedOptions::Validate() const {
  if (concurrency == 0) return Status::InvalidArgument("concurrency must be >= 1");
  if (replicas == 0) return Status::InvalidArgument("replicas must be >= 1");
  if (!(hbm_kv_fraction > 0 && hbm_kv_fraction <= 1)) {
    return Status::InvalidArgument("hbm_kv_fraction must be in (0, 1]");
  }
  for (const TierSpec* t : {&host, &disk, &remote}) {
    if (t->bandwidth_gbps < 0 || t->latency_s < 0) {
      return Status::InvalidArgument("tier bandwidth and latency must be >= 0");
    }
  }
  if ((disk.enabled && disk.capacity_bytes == 0) ||
      (remote.enabled && remote.capacity_bytes == 0)) {
    return Status::InvalidArgument("disk and remote tiers need a size");
  }
  if (disk.enabled && disk.bandwidth_gbps <= 0)
    return Status::InvalidArgument("disk needs a bandwidth");
  if (remote.enabled && remote.bandwidth_gbps <= 0) {
    return Status::InvalidArgument("remote needs a bandwidth");
  }
  if (!(mfu >= 0 && mfu <= 1)) return Status::InvalidArgument("mfu must be in [0, 1]");
  if (dp == 0) return Status::InvalidArgument("dp must be >= 1");
  if (!(spec_acceptance_length == 0 || spec_acceptance_length >= 1)) {
    return Status::InvalidArgument("spec acceptance length must be >= 1 (0 = the model's)");
  }
  if (warmup_s < 0 || window_s < 0 || max_idle_s < 0) {
    return Status::InvalidArgument("warmup, window and idle cap must be >= 0");
  }
  return Status::Ok();
}

Percentiles ComputePercentiles(std::vector<double> v) {
  Percentiles p;
  if (v.empty()) return p;
  std::sort(v.begin(), v.end());
  double sum = 0;
  for (double x : v) sum += x;
  p.mean = sum / static_cast<double>(v.size());
  auto at = [&](double q) {
    const double pos = q * static_cast<double>(v.size() - 1);
    const size_t lo = static_cast<size_t>(std::floor(pos));
    const size_t hi = std::min(lo + 1, v.size() - 1);
    return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
  };
  p.p50 = at(0.50);
  p.p75 = at(0.75);
  p.p90 = at(0.90);
  p.p95 = at(0.95);
  p.p99 = at(0.99);
  return p;
}

namespace timed {

// Percentiles of values weighted by counts (each value stands for `weight` samples).
Percentiles WeightedPercentiles(std::vector<std::pair<double, double>> v) {
  Percentiles p;
  double total = 0, sum = 0;
  for (auto [x, w] : v) {
    total += w;
    sum += x * w;
  }
  if (total <= 0) return p;
  std::sort(v.begin(), v.end());
  p.mean = sum / total;
  auto at = [&](double q) {
    double seen = 0;
    for (auto [x, w] : v) {
      seen += w;
      if (seen >= q * total) return x;
    }
    return v.back().first;
  };
  p.p50 = at(0.50);
  p.p75 = at(0.75);
  p.p90 = at(0.90);
  p.p95 = at(0.95);
  p.p99 = at(0.99);
  return p;
}

}  // namespace timed

}  // namespace kvtier::sim
