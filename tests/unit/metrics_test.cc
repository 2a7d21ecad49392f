// The latency histogram and the Prometheus text of a Cache's stats.
#include "kvtier/metrics.h"

#include <gtest/gtest.h>

#include <map>
#include <regex>
#include <sstream>
#include <thread>
#include <vector>

#include "kvtier/cache.h"
#include "testing/test_util.h"

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

// Every line of the exposition is a comment or `name{labels} value`; a histogram's buckets are
// cumulative and end in +Inf equal to its _count.
TEST(PrometheusTest, TextParsesAndHistogramsAreConsistent) {
  CacheOptions o;
  o.layout = testing::SmallLayout();
  TierSpec host;
  host.kind = "host";
  host.name = "dram \"main\"";  // a label value that must be escaped
  host.capacity_bytes = 64 * o.layout.bytes_per_block();
  o.tiers = {host};
  auto cache = Cache::Open(o);
  ASSERT_TRUE(cache.ok()) << cache.status().ToString();
  std::vector<TokenId> tokens(o.layout.block_tokens * 4);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<TokenId>(i);
  std::vector<std::byte> bytes(4 * o.layout.bytes_per_block(), std::byte{1});
  std::vector<ConstBlock> blocks;
  for (int i = 0; i < 4; ++i)
    blocks.emplace_back(bytes.data() + i * o.layout.bytes_per_block(), o.layout.bytes_per_block());
  ASSERT_TRUE((*cache)->Store(tokens, blocks).ok());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE((*cache)->Lookup(tokens).ok());

  const std::string text = (*cache)->PrometheusText();
  const std::regex sample(R"(^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (-?[0-9.eE+-]+|\+Inf|NaN)$)");
  const std::regex comment(R"(^# (HELP|TYPE) [a-zA-Z_:][a-zA-Z0-9_:]* .+$)");
  std::map<std::string, double> counts;  // histogram name + labels -> _count
  std::map<std::string, double> inf;     // the +Inf bucket
  std::map<std::string, double> last_bucket;
  std::istringstream in(text);
  std::string line;
  int samples = 0;
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_match(line, comment)) continue;
    ASSERT_TRUE(std::regex_match(line, m, sample)) << "unparseable line: " << line;
    ++samples;
    const std::string name = m[1], labels = m[3];
    const double value = std::stod(m[4] == "+Inf" ? "inf" : std::string(m[4]));
    if (name.size() > 7 && name.ends_with("_bucket")) {
      const std::string base = name.substr(0, name.size() - 7);
      const size_t le = labels.find("le=\"");
      ASSERT_NE(le, std::string::npos) << line;
      const std::string key = base + "{" + labels.substr(0, le) + "}";
      EXPECT_GE(value, last_bucket[key]) << "buckets must be cumulative: " << line;
      last_bucket[key] = value;
      if (labels.find("le=\"+Inf\"") != std::string::npos) inf[key] = value;
    } else if (name.ends_with("_count")) {
      counts[name.substr(0, name.size() - 6) + "{" + labels + (labels.empty() ? "" : ",") + "}"] =
          value;
    }
  }
  EXPECT_GT(samples, 10);
  EXPECT_NE(text.find("dram \\\"main\\\""), std::string::npos) << "label values are escaped";
  EXPECT_FALSE(inf.empty());
  for (const auto& [key, v] : inf) {
    auto it = counts.find(key);
    ASSERT_NE(it, counts.end()) << "no _count for " << key;
    EXPECT_EQ(v, it->second) << key;
  }
}

// A tier's own counters (the remote tier's breaker opens, timeouts, ...) reach /metrics as
// kvtier_tier_<name>_total, labelled by tier, with one HELP/TYPE header.
TEST(PrometheusTest, TierCountersAreExported) {
  CacheOptions o;
  o.layout = testing::SmallLayout();
  auto faulty = testing::FaultyTier::Make(o.layout, 16 * o.layout.bytes_per_block());
  TierSpec spec;
  spec.instance = faulty;
  spec.capacity_bytes = 16 * o.layout.bytes_per_block();
  o.tiers = {spec};
  auto cache = Cache::Open(o);
  ASSERT_TRUE(cache.ok()) << cache.status().ToString();
  faulty->gets = 7;
  const std::string text = (*cache)->PrometheusText();
  EXPECT_NE(text.find("kvtier_tier_faulty_gets_total{tier=\"faulty\"} 7\n"), std::string::npos)
      << text;
  size_t headers = 0;
  for (size_t at = 0;
       (at = text.find("# TYPE kvtier_tier_faulty_gets_total counter", at)) != std::string::npos;
       ++at) {
    ++headers;
  }
  EXPECT_EQ(headers, 1u);
}

}  // namespace
}  // namespace kvtier
