#include "common/flat_id_map.h"

#include <gtest/gtest.h>

#include <random>
#include <unordered_map>
#include <vector>

namespace kvtier {
namespace {

// Differential test against std::unordered_map, with keys living in a pool as a policy's nodes
// do. Keys come from a small space in which many share their 32 hash bits ({x, y} and
// {x ^ 1, y ^ 1} hash alike), so the map must tell keys apart by the pool, and probe runs
// collide often enough to exercise backward-shift deletion and growth.
TEST(FlatIdMapTest, MatchesUnorderedMapWithCollidingHashes) {
  FlatIdMap map;
  std::vector<BlockKey> pool;
  std::vector<uint32_t> free_ids;
  std::unordered_map<BlockKey, uint32_t> model;
  auto key_of = [&](uint32_t id) -> const BlockKey& { return pool[id]; };
  std::mt19937_64 rng(11);
  for (int step = 0; step < 200000; ++step) {
    const BlockKey k{rng() % 4, rng() % 3000};
    const uint32_t found = map.Find(k, key_of);
    auto it = model.find(k);
    ASSERT_EQ(found != FlatIdMap::kNone, it != model.end()) << step;
    if (it != model.end()) {
      ASSERT_EQ(found, it->second);
    }
    if (rng() % 2 == 0) {
      if (it != model.end()) continue;
      uint32_t id;
      if (!free_ids.empty()) {
        id = free_ids.back();
        free_ids.pop_back();
        pool[id] = k;
      } else {
        id = static_cast<uint32_t>(pool.size());
        pool.push_back(k);
      }
      map.Insert(k, id);
      model.emplace(k, id);
    } else {
      ASSERT_EQ(map.Erase(k, found), it != model.end());
      if (it != model.end()) {
        free_ids.push_back(it->second);
        model.erase(it);
      }
    }
    ASSERT_EQ(map.size(), model.size());
  }
  for (const auto& [k, id] : model) ASSERT_EQ(map.Find(k, key_of), id);
}

// 8-byte slots: a million ids take 16 MiB at most (2^21 slots), where FlatKeyMap<uint32_t>
// takes 48 MiB.
TEST(FlatIdMapTest, EightBytesPerSlot) {
  FlatIdMap map(1000000);
  EXPECT_LE(map.MemoryBytes(), size_t{16} << 20);
}

}  // namespace
}  // namespace kvtier
