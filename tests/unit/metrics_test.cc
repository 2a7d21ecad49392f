// The latency histogram (src/obs/metrics.cc): buckets and their edges, percentiles, merge.
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

// The edges of every bucket: 0..3 exact, then four sub-buckets per power of two whose upper
// bound + 1 is the next bucket's first value; from 7 * 2^32 ns up everything is the last one.
TEST(HistogramTest, BucketEdgesAreContiguousUpToTheLastBucket) {
  for (int b = 0; b < Histogram::kSubBuckets; ++b) {
    EXPECT_EQ(Histogram::BucketOf(b), b);
    EXPECT_EQ(Histogram::BucketUpperBound(b), static_cast<uint64_t>(b));
  }
  for (int b = 0; b + 1 < Histogram::kBuckets; ++b) {
    const uint64_t hi = Histogram::BucketUpperBound(b);
    ASSERT_EQ(Histogram::BucketOf(hi), b) << b;
    ASSERT_EQ(Histogram::BucketOf(hi + 1), b + 1) << b;
  }
  const int last = Histogram::kBuckets - 1;
  const uint64_t last_first = Histogram::BucketUpperBound(last - 1) + 1;
  EXPECT_EQ(last_first, uint64_t{7} << 32);
  EXPECT_EQ(Histogram::BucketUpperBound(last), (uint64_t{1} << 35) - 1);  // ~34 s
  EXPECT_EQ(Histogram::BucketOf(last_first), last);
  EXPECT_EQ(Histogram::BucketOf(uint64_t{1} << 40), last);
}

// A percentile is an upper bound at most 25% above the value it stands for, below the last
// bucket; 0 and values beyond the range are counted like any other.
TEST(HistogramTest, PercentileOfOneValueIsItsBucketBound) {
  for (uint64_t v : {uint64_t{0}, uint64_t{3}, uint64_t{4}, uint64_t{1000}, uint64_t{1} << 20,
                     (uint64_t{7} << 32) - 1}) {
    Histogram h;
    h.Record(v);
    h.Record(~uint64_t{0});  // beyond the range: the last bucket, and the max
    const Histogram::Snapshot s = h.Take();
    EXPECT_EQ(s.count, 2u);
    EXPECT_EQ(s.counts[Histogram::kBuckets - 1], 1u);
    const uint64_t p = s.Percentile(0.5);
    EXPECT_EQ(p, Histogram::BucketUpperBound(Histogram::BucketOf(v))) << v;
    EXPECT_GE(p, v);
    EXPECT_LE(static_cast<double>(p), 1.25 * static_cast<double>(v) + 0.5) << v;
    EXPECT_EQ(s.max, ~uint64_t{0});
    // The last bucket reads as its upper bound, whatever lies beyond.
    EXPECT_EQ(s.Percentile(1.0), Histogram::BucketUpperBound(Histogram::kBuckets - 1));
  }
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
