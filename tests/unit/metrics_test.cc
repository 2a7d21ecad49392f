// The latency histogram (src/obs/metrics.cc): buckets, percentiles, merge.
#include "kvtier/metrics.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace kvtier {
namespace {

TEST(HistogramTest, BucketsAreMonotonicAndBoundTheirValues) {
  int last = -1;
  for (uint64_t v : {0ull, 1ull, 2ull, 3ull, 4ull, 5ull, 7ull, 8ull, 100ull, 1000ull, 123456ull,
                     1ull << 30, 1ull << 33}) {
    const int b = Histogram::BucketOf(v);
    EXPECT_GE(b, last) << v;
    EXPECT_LT(b, Histogram::kBuckets);
    if (b < Histogram::kBuckets - 1) {
      EXPECT_LE(v, Histogram::BucketUpperBound(b)) << v;
    }
    last = b;
  }
  EXPECT_EQ(Histogram::BucketOf(~0ull), Histogram::kBuckets - 1);  // beyond ~9 s: the last
}

TEST(HistogramTest, PercentilesStayWithinTheDocumentedError) {
  Histogram h;
  for (uint64_t v = 1; v <= 10000; ++v) h.Record(v * 1000);  // 1 us .. 10 ms, uniform
  Histogram::Snapshot s = h.Take();
  EXPECT_EQ(s.count, 10000u);
  EXPECT_EQ(s.max, 10000u * 1000);
  EXPECT_DOUBLE_EQ(s.Mean(), 5000.5 * 1000);
  for (double p : {0.5, 0.9, 0.99}) {
    const double exact = p * 10000 * 1000;
    const double got = static_cast<double>(s.Percentile(p));
    EXPECT_GE(got, exact * 0.99) << p;  // an upper bound of the bucket holding the rank
    EXPECT_LE(got, exact * 1.19) << p;
  }
  EXPECT_EQ(s.Percentile(1.0), s.max);  // capped at the largest value seen
  EXPECT_EQ(Histogram::Snapshot{}.Percentile(0.5), 0u);
}

TEST(HistogramTest, MergeAddsAndConcurrentRecordsAreAllCounted) {
  Histogram a, b;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 10000; ++i) (t % 2 ? a : b).Record(100 + i);
    });
  for (auto& t : threads) t.join();
  Histogram::Snapshot s = a.Take();
  s.Merge(b.Take());
  EXPECT_EQ(s.count, 40000u);
  uint64_t in_buckets = 0;
  for (uint64_t c : s.counts) in_buckets += c;
  EXPECT_EQ(in_buckets, 40000u);
  EXPECT_EQ(s.max, 100u + 9999);
}

}  // namespace
}  // namespace kvtier
