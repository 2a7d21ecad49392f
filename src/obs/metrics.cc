#include <algorithm>
#include <bit>

#include "kvtier/metrics.h"

namespace kvtier {

int Histogram::BucketOf(uint64_t value) {
  if (value < kSubBuckets) return static_cast<int>(value);
  const int msb = 63 - std::countl_zero(value);  // >= 2
  const int sub = static_cast<int>((value >> (msb - 2)) & (kSubBuckets - 1));
  const int bucket = (msb - 1) * kSubBuckets + sub;  // msb=2 -> 4..7
  return std::min(bucket, kBuckets - 1);
}

uint64_t Histogram::BucketUpperBound(int bucket) {
  if (bucket < kSubBuckets) return static_cast<uint64_t>(bucket);
  const int msb = bucket / kSubBuckets + 1;
  const int sub = bucket % kSubBuckets;
  const uint64_t base = uint64_t{1} << msb;
  return base + (static_cast<uint64_t>(sub + 1) << (msb - 2)) - 1;
}

void Histogram::Record(uint64_t value) {
  counts_[BucketOf(value)].fetch_add(1, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(value, std::memory_order_relaxed);
  uint64_t prev = max_.load(std::memory_order_relaxed);
  while (value > prev && !max_.compare_exchange_weak(prev, value, std::memory_order_relaxed)) {
  }
}

Histogram::Snapshot Histogram::Take() const {
  Snapshot s;
  for (int i = 0; i < kBuckets; ++i) s.counts[i] = counts_[i].load(std::memory_order_relaxed);
  s.count = count_.load(std::memory_order_relaxed);
  s.sum = sum_.load(std::memory_order_relaxed);
  s.max = max_.load(std::memory_order_relaxed);
  return s;
}

uint64_t Histogram::Snapshot::Percentile(double p) const {
  uint64_t total = 0;
  for (uint64_t c : counts) total += c;
  if (total == 0) return 0;
  p = std::clamp(p, 0.0, 1.0);
  const uint64_t rank = std::max<uint64_t>(1, static_cast<uint64_t>(p * total + 0.5));
  uint64_t seen = 0;
  for (int i = 0; i < kBuckets; ++i) {
    seen += counts[i];
    if (seen >= rank) return std::min(BucketUpperBound(i), max);
  }
  return max;
}

void Histogram::Snapshot::Merge(const Snapshot& other) {
  for (int i = 0; i < kBuckets; ++i) counts[i] += other.counts[i];
  count += other.count;
  sum += other.sum;
  max = std::max(max, other.max);
}

}  // namespace kvtier
