// Lock-free latency histogram. (Cache::PrometheusText renders a Cache's stats, histograms
// included.)
//
// Thread-safety: Histogram::Record and the accessors may be called from any thread; a snapshot
// taken while others record is approximate (each bucket is read atomically, not all at once).
#ifndef KVTIER_METRICS_H_
#define KVTIER_METRICS_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <string>

namespace kvtier {

// Log-linear buckets over nanoseconds: 0..3 ns exact, then 4 sub-buckets per power of two up
// to 2^35 - 1 ns (~34 s); the last bucket also takes every value from 7 * 2^32 ns (~30 s) up
// and reads as 2^35 - 1. A percentile is its bucket's upper bound (capped at the max seen):
// below ~30 s at most 25% above the exact value.
class Histogram {
 public:
  static constexpr int kSubBuckets = 4;
  static constexpr int kBuckets = 34 * kSubBuckets;

  struct Snapshot {
    std::array<uint64_t, kBuckets> counts{};
    uint64_t count = 0;
    uint64_t sum = 0;
    uint64_t max = 0;
    // p in [0, 1]; 0 when empty. Returns the bucket's upper bound, capped at max.
    uint64_t Percentile(double p) const;
    double Mean() const { return count ? static_cast<double>(sum) / count : 0.0; }
    void Merge(const Snapshot& other);
  };

  void Record(uint64_t value);
  Snapshot Take() const;
  static int BucketOf(uint64_t value);
  static uint64_t BucketUpperBound(int bucket);

 private:
  // Invariants: counters only grow; relaxed order suffices since readers need no ordering.
  std::array<std::atomic<uint64_t>, kBuckets> counts_{};
  std::atomic<uint64_t> count_{0};
  std::atomic<uint64_t> sum_{0};
  std::atomic<uint64_t> max_{0};
};

}  // namespace kvtier

#endif  // KVTIER_METRICS_H_
