#include "common/flat_map.h"

#include <gtest/gtest.h>

#include <random>
#include <unordered_map>

namespace kvtier {
namespace {

// Differential test against std::unordered_map: random inserts, finds and erases, with keys
// from a small space (the zero key included) so probe runs collide and backward-shift deletion
// is exercised, at the default and at the index's lower load factor.
template <typename Map>
void CheckAgainstUnorderedMap() {
  Map map;
  std::unordered_map<BlockKey, uint32_t> model;
  std::mt19937_64 rng(7);
  for (int step = 0; step < 200000; ++step) {
    BlockKey k{rng() % 3, rng() % 2000};
    switch (rng() % 3) {
      case 0: {
        uint32_t v = static_cast<uint32_t>(rng());
        auto [slot, inserted] = map.Insert(k, v);
        auto [it, model_inserted] = model.emplace(k, v);
        ASSERT_EQ(inserted, model_inserted);
        ASSERT_EQ(*slot, it->second);
        break;
      }
      case 1:
        ASSERT_EQ(map.Erase(k), model.erase(k) == 1);
        break;
      default: {
        const uint32_t* v = map.Find(k);
        auto it = model.find(k);
        ASSERT_EQ(v != nullptr, it != model.end());
        if (v) {
          ASSERT_EQ(*v, it->second);
        }
      }
    }
    ASSERT_EQ(map.size(), model.size());
  }
  size_t seen = 0;
  map.ForEach([&](const BlockKey& k, uint32_t v) {
    ++seen;
    EXPECT_EQ(model.at(k), v);
  });
  EXPECT_EQ(seen, model.size());
}

TEST(FlatKeyMapTest, MatchesUnorderedMap) { CheckAgainstUnorderedMap<FlatKeyMap<uint32_t>>(); }
TEST(FlatKeyMapTest, MatchesUnorderedMapAtLowLoad) {
  CheckAgainstUnorderedMap<FlatKeyMap<uint32_t, 3>>();
}

TEST(FlatKeyMapTest, ZeroKeyIsAnOrdinaryKey) {
  FlatKeyMap<int> map;
  EXPECT_EQ(map.Find(BlockKey{}), nullptr);
  map.Insert(BlockKey{}, 5);
  ASSERT_NE(map.Find(BlockKey{}), nullptr);
  EXPECT_EQ(*map.Find(BlockKey{}), 5);
  EXPECT_FALSE(map.Insert(BlockKey{}, 6).second);
  EXPECT_EQ(map.size(), 1u);
  int seen = 0;
  map.ForEach([&](const BlockKey& k, int v) {
    ++seen;
    EXPECT_EQ(k, BlockKey{});
    EXPECT_EQ(v, 5);
  });
  EXPECT_EQ(seen, 1);
  EXPECT_TRUE(map.Erase(BlockKey{}));
  EXPECT_FALSE(map.Erase(BlockKey{}));
  EXPECT_EQ(map.Find(BlockKey{}), nullptr);
  EXPECT_TRUE(map.empty());
}

}  // namespace
}  // namespace kvtier
