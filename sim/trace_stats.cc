#include "sim/trace_stats.h"

#include <algorithm>
#include <cmath>

namespace kvtier::sim {

TraceStatsSummary ComputeTraceStats(std::span<const workload::Trace> traces) {
  TraceStatsSummary out;
  for (const workload::Trace& t : traces) {
    ConversationStats c;
    c.name = t.name;
    for (const workload::TraceSession& s : t.sessions) {
      std::span<const uint64_t> prev;
      for (size_t i = 0; i < s.requests.size(); ++i) {
        const workload::TraceRequest& q = s.requests[i];
        const std::span<const uint64_t> ids = t.IdsOf(q);
        size_t common = 0;
        while (i > 0 && common < ids.size() && common < prev.size() &&
               ids[common] == prev[common]) {
          ++common;
        }
        c.overlap_tokens += std::min<uint64_t>(common * t.block_tokens, q.prompt_tokens);
        c.prompt_tokens += q.prompt_tokens;
        ++c.requests;
        prev = ids;
      }
    }
    out.conversations.push_back(std::move(c));
  }
  std::vector<double> rates;
  for (const auto& c : out.conversations) rates.push_back(c.hit_rate());
  if (rates.empty()) return out;
  std::sort(rates.begin(), rates.end());
  auto at = [&](double q) {
    const double pos = q * static_cast<double>(rates.size() - 1);
    const size_t lo = static_cast<size_t>(std::floor(pos));
    const size_t hi = std::min(lo + 1, rates.size() - 1);
    return rates[lo] + (rates[hi] - rates[lo]) * (pos - static_cast<double>(lo));
  };
  out.min = rates.front();
  out.p25 = at(0.25);
  out.median = at(0.5);
  out.p75 = at(0.75);
  double sum = 0;
  for (double r : rates) sum += r;
  out.mean = sum / static_cast<double>(rates.size());
  return out;
}

}  // namespace kvtier::sim
