#include "kvtier/policy.h"

#include <gtest/gtest.h>

#include <deque>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/flat_map.h"
#include "testing/test_util.h"

namespace kvtier {
namespace {

using testing::Key;

auto All() {
  return [](const BlockKey&) { return true; };
}

std::unique_ptr<EvictionPolicy> Make(const std::string& name, uint64_t cap) {
  auto p = MakeEvictionPolicy(name, cap);
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return std::move(p).value();
}

TEST(PolicyTest, UnknownNameListsKnownOnes) {
  auto p = MakeEvictionPolicy("mru", 10);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(p.status().message().find("lru"), std::string::npos);
  EXPECT_NE(p.status().message().find("s3fifo"), std::string::npos);
}

TEST(PolicyTest, LruEvictsLeastRecent) {
  auto p = Make("lru", 3);
  for (int i = 1; i <= 3; ++i) p->OnInsert(Key(i), {});
  p->OnAccess(Key(1), {});
  EXPECT_EQ(p->PickVictim(All()), Key(2));
  EXPECT_EQ(p->PickVictim(All()), Key(3));
  EXPECT_EQ(p->PickVictim(All()), Key(1));
  EXPECT_FALSE(p->PickVictim(All()).has_value());
}

TEST(PolicyTest, PinnedBlocksAreSkippedAndKeepTheirPlace) {
  for (const char* name : {"lru", "s3fifo", "arc"}) {
    auto p = Make(name, 4);
    for (int i = 1; i <= 4; ++i) p->OnInsert(Key(i), {});
    std::set<uint64_t> pinned = {1, 2, 3};
    auto evictable = [&](const BlockKey& k) { return !pinned.count(k.lo); };
    EXPECT_EQ(p->PickVictim(evictable), Key(4)) << name;
    EXPECT_FALSE(p->PickVictim(evictable).has_value()) << name;
    EXPECT_EQ(p->size(), 3u) << name;
    pinned.clear();
    EXPECT_TRUE(p->PickVictim(evictable).has_value()) << name;
  }
}

TEST(PolicyTest, EraseForgetsTheKey) {
  for (const char* name : {"lru", "s3fifo", "arc"}) {
    auto p = Make(name, 4);
    p->OnInsert(Key(1), {});
    p->OnInsert(Key(2), {});
    p->OnErase(Key(1));
    EXPECT_EQ(p->size(), 1u) << name;
    EXPECT_EQ(p->PickVictim(All()), Key(2)) << name;
    EXPECT_EQ(p->size(), 0u) << name;
  }
}

// S3-FIFO: a one-hit wonder leaves through the small queue before a re-used block.
TEST(PolicyTest, S3FifoProtectsReusedBlocksFromScans) {
  auto p = Make("s3fifo", 10);
  p->OnInsert(Key(1), {});
  p->OnAccess(Key(1), {});  // re-used on probation
  for (int i = 2; i <= 10; ++i) p->OnInsert(Key(i), {});
  std::set<uint64_t> victims;
  for (int i = 0; i < 9; ++i) victims.insert(p->PickVictim(All())->lo);
  EXPECT_FALSE(victims.count(1));
  EXPECT_EQ(p->size(), 1u);
}

// S3-FIFO: a block evicted from the small queue and seen again enters main directly.
TEST(PolicyTest, S3FifoGhostHitGoesToMain) {
  auto p = Make("s3fifo", 10);
  p->OnInsert(Key(1), {});
  EXPECT_EQ(p->PickVictim(All()), Key(1));
  p->OnInsert(Key(1), {});  // ghost hit
  for (int i = 2; i <= 5; ++i) p->OnInsert(Key(i), {});
  // Small holds 2..5 (over its 1-block target) so they go first; 1 sits in main.
  for (int i = 2; i <= 5; ++i) EXPECT_NE(p->PickVictim(All()), Key(1));
  EXPECT_EQ(p->PickVictim(All()), Key(1));
}

// ARC: frequency (T2) survives a scan of new blocks.
TEST(PolicyTest, ArcKeepsFrequentBlocksThroughAScan) {
  auto p = Make("arc", 4);
  p->OnInsert(Key(1), {});
  p->OnAccess(Key(1), {});  // T2
  for (int i = 2; i <= 20; ++i) {
    p->OnInsert(Key(i), {});
    while (p->size() > 4) ASSERT_NE(p->PickVictim(All()), Key(1)) << i;
  }
}

// A chain helps only while its head is resident. Requests reuse a prefix that grows by a
// few blocks per turn over several sessions; the cache is too small for all of them. Touching
// a request's blocks last-to-first (head most recent) keeps more usable prefix than
// first-to-last, which ages the head before the tail and strands the tail.
double ChainHitRate(bool tail_first) {
  const uint64_t capacity = 60;
  auto p = Make("lru", capacity);
  FlatKeyMap<uint8_t> resident;
  uint64_t hits = 0, total = 0;
  const int sessions = 4;
  std::vector<int> length(sessions, 8);
  for (int turn = 0; turn < 12; ++turn) {
    for (int s = 0; s < sessions; ++s) {
      length[s] += 2;
      std::vector<BlockKey> chain;
      for (int b = 0; b < length[s]; ++b) chain.push_back(Key(b, s + 1));
      size_t prefix = 0;
      while (prefix < chain.size() && resident.Contains(chain[prefix])) ++prefix;
      hits += prefix;
      total += chain.size();
      auto touch = [&](const BlockKey& k) {
        if (resident.Contains(k)) {
          p->OnAccess(k, {});
          return;
        }
        while (resident.size() >= capacity) resident.Erase(*p->PickVictim(All()));
        resident.Insert(k, 1);
        p->OnInsert(k, {});
      };
      if (tail_first)
        for (size_t b = chain.size(); b-- > 0;) touch(chain[b]);
      else
        for (const BlockKey& k : chain) touch(k);
    }
  }
  return double(hits) / total;
}

TEST(PolicyTest, TouchingTailFirstBeatsHeadFirstOnChains) {
  const double head_first = ChainHitRate(false);
  const double tail_first = ChainHitRate(true);
  std::printf("chain hit rate: head-first LRU %.3f, tail-first LRU %.3f\n", head_first, tail_first);
  EXPECT_GT(tail_first, head_first + 0.05);
}

// OnAccessChain is OnAccess of each key last to first, whatever shortcut a policy takes: a
// policy fed chains through it evicts in exactly the order of one fed key by key. Chains repeat
// (LRU's already-at-the-head walk), overlap and get interleaved with other touches.
TEST(PolicyTest, OnAccessChainEvictsAsPerKeyTouches) {
  for (const std::string name : {"lru", "s3fifo", "arc"}) {
    auto chained = Make(name, 64), per_key = Make(name, 64);
    std::mt19937_64 rng(5);
    std::set<uint64_t> resident;
    for (int step = 0; step < 20000; ++step) {
      const uint64_t start = rng() % 48, len = 1 + rng() % 12;
      std::vector<BlockKey> chain;
      for (uint64_t k = start; k < start + len; ++k) chain.push_back(Key(k));
      for (const BlockKey& k : chain) {
        if (resident.insert(k.lo).second) {
          chained->OnInsert(k, AccessHint{});
          per_key->OnInsert(k, AccessHint{});
        }
      }
      const int repeats = 1 + static_cast<int>(rng() % 3);
      for (int r = 0; r < repeats; ++r) {
        chained->OnAccessChain(chain, AccessHint{});
        for (size_t i = chain.size(); i-- > 0;) {
          AccessHint h;
          h.position = static_cast<uint32_t>(i);
          per_key->OnAccess(chain[i], h);
        }
      }
      if (resident.size() > 40) {
        auto a = chained->PickVictim(All()), b = per_key->PickVictim(All());
        ASSERT_TRUE(a && b);
        ASSERT_EQ(*a, *b) << name << " step " << step;
        resident.erase(a->lo);
      }
    }
  }
}

TEST(AdmissionTest, BothRulesMustHold) {
  EXPECT_EQ(JudgeAdmission(AdmissionOptions{}, 0, 0), AdmissionVerdict::kAdmit);
  EXPECT_TRUE(AdmissionOptions{}.admits_all());

  AdmissionOptions a;
  a.min_reuse = 2;
  a.min_prefix_tokens = 1024;
  EXPECT_FALSE(a.admits_all());
  EXPECT_EQ(JudgeAdmission(a, 2, 1024), AdmissionVerdict::kAdmit);
  EXPECT_EQ(JudgeAdmission(a, 5, 4096), AdmissionVerdict::kAdmit);
  EXPECT_EQ(JudgeAdmission(a, 1, 1024), AdmissionVerdict::kSkipReuse);
  EXPECT_EQ(JudgeAdmission(a, 2, 1023), AdmissionVerdict::kSkipPrefix);
  // Both fail: the prefix rule is the one counted.
  EXPECT_EQ(JudgeAdmission(a, 0, 0), AdmissionVerdict::kSkipPrefix);

  AdmissionOptions bad;
  bad.min_reuse = 65536;  // the index's counter saturates at 65535
  EXPECT_FALSE(bad.Validate().ok());
  EXPECT_NE(bad.Validate().message().find("min_reuse"), std::string::npos);
}

}  // namespace
}  // namespace kvtier
