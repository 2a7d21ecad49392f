// The stats schema (src/obs/stats_schema.h): well formed, and every field of it reaches every
// surface that reports stats: the wire (encode, decode), /metrics, and the C API's flat view;
// every histogram the wire and /metrics.
// `kvtier status` is checked in tests/cli/status_format_test.cc, the Python dict in
// python/tests/test_stats.py, the C API itself in tests/install/c_consumer.
#include "obs/stats_schema.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>

#include "obs/prometheus.h"
#include "serve/protocol.h"

namespace kvtier {
namespace {

bool SnakeCase(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s)
    if (!(c == '_' || (c >= 'a' && c <= 'z'))) return false;
  return true;
}

TEST(StatsSchemaTest, FieldsAreWellFormedAndTheirNamesUnique) {
  std::set<std::string> top, tier, metrics;
  for (const StatField& f : StatFields()) {
    SCOPED_TRACE(std::string(f.name));
    EXPECT_TRUE(SnakeCase(f.name));
    EXPECT_FALSE(f.unit.empty());
    EXPECT_FALSE(f.help.empty());
    EXPECT_TRUE(f.metric.starts_with("kvtier_"));
    EXPECT_EQ(f.metric.ends_with("_total"), f.kind == StatKind::kCounter);
    EXPECT_TRUE(metrics.insert(std::string(f.metric)).second) << "metric used twice";
    // Exactly the accessor of its scope.
    EXPECT_EQ(f.cache != nullptr, f.scope == StatScope::kCache);
    EXPECT_EQ(f.tier != nullptr, f.scope == StatScope::kTier);
    EXPECT_EQ(f.serve != nullptr, f.scope == StatScope::kServe);
    // Cache and daemon fields share one namespace (the wire's, JSON's and Python's top level).
    auto& names = f.scope == StatScope::kTier ? tier : top;
    EXPECT_TRUE(names.insert(std::string(f.name)).second) << "name used twice";
    EXPECT_EQ(FindStatField(f.scope, f.name), &f);
  }
  EXPECT_EQ(FindStatField(StatScope::kCache, "no_such_field"), nullptr);
}

// A histogram of its own: v samples of v ns, and one of 2v.
void Fill(Histogram::Snapshot* h, uint64_t v) {
  h->counts[Histogram::BucketOf(v)] = v;
  h->counts[Histogram::BucketOf(2 * v)] += 1;
  h->count = v + 1;
  h->sum = v * v + 2 * v;
  h->max = 2 * v;
}

bool Same(const Histogram::Snapshot& a, const Histogram::Snapshot& b) {
  return a.counts == b.counts && a.count == b.count && a.sum == b.sum && a.max == b.max;
}

// Stats in which every schema field and histogram has its own value, and two tiers with their
// own counters.
struct Distinct {
  CacheStats cache;
  ServeCounters serve;
  Distinct() {
    cache.tiers.resize(2);
    cache.tiers[0].name = "dram";
    cache.tiers[1].name = "ssd \"a\"";  // a label value to escape
    cache.tiers[1].kind = TierKind::kDisk;
    cache.tiers[1].tier.counters = {{"degraded", "1 while in trouble", 1, true},
                                    {"disk_space_evictions", "Segments evicted early", 77}};
    uint64_t v = 1000;
    for (const StatHistogram& h : StatHistograms()) {
      if (h.scope == StatScope::kCache) Fill(h.cache(&cache), ++v);
      if (h.scope != StatScope::kTier) continue;
      for (auto& t : cache.tiers) Fill(h.tier(&t), ++v);
    }
    for (const StatField& f : StatFields()) {
      if (f.scope == StatScope::kCache) *f.cache(&cache) = ++v;
      if (f.scope == StatScope::kServe) *f.serve(&serve) = ++v;
      if (f.scope != StatScope::kTier) continue;
      for (auto& t : cache.tiers) *f.tier(&t) = ++v;
    }
  }
};

TEST(StatsSchemaTest, EveryFieldCrossesTheWire) {
  const Distinct in;
  serve::Writer w;
  serve::EncodeStatsReply(in.cache, in.serve, &w);
  serve::Reader r(w.buffer());
  CacheStats out;
  ServeCounters serve;
  ASSERT_TRUE(serve::DecodeStatsReply(&r, &out, &serve).ok());
  ASSERT_EQ(out.tiers.size(), 2u);
  for (const StatField& f : StatFields()) {
    SCOPED_TRACE(std::string(f.name));
    if (f.scope == StatScope::kCache) {
      EXPECT_EQ(StatValue(f, out), StatValue(f, in.cache));
    }
    if (f.scope == StatScope::kServe) {
      EXPECT_EQ(StatValue(f, serve), StatValue(f, in.serve));
    }
    if (f.scope != StatScope::kTier) continue;
    for (size_t i = 0; i < 2; ++i)
      EXPECT_EQ(StatValue(f, out.tiers[i]), StatValue(f, in.cache.tiers[i]));
  }
  for (const StatHistogram& h : StatHistograms()) {
    SCOPED_TRACE(std::string(h.name));
    if (h.scope == StatScope::kCache) {
      EXPECT_TRUE(Same(HistogramValue(h, out), HistogramValue(h, in.cache)));
    }
    if (h.scope != StatScope::kTier) continue;
    for (size_t i = 0; i < 2; ++i)
      EXPECT_TRUE(Same(HistogramValue(h, out.tiers[i]), HistogramValue(h, in.cache.tiers[i])));
  }
  EXPECT_EQ(out.tiers[1].name, in.cache.tiers[1].name);
  EXPECT_EQ(out.tiers[1].kind, TierKind::kDisk);
  ASSERT_EQ(out.tiers[1].tier.counters.size(), 2u);
  EXPECT_EQ(out.tiers[1].tier.counters[0].name, "degraded");
  EXPECT_EQ(out.tiers[1].tier.counters[0].help, "1 while in trouble");
  EXPECT_TRUE(out.tiers[1].tier.counters[0].gauge);
  EXPECT_EQ(out.tiers[1].tier.counters[1].value, 77u);
  EXPECT_FALSE(out.tiers[1].tier.counters[1].gauge);
}

TEST(StatsSchemaTest, EveryFieldIsOnMetrics) {
  const Distinct in;
  const std::string text = PrometheusText(in.cache, &in.serve);
  auto has = [&](const std::string& line) { return text.find(line + "\n") != std::string::npos; };
  for (const StatField& f : StatFields()) {
    SCOPED_TRACE(std::string(f.name));
    const std::string m(f.metric);
    EXPECT_TRUE(has("# TYPE " + m + (f.kind == StatKind::kGauge ? " gauge" : " counter")));
    if (f.scope == StatScope::kCache) {
      EXPECT_TRUE(has(m + " " + std::to_string(StatValue(f, in.cache))));
    }
    if (f.scope == StatScope::kServe) {
      EXPECT_TRUE(has(m + " " + std::to_string(StatValue(f, in.serve))));
    }
    if (f.scope != StatScope::kTier) continue;
    EXPECT_TRUE(has(m + "{tier=\"dram\"} " + std::to_string(StatValue(f, in.cache.tiers[0]))));
    EXPECT_TRUE(
        has(m + "{tier=\"ssd \\\"a\\\"\"} " + std::to_string(StatValue(f, in.cache.tiers[1]))));
  }
  for (const StatHistogram& h : StatHistograms()) {
    SCOPED_TRACE(std::string(h.name));
    const std::string m(h.metric);
    EXPECT_TRUE(has("# TYPE " + m + " histogram"));
    if (h.scope == StatScope::kCache) {
      EXPECT_TRUE(has(m + "_count " + std::to_string(HistogramValue(h, in.cache).count)));
    }
    if (h.scope != StatScope::kTier) continue;
    EXPECT_TRUE(has(m + "_count{tier=\"dram\"} " +
                    std::to_string(HistogramValue(h, in.cache.tiers[0]).count)));
  }
  EXPECT_TRUE(has("kvtier_tier_degraded{tier=\"ssd \\\"a\\\"\"} 1"));
  EXPECT_TRUE(has("kvtier_tier_disk_space_evictions_total{tier=\"ssd \\\"a\\\"\"} 77"));
  // An in-process cache has no daemon: no kvtier_serve_ lines.
  EXPECT_EQ(PrometheusText(in.cache, nullptr).find("kvtier_serve_"), std::string::npos);
}

TEST(StatsSchemaTest, EveryFieldIsInTheFlatView) {
  const Distinct in;
  std::map<std::string, uint64_t> flat;
  for (const auto& [name, v] : FlatStats(in.cache, &in.serve))
    EXPECT_TRUE(flat.emplace(name, v).second) << name << " listed twice";
  for (const StatField& f : StatFields()) {
    const std::string n(f.name);
    if (f.scope == StatScope::kCache) {
      EXPECT_EQ(flat.at(n), StatValue(f, in.cache)) << n;
    }
    if (f.scope == StatScope::kServe) {
      EXPECT_EQ(flat.at(n), StatValue(f, in.serve)) << n;
    }
    if (f.scope != StatScope::kTier) continue;
    EXPECT_EQ(flat.at("tier.dram." + n), StatValue(f, in.cache.tiers[0])) << n;
    EXPECT_EQ(flat.at("tier.ssd \"a\"." + n), StatValue(f, in.cache.tiers[1])) << n;
  }
  EXPECT_EQ(flat.at("tier.ssd \"a\".disk_space_evictions"), 77u);
  size_t serve_fields = 0;
  for (const StatField& f : StatFields()) serve_fields += f.scope == StatScope::kServe;
  EXPECT_EQ(FlatStats(in.cache, nullptr).size() + serve_fields, flat.size());
}

}  // namespace
}  // namespace kvtier
