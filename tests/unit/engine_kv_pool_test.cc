// KvPool: capacity bound, prefix map, LRU eviction of unreferenced blocks, write-back hook.
#include <gtest/gtest.h>

#include <vector>

#include "engine/config.h"
#include "engine/kv_pool.h"
#include "testing/test_util.h"

namespace kvtier::engine {
namespace {

KvLayout TinyLayout() { return ModelPreset("tiny").value().Layout(16); }
using ::kvtier::testing::Key;

TEST(KvPoolTest, BlocksAreDisjointAndLaidOutPerLayer) {
  auto pool = KvPool::Create(TinyLayout(), 2).value();
  const KvLayout& l = pool->layout();
  BlockId a = pool->Allocate().value(), b = pool->Allocate().value();
  EXPECT_NE(a, b);
  EXPECT_EQ(pool->block(a).size(), l.bytes_per_block());
  auto* base = reinterpret_cast<std::byte*>(pool->K(a, 0));
  EXPECT_EQ(base, pool->block(a).data());
  EXPECT_EQ(reinterpret_cast<std::byte*>(pool->V(a, 1)),
            base + l.layer_bytes() + l.layer_bytes() / 2);
  EXPECT_EQ(pool->Allocate().status().code(), StatusCode::kResourceExhausted);
}

TEST(KvPoolTest, RegisteredBlocksAreFoundAndEvictedOldestFirst) {
  auto pool = KvPool::Create(TinyLayout(), 3).value();
  std::vector<BlockKey> evicted;
  pool->SetEvictionListener([&](const BlockKey& k, uint32_t, ConstBlock bytes) {
    EXPECT_EQ(bytes.size(), pool->block_bytes());
    evicted.push_back(k);
  });
  BlockId ids[3];
  for (int i = 0; i < 3; ++i) {
    ids[i] = pool->Allocate().value();
    ASSERT_TRUE(pool->Register(ids[i], Key(i), i));
  }
  EXPECT_FALSE(pool->Register(ids[0], Key(9), 0));  // already registered
  for (int i : {1, 0, 2}) pool->Release(ids[i]);    // LRU order now 1, 0, 2
  auto found = pool->Find(Key(0));
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(*found, ids[0]);
  BlockId fresh = pool->Allocate().value();  // evicts key 1 (oldest unreferenced)
  EXPECT_EQ(fresh, ids[1]);
  ASSERT_EQ(evicted.size(), 1u);
  EXPECT_EQ(evicted[0], Key(1));
  EXPECT_FALSE(pool->Find(Key(1)).has_value());
  BlockId fresh2 = pool->Allocate().value();  // key 0 is referenced: key 2 goes
  EXPECT_EQ(fresh2, ids[2]);
  EXPECT_EQ(pool->Allocate().status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(pool->stats().evictions, 2u);
  pool->Release(fresh);  // unregistered: free again
  EXPECT_EQ(pool->Allocate().value(), fresh);
}

TEST(KvPoolTest, DuplicateKeyStaysPrivateAndDropUnreferencedEmptiesTheMap) {
  auto pool = KvPool::Create(TinyLayout(), 2).value();
  BlockId a = pool->Allocate().value(), b = pool->Allocate().value();
  ASSERT_TRUE(pool->Register(a, Key(5), 0));
  EXPECT_FALSE(pool->Register(b, Key(5), 0));
  pool->Release(a);
  pool->Release(b);
  EXPECT_EQ(pool->stats().registered, 1u);
  pool->DropUnreferenced();
  EXPECT_EQ(pool->stats().registered, 0u);
  EXPECT_FALSE(pool->Find(Key(5)).has_value());
  EXPECT_TRUE(pool->Allocate().ok());
  EXPECT_TRUE(pool->Allocate().ok());
}

TEST(KvPoolTest, RejectsBadLayouts) {
  KvLayout l = TinyLayout();
  l.dtype = DType::kBf16;
  EXPECT_EQ(KvPool::Create(l, 4).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(KvPool::Create(TinyLayout(), 0).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvtier::engine
