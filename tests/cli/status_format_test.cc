// `kvtier status` (tools/kvtier/status_format.cc): every field of the stats schema is a key of
// --json and a name=value of the text, with its own value.
#include "status_format.h"

#include <gtest/gtest.h>

#include <string>

#include "obs/stats_schema.h"

namespace kvtier::cli {
namespace {

DaemonStatus Distinct() {
  DaemonStatus d;
  d.cache.tiers.resize(2);
  d.cache.tiers[0].name = "dram";
  d.cache.tiers[1].name = "ssd";
  d.cache.tiers[1].kind = TierKind::kDisk;
  d.cache.tiers[1].tier.counters = {{"degraded", "1 while in trouble", 1, true}};
  uint64_t v = 1000;
  for (const StatField& f : StatFields()) {
    if (f.scope == StatScope::kCache) *f.cache(&d.cache) = ++v;
    if (f.scope == StatScope::kServe) *f.serve(&d) = ++v;
    if (f.scope != StatScope::kTier) continue;
    for (auto& t : d.cache.tiers) *f.tier(&t) = ++v;
  }
  return d;
}

TEST(StatusFormatTest, EveryFieldIsAJsonKey) {
  const DaemonStatus d = Distinct();
  const nlohmann::json j = StatusJson(d);
  for (const StatField& f : StatFields()) {
    const std::string n(f.name);
    SCOPED_TRACE(n);
    if (f.scope == StatScope::kCache) {
      EXPECT_EQ(j.at(n).get<uint64_t>(), StatValue(f, d.cache));
    }
    if (f.scope == StatScope::kServe) {
      EXPECT_EQ(j.at(n).get<uint64_t>(), StatValue(f, d));
    }
    if (f.scope != StatScope::kTier) continue;
    for (size_t i = 0; i < 2; ++i)
      EXPECT_EQ(j.at("tiers").at(i).at(n).get<uint64_t>(), StatValue(f, d.cache.tiers[i]));
  }
  EXPECT_EQ(j.at("tiers").at(1).at("kind"), "disk");
  EXPECT_EQ(j.at("tiers").at(1).at("counters").at("degraded"), 1);
  EXPECT_EQ(j.at("protocol_errors").get<uint64_t>(), d.disconnects);  // the key it always had
  EXPECT_TRUE(j.contains("hit_rate"));
  for (const StatHistogram& h : StatHistograms()) {
    const std::string n(h.name);
    if (h.scope == StatScope::kCache) {
      EXPECT_TRUE(j.at(n).contains("p99")) << n;
    }
    if (h.scope == StatScope::kTier) {
      EXPECT_TRUE(j.at("tiers").at(1).at(n).contains("count")) << n;
    }
  }
}

TEST(StatusFormatTest, EveryFieldIsInTheText) {
  const DaemonStatus d = Distinct();
  const std::string text = StatusText(d);
  auto has = [&](std::string_view name, uint64_t v) {
    return text.find(" " + std::string(name) + "=" + std::to_string(v)) != std::string::npos;
  };
  for (const StatField& f : StatFields()) {
    SCOPED_TRACE(std::string(f.name));
    if (f.scope == StatScope::kCache) {
      EXPECT_TRUE(has(f.name, StatValue(f, d.cache)));
    }
    if (f.scope == StatScope::kServe) {
      EXPECT_TRUE(has(f.name, StatValue(f, d)));
    }
    if (f.scope != StatScope::kTier) continue;
    for (const auto& t : d.cache.tiers) EXPECT_TRUE(has(f.name, StatValue(f, t)));
  }
  EXPECT_TRUE(has("degraded", 1)) << text;
  EXPECT_NE(text.find("daemon pid"), std::string::npos) << text;
}

}  // namespace
}  // namespace kvtier::cli
