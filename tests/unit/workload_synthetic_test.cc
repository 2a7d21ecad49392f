// Synthetic generator: same seed, same requests; the knobs do what they say.
#include <gtest/gtest.h>

#include <map>

#include "sim/cache_replay.h"
#include "workload/synthetic.h"

namespace kvtier::workload {
namespace {

// A digest of everything a replay sees.
uint64_t Digest(RequestStream& s, uint64_t* requests, uint64_t* subagent_requests) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
  ReplayRequest r;
  *requests = *subagent_requests = 0;
  s.Rewind();
  while (s.Next(&r)) {
    ++*requests;
    *subagent_requests += r.parent_session != 0;
    mix(r.session);
    mix(static_cast<uint64_t>(r.start_s * 1e6));
    mix(r.prompt_tokens);
    mix(r.output_tokens);
    for (uint64_t id : r.ids) mix(id);
  }
  return h;
}

SyntheticOptions Small(uint64_t seed) {
  SyntheticOptions o;
  o.seed = seed;
  o.requests = 600;
  o.subagent_prob = 0.05;
  return o;
}

TEST(Synthetic, SameSeedSameRequestsAndRewindReplays) {
  auto a = MakeSyntheticStream(Small(7));
  auto b = MakeSyntheticStream(Small(7));
  auto c = MakeSyntheticStream(Small(8));
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  uint64_t na, nb, nc, sa, sb, sc;
  const uint64_t da = Digest(**a, &na, &sa);
  EXPECT_EQ(da, Digest(**b, &nb, &sb));
  EXPECT_EQ(da, Digest(**a, &na, &sa));  // after Rewind
  EXPECT_NE(da, Digest(**c, &nc, &sc));
  EXPECT_EQ(na, 600u);
  EXPECT_GT(sa, 0u);  // sub-agents happen
}

TEST(Synthetic, RequestsComeInTimeOrderAndContextsGrow) {
  auto s = MakeSyntheticStream(Small(3));
  ASSERT_TRUE(s.ok());
  ReplayRequest r;
  double last = -1;
  std::map<uint64_t, uint32_t> prev_prompt;
  uint64_t grew = 0, turns = 0;
  while ((*s)->Next(&r)) {
    EXPECT_GE(r.start_s, last);
    last = r.start_s;
    EXPECT_EQ(r.ids.size(), r.prompt_tokens / r.block_tokens);
    auto it = prev_prompt.find(r.session);
    if (it != prev_prompt.end()) {
      ++turns;
      grew += r.prompt_tokens > it->second;
    } else {
      EXPECT_TRUE(r.session_first);
    }
    prev_prompt[r.session] = r.prompt_tokens;
  }
  ASSERT_GT(turns, 0u);
  EXPECT_GT(static_cast<double>(grew) / turns, 0.8);  // compactions are the exception
}

TEST(Synthetic, LowerReuseLowersTheIdealHitRate) {
  auto ideal = [](double reuse) {
    SyntheticOptions o = Small(5);
    o.reuse = reuse;
    auto s = MakeSyntheticStream(o);
    auto r = sim::ReplayCacheOnly(**s, {.policy = "ideal"});
    return r->hit_rate();
  };
  const double full = ideal(1.0), half = ideal(0.5), none = ideal(0.0);
  EXPECT_GT(full, 0.9);
  EXPECT_LT(half, full - 0.1);
  EXPECT_LT(none, half);
}

TEST(Synthetic, ValidateNamesTheBadField) {
  SyntheticOptions o;
  o.reuse = 1.5;
  EXPECT_EQ(o.Validate().message(), "synthetic options: reuse must be in [0, 1]");
  o = SyntheticOptions{};
  o.think_p90_s = 1;
  EXPECT_FALSE(MakeSyntheticStream(o).ok());
}

}  // namespace
}  // namespace kvtier::workload
