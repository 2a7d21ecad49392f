// The Prometheus text of a Cache's stats (src/obs/prometheus.cc): every line parses, histogram
// buckets are cumulative, label values are escaped, and tiers' own counters are exported.
#include <gtest/gtest.h>

#include <map>
#include <regex>
#include <sstream>
#include <string>

#include "kvtier/cache.h"
#include "testing/test_util.h"

namespace kvtier {
namespace {

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
