#include "index/block_index.h"

#include <gtest/gtest.h>

#include <algorithm>

#include <random>
#include <thread>
#include <unordered_map>

namespace kvtier {
namespace {

std::vector<BlockKey> Chain(int n, uint64_t salt = 0) {
  std::vector<BlockKey> c;
  BlockKey parent{salt, salt};
  for (int i = 0; i < n; ++i) {
    parent = ChainKeyFromId(parent, i);
    c.push_back(parent);
  }
  return c;
}

TEST(BlockIndexTest, MatchGivesLongestPrefixPerTier) {
  BlockIndex index(4);
  auto c = Chain(10);
  for (int i = 0; i < 10; ++i) index.AddTier(c[i], 1, 0);  // all in tier 1
  for (int i = 0; i < 4; ++i) index.AddTier(c[i], 0, 0);   // head in tier 0
  index.RemoveTier(c[7], 1);                               // hole at 7
  index.AddTier(c[7], 2, 0);                               // ... filled by tier 2
  MatchResult m;
  index.Match(c, &m);
  EXPECT_EQ(m.tier_prefix[0], 4u);
  EXPECT_EQ(m.tier_prefix[1], 7u);
  EXPECT_EQ(m.tier_prefix[2], 0u);
  EXPECT_EQ(m.any_prefix, 10u);
  ASSERT_EQ(m.masks.size(), 10u);
  EXPECT_EQ(m.masks[0], 0b011u);
  EXPECT_EQ(m.masks[7], 0b100u);
  index.RemoveTier(c[5], 1);
  index.Match(c, &m);
  EXPECT_EQ(m.any_prefix, 5u);  // a gap in every tier ends the loadable prefix
}

// Admission's min_reuse reads this count: each pinning match of a resident block is one reuse,
// a plain Match reads without counting, and the count saturates instead of wrapping to 0.
TEST(BlockIndexTest, PinningMatchesCountReuseOfTheHitPrefixOnly) {
  BlockIndex index(4);
  auto c = Chain(3);
  index.AddTier(c[0], 0, 0);
  index.AddTier(c[1], 0, 0);  // c[2] is not resident: a miss is no reuse
  std::vector<uint16_t> reuse;
  MatchResult m;
  m.reuse = &reuse;
  PinSet pins;
  index.MatchAndPin(c, &m, &pins);
  EXPECT_EQ(reuse, (std::vector<uint16_t>{1, 1}));
  index.MatchAndPin(std::span(c).first(1), &m, &pins);
  EXPECT_EQ(reuse, (std::vector<uint16_t>{2}));
  index.Match(c, &m);
  EXPECT_EQ(reuse, (std::vector<uint16_t>{2, 1}));
  MatchResult uncounted;  // no reuse asked: none counted
  index.MatchAndPin(c, &uncounted, &pins);
  IndexEntry e;
  ASSERT_TRUE(index.Get(c[1], &e));
  EXPECT_EQ(e.reuse, 1u);
  for (int i = 0; i < 70000; ++i) index.MatchAndPin(std::span(c).first(1), &m, &pins);
  EXPECT_EQ(reuse[0], UINT16_MAX);
  ASSERT_TRUE(index.Get(c[0], &e));
  EXPECT_EQ(e.reuse, UINT16_MAX);
}

TEST(BlockIndexTest, EntryDropsWhenNoTierRemains) {
  BlockIndex index;
  auto c = Chain(1);
  index.AddTier(c[0], 0, 0xabc);
  index.AddTier(c[0], 3, 0);
  IndexEntry e;
  ASSERT_TRUE(index.Get(c[0], &e));
  EXPECT_EQ(e.tiers, 0b1001u);
  EXPECT_EQ(e.checksum, 0xabcu);
  EXPECT_TRUE(index.RemoveTier(c[0], 0));
  EXPECT_FALSE(index.RemoveTier(c[0], 0));
  EXPECT_TRUE(index.RemoveTier(c[0], 3));
  EXPECT_FALSE(index.Get(c[0], &e));
  EXPECT_EQ(index.size(), 0u);
}

TEST(BlockIndexTest, PinsBlockEvictionUntilReleased) {
  BlockIndex index;
  auto c = Chain(3);
  for (auto& k : c) index.AddTier(k, 0, 0);
  {
    MatchResult m;
    PinSet pins;
    index.MatchAndPin(c, &m, &pins);
    EXPECT_EQ(pins.size(), 3u);
    EXPECT_TRUE(index.IsPinned(c[1]));
    EXPECT_EQ(index.TryRemoveUnpinned(c[1], 0), std::nullopt);
    PinSet moved = std::move(pins);  // move-only: the pins travel with it
    EXPECT_TRUE(pins.empty());
    EXPECT_TRUE(index.IsPinned(c[1]));
  }
  EXPECT_FALSE(index.IsPinned(c[1]));
  EXPECT_GT(index.TryRemoveUnpinned(c[1], 0).value_or(0), 0u);
}

// A key not resident in the tier asked for is not removed from it: no change number is taken,
// so no KV event reports a removal that did not happen, and the next change follows on.
TEST(BlockIndexTest, TryRemoveUnpinnedOfATierTheKeyLacksChangesNothing) {
  BlockIndex index;
  auto c = Chain(2);
  const uint64_t first = index.AddTier(c[0], 1, 7);
  EXPECT_EQ(index.TryRemoveUnpinned(c[0], 0), std::optional<uint64_t>(0));
  EXPECT_EQ(index.TryRemoveUnpinned(c[1], 0), std::optional<uint64_t>(0));  // no entry
  IndexEntry e;
  ASSERT_TRUE(index.Get(c[0], &e));
  EXPECT_EQ(e.tiers, TierMask{1} << 1);
  EXPECT_EQ(e.checksum, 7u);
  EXPECT_EQ(index.TryRemoveUnpinned(c[0], 1), std::optional<uint64_t>(first + 1));
  EXPECT_FALSE(index.Get(c[0], &e));
}

// 1 key takes the per-key locks, 1000 the all-shards path.
TEST(BlockIndexTest, EntryEvictedWhilePinnedIsDroppedOnUnpin) {
  for (size_t n : {size_t{1}, size_t{1000}}) {
    BlockIndex index;
    auto c = Chain(n);
    for (auto& k : c) index.AddTier(k, 0, 0);
    PinSet pins = index.Pin(c);
    EXPECT_EQ(pins.size(), n);
    for (auto& k : c) index.RemoveTier(k, 0);  // a self-managed tier dropped them anyway
    EXPECT_EQ(index.size(), n);
    pins.Release();
    EXPECT_EQ(index.size(), 0u) << n;
  }
}

// 40,000 keys span three Match chunks of 16,384.
TEST(BlockIndexTest, LongChainsCrossChunks) {
  BlockIndex index;
  auto c = Chain(40000);
  for (auto& k : c) index.AddTier(k, 0, 0);
  for (size_t i = 20000; i < 40000; ++i) index.AddTier(c[i], 1, 0);
  MatchResult m;
  index.Match(c, &m);
  EXPECT_EQ(m.any_prefix, 40000u);
  EXPECT_EQ(m.tier_prefix[0], 40000u);
  EXPECT_EQ(m.tier_prefix[1], 0u);
  index.RemoveTier(c[35000], 0);
  index.RemoveTier(c[35000], 1);
  {
    PinSet pins;
    index.MatchAndPin(c, &m, &pins);
    EXPECT_EQ(m.any_prefix, 35000u);
    EXPECT_EQ(pins.size(), 35000u);
    EXPECT_TRUE(index.IsPinned(c[34999]));
    EXPECT_TRUE(index.IsPinned(c[17000]));
    EXPECT_FALSE(index.IsPinned(c[35001]));
  }
  EXPECT_FALSE(index.IsPinned(c[34999]));
  EXPECT_GT(index.TryRemoveUnpinned(c[34999], 0).value_or(0), 0u);
}

// Match against a model, on the per-key path (short chains) and the batched one (long chains),
// with tiers that break at random places and the zero key (kept apart by the table) in the chain.
TEST(BlockIndexTest, MatchAgreesWithModel) {
  std::mt19937_64 rng(11);
  for (int n : {5, 300, 5000}) {
    for (int round = 0; round < 20; ++round) {
      BlockIndex index(64);
      auto c = Chain(n, round);
      c[rng() % n] = BlockKey{};
      std::vector<TierMask> model(n);
      // Tier 0 everywhere but a rare hole; tiers 1 and 2 hold a head that ends at random.
      const int head1 = static_cast<int>(rng() % (n + 1)),
                head2 = static_cast<int>(rng() % (n + 1));
      for (int i = 0; i < n; ++i) {
        model[i] = (rng() % (4 * n) == 0 ? 0u : 1u) | (i < head1 ? 2u : 0u) | (i < head2 ? 4u : 0u);
        if (rng() % 50 == 0) model[i] |= 8u;  // tier 3: scattered, never a long prefix
        for (int t = 0; t < 4; ++t) {
          if (model[i] >> t & 1) index.AddTier(c[i], t, 0);
        }
      }
      uint32_t any = 0;
      while (any < static_cast<uint32_t>(n) && model[any] != 0) ++any;
      MatchResult m;
      index.Match(c, &m);
      ASSERT_EQ(m.any_prefix, any) << n;
      ASSERT_EQ(m.masks, std::vector<TierMask>(model.begin(), model.begin() + any));
      for (int t = 0; t < kMaxTiers; ++t) {
        uint32_t want = 0;
        while (want < any && (model[want] >> t & 1)) ++want;
        EXPECT_EQ(m.tier_prefix[t], want) << "n " << n << " tier " << t;
      }
      PinSet pins;
      MatchResult pinned;
      index.MatchAndPin(c, &pinned, &pins);
      EXPECT_EQ(pinned.any_prefix, any);
      EXPECT_EQ(pinned.tier_prefix, m.tier_prefix);
      ASSERT_EQ(pins.size(), any);
      if (any > 0) {
        EXPECT_TRUE(index.IsPinned(c[any - 1]));
      }
    }
  }
}

// Differential test of the table against std::unordered_map: keys from a small space whose
// homes collide (runs that wrap around, backward-shift deletion along a shard's stride), the
// zero key among them, through growth from the smallest table.
TEST(BlockIndexTest, TableAgreesWithAMap) {
  for (int shards : {1, 4, 64}) {
    BlockIndex index(shards);
    std::unordered_map<BlockKey, TierMask> model;
    uint64_t last_change = 0;
    std::mt19937_64 rng(shards);
    for (int step = 0; step < 100000; ++step) {
      // lo ^ hi repeats often across this space, so probe runs are long.
      const BlockKey k{rng() % 4, rng() % 3000};
      const int tier = static_cast<int>(rng() % 3);
      switch (rng() % 3) {
        case 0: {
          // A change is numbered above every earlier one; adding what is there is no change.
          const bool had = model.count(k) && (model[k] >> tier & 1);
          const uint64_t change = index.AddTier(k, tier, 0);
          ASSERT_EQ(change == 0, had);
          if (change) {
            ASSERT_GT(change, last_change);
          }
          last_change = std::max(last_change, change);
          model[k] |= TierMask{1} << tier;
          break;
        }
        case 1: {
          auto it = model.find(k);
          const bool had = it != model.end() && (it->second >> tier & 1);
          const uint64_t change = index.RemoveTier(k, tier);
          ASSERT_EQ(change != 0, had);
          if (change) {
            ASSERT_GT(change, last_change);
          }
          last_change = std::max(last_change, change);
          if (it != model.end()) {
            it->second &= ~(TierMask{1} << tier);
            if (it->second == 0) model.erase(it);
          }
          break;
        }
        default: {
          IndexEntry e;
          auto it = model.find(k);
          ASSERT_EQ(index.Get(k, &e), it != model.end());
          if (it != model.end()) {
            ASSERT_EQ(e.tiers, it->second);
          }
        }
      }
      ASSERT_EQ(index.size(), model.size()) << "step " << step;
    }
    for (const auto& [k, m] : model) {
      IndexEntry e;
      ASSERT_TRUE(index.Get(k, &e));
      EXPECT_EQ(e.tiers, m);
    }
  }
}

// Writers grow the table from its smallest size while readers match a chain that is resident
// throughout: growth moves every entry, and no reader may see one missing.
TEST(BlockIndexTest, MatchDuringGrowthSeesEveryResidentBlock) {
  BlockIndex index(8);
  auto head = Chain(500, 1);
  for (auto& k : head) index.AddTier(k, 0, 0);
  std::atomic<bool> stop{false};
  std::vector<std::thread> writers;
  for (int w = 0; w < 2; ++w) {
    writers.emplace_back([&, w] {
      auto fill = Chain(20000, 100 + w);
      for (auto& k : fill) index.AddTier(k, 1, 0);
    });
  }
  std::thread reader([&] {
    MatchResult m;
    while (!stop) {
      index.Match(head, &m);
      ASSERT_EQ(m.any_prefix, 500u);
      PinSet pins = index.Pin(head);
      ASSERT_EQ(pins.size(), 500u);
    }
  });
  for (auto& t : writers) t.join();
  stop = true;
  reader.join();
  EXPECT_EQ(index.size(), 500u + 40000u);
}

TEST(BlockIndexTest, ConcurrentMatchAndUpdate) {
  BlockIndex index(8);
  auto c = Chain(2000);
  for (auto& k : c) index.AddTier(k, 0, 0);
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    for (int r = 0; r < 200; ++r) {
      for (int i = 1000; i < 2000; ++i) index.RemoveTier(c[i], 0);
      for (int i = 1000; i < 2000; ++i) index.AddTier(c[i], 0, 0);
    }
    stop = true;
  });
  MatchResult m;
  while (!stop) {
    PinSet pins;
    index.MatchAndPin(c, &m, &pins);
    ASSERT_GE(m.any_prefix, 1000u);  // the head is never touched by the writer
    ASSERT_EQ(pins.size(), m.any_prefix);
  }
  writer.join();
}

}  // namespace
}  // namespace kvtier
