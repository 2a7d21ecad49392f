// Layer-wise loads (Cache::LoadLayerwise) from a tier that reads slices: layers arrive in order,
// a block is checked whole at Finish, WaitLayer times out and a load stops when destroyed.
#include <gtest/gtest.h>

#include <future>
#include <mutex>

#include "kvtier/cache.h"
#include "testing/test_util.h"

namespace kvtier {
namespace {

using testing::FaultyTier;
using testing::InstanceSpec;
using testing::OpenSmallCache;
using testing::SmallLayout;
using testing::StoredRequest;

constexpr auto kPatience = std::chrono::seconds(30);  // a hang fails instead of blocking CI

// Five stored blocks in a tier that reads slices, and buffers for them.
struct LayerwiseFixture {
  std::shared_ptr<FaultyTier> low;
  std::unique_ptr<Cache> cache;
  std::unique_ptr<StoredRequest> req;
  std::vector<std::vector<std::byte>> out;
  std::vector<MutableBlock> views;
  std::mutex mu;
  std::vector<uint64_t> offsets;  // GetSlice calls, in order

  explicit LayerwiseFixture(size_t blocks = 5) {
    low = FaultyTier::Make(SmallLayout(), 64 * SmallLayout().bytes_per_block(), "ssd");
    low->slices = true;
    low->on_get = [this](uint64_t off) {
      std::lock_guard<std::mutex> l(mu);
      offsets.push_back(off);
    };
    cache = OpenSmallCache({InstanceSpec(low)}, WriteMode::kWriteThrough, nullptr);
    req = std::make_unique<StoredRequest>(*cache, blocks, 300);
    EXPECT_TRUE(cache->Store(req->tokens, req->views).ok());
    cache->WaitForWrites();
    out.assign(blocks, std::vector<std::byte>(cache->layout().bytes_per_block()));
    views.assign(out.begin(), out.end());
    std::lock_guard<std::mutex> l(mu);
    offsets.clear();
  }
};

TEST(CacheLayerwiseTest, LayersArriveInOrderAndBlocksMatch) {
  LayerwiseFixture f;
  auto lk = f.cache->Lookup(f.req->tokens);
  ASSERT_EQ(lk->hit_blocks, 5u);
  auto load = f.cache->LoadLayerwise(*lk, 1, std::span(f.views).first(4));
  ASSERT_TRUE(load.ok()) << load.status().ToString();
  const uint32_t layers = f.cache->layout().num_layers;
  ASSERT_GT(layers, 1u);
  EXPECT_EQ((*load)->num_layers(), layers);
  EXPECT_EQ((*load)->num_blocks(), 4u);
  for (uint32_t l = 0; l < layers; ++l) EXPECT_TRUE((*load)->WaitLayer(l, kPatience).ok()) << l;
  EXPECT_EQ((*load)->WaitLayer(layers, kPatience).code(), StatusCode::kInvalidArgument);
  auto r = (*load)->Finish(kPatience);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->loaded_blocks, 4u);
  for (uint32_t i = 0; i < 4; ++i) EXPECT_EQ(f.out[i], f.req->data[1 + i]) << "block " << i;
  // One batched slice read per layer, layer 0 first.
  std::vector<uint64_t> want;
  for (uint32_t l = 0; l < layers; ++l)
    want.push_back(uint64_t{l} * f.cache->layout().layer_bytes());
  EXPECT_EQ(f.offsets, want);
  EXPECT_EQ((*load)->Finish(kPatience).status().code(), StatusCode::kInvalidArgument);
  auto bad = f.cache->LoadLayerwise(*lk, 2, std::span(f.views).first(4));
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
}

// A block is checked whole once every layer is in: one corrupt slice fails that block at
// Finish, which drops it from its tier, and the leading run stops there.
TEST(CacheLayerwiseTest, CorruptSliceFailsTheBlockAtFinish) {
  LayerwiseFixture f;
  auto lk = f.cache->Lookup(f.req->tokens);
  f.low->corrupt_reads = true;
  auto load = f.cache->LoadLayerwise(*lk, 0, f.views);
  ASSERT_TRUE(load.ok());
  auto r = (*load)->Finish(kPatience);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->loaded_blocks, 0u);
  EXPECT_EQ(r->block_status[0].code(), StatusCode::kCorruption) << r->block_status[0].ToString();
  lk = Status::NotFound("released");
  f.low->corrupt_reads = false;
  EXPECT_EQ(f.cache->Lookup(f.req->tokens)->hit_blocks, 0u);  // dropped from the index
}

// A slow tier: WaitLayer times out (the load goes on), Lookups complete meanwhile, and a load
// destroyed in flight stops without touching the buffers after.
TEST(CacheLayerwiseTest, TimeoutAndDestructionInFlight) {
  LayerwiseFixture f;
  std::promise<void> open_p;
  std::shared_future<void> opened = open_p.get_future().share();
  const uint64_t layer1 = f.cache->layout().layer_bytes();
  f.low->on_get = [&](uint64_t off) {
    if (off == layer1) opened.wait();
  };
  auto lk = f.cache->Lookup(f.req->tokens);
  auto load = f.cache->LoadLayerwise(*lk, 0, f.views);
  ASSERT_TRUE(load.ok());
  EXPECT_TRUE((*load)->WaitLayer(0, kPatience).ok());
  Status slow = (*load)->WaitLayer(1, std::chrono::milliseconds(50));
  EXPECT_EQ(slow.code(), StatusCode::kUnavailable);
  EXPECT_NE(slow.message().find("timed out"), std::string::npos) << slow.ToString();
  EXPECT_EQ(f.cache->Lookup(f.req->tokens)->hit_blocks, 5u);  // no Cache lock is held
  EXPECT_EQ((*load)->Finish(std::chrono::milliseconds(20)).status().code(),
            StatusCode::kUnavailable);
  open_p.set_value();
  (*load)->Cancel();
  auto r = (*load)->Finish(kPatience);
  ASSERT_TRUE(r.ok());
  // Cancelled before the last layer: nothing counts as loaded; or it had finished: all does.
  if (r->loaded_blocks == 0) {
    EXPECT_NE(r->block_status[0].message().find("cancelled"), std::string::npos)
        << r->block_status[0].ToString();
  } else {
    EXPECT_EQ(r->loaded_blocks, 5u);
    for (uint32_t i = 0; i < 5; ++i) EXPECT_EQ(f.out[i], f.req->data[i]);
  }
  // A second load, destroyed while its layer 1 is still being read.
  std::promise<void> open2;
  std::shared_future<void> opened2 = open2.get_future().share();
  std::promise<void> entered;
  std::atomic<bool> once{true};
  f.low->on_get = [&](uint64_t off) {
    if (off != layer1) return;
    if (once.exchange(false)) entered.set_value();
    opened2.wait();
  };
  auto load2 = f.cache->LoadLayerwise(*lk, 0, f.views);
  ASSERT_TRUE(load2.ok());
  entered.get_future().wait();
  auto destroyer = std::async(std::launch::async, [&] { load2->reset(); });
  open2.set_value();
  destroyer.wait();
}

}  // namespace
}  // namespace kvtier
