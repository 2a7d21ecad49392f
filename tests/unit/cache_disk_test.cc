// The disk tier under the Cache: a Store that overflows the host tier lands on disk and a later
// Lookup + Load brings it back byte-exact, in write-through and write-back modes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <vector>

#include "kvtier/cache.h"
#include "testing/test_util.h"

namespace kvtier {
namespace {

std::vector<std::byte> Bytes(uint64_t n, uint64_t size) {
  std::vector<std::byte> b(size);
  uint64_t x = n * 0x9e3779b97f4a7c15ULL + 1;
  for (uint64_t i = 0; i < size; ++i) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    b[i] = static_cast<std::byte>(x >> 56);
  }
  return b;
}

class DiskCacheTest : public ::testing::TestWithParam<WriteMode> {
 protected:
  // Stores 32 blocks in chunks of `chunk` into an 8-block host over a disk tier, then looks
  // them up and loads them back.
  void StoreLookupLoad(uint32_t chunk);
};

TEST_P(DiskCacheTest, StoreOverflowingHostLandsOnDiskAndLoadsBackExact) { StoreLookupLoad(8); }

TEST_P(DiskCacheTest, OneStoreLargerThanHostLandsOnDiskAndLoadsBackExact) { StoreLookupLoad(32); }

void DiskCacheTest::StoreLookupLoad(uint32_t chunk) {
  ::kvtier::testing::TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  const KvLayout layout = testing::Layout16KiB();
  const uint64_t bb = layout.bytes_per_block();
  constexpr uint32_t kHostBlocks = 8, kBlocks = 32;

  CacheOptions o;
  o.layout = layout;
  o.model_id = "disk-cache-test";
  o.write_mode = GetParam();
  TierSpec host;
  host.kind = "host";
  host.capacity_bytes = kHostBlocks * bb;
  host.params = {{"prefault", "false"}, {"huge_pages", "false"}, {"pin", "false"}};
  TierSpec disk;
  disk.kind = "disk";
  disk.capacity_bytes = 4 << 20;
  disk.params = {{"path", dir.path() + "/ssd"}, {"segment_bytes", "256KiB"}, {"queue_depth", "8"}};
  o.tiers = {host, disk};
  auto opened = Cache::Open(o);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  Cache& cache = **opened;
  ASSERT_EQ(cache.tier(1).kind(), TierKind::kDisk);

  std::vector<TokenId> tokens(kBlocks * layout.block_tokens);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<TokenId>(i * 7 + 3);
  std::vector<std::vector<std::byte>> data;
  std::vector<ConstBlock> blocks;
  for (uint32_t i = 0; i < kBlocks; ++i) data.push_back(Bytes(i, bb));
  for (auto& d : data) blocks.emplace_back(d);

  // Chunks of the host's size are stored turn by turn, as an engine does (write-back: the
  // host's victims move down as later chunks arrive); one chunk of 32 overflows in one call.
  for (uint32_t first = 0; first < kBlocks; first += chunk) {
    auto stored =
        cache.Store(tokens, std::span<const ConstBlock>(blocks).subspan(first, chunk), first);
    ASSERT_TRUE(stored.ok()) << stored.status().ToString();
    EXPECT_EQ(stored->failed_blocks, 0u) << stored->first_error.ToString();
  }
  cache.WaitForWrites();  // the disk is written in the background
  // The host holds only kHostBlocks; the rest must be on disk.
  EXPECT_LE(cache.tier(0).used_bytes(), kHostBlocks * bb);
  EXPECT_GE(cache.tier(1).stats().puts, kBlocks - kHostBlocks);

  auto lookup = cache.Lookup(tokens);
  ASSERT_TRUE(lookup.ok()) << lookup.status().ToString();
  ASSERT_EQ(lookup->hit_blocks, kBlocks);
  EXPECT_GE(lookup->blocks_by_tier[1], kBlocks - kHostBlocks);

  std::vector<std::vector<std::byte>> out(kBlocks, std::vector<std::byte>(bb));
  std::vector<MutableBlock> dst;
  for (auto& d : out) dst.emplace_back(d);
  auto loaded = cache.Load(*lookup, dst);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ(loaded->loaded_blocks, kBlocks);
  for (uint32_t i = 0; i < kBlocks; ++i) {
    EXPECT_TRUE(loaded->block_status[i].ok()) << i << ": " << loaded->block_status[i].ToString();
    EXPECT_EQ(out[i], data[i]) << "block " << i << " differs";
  }
  const CacheStats st = cache.stats();
  ASSERT_EQ(st.tiers.size(), 2u);
  EXPECT_GE(st.tiers[1].hit_blocks, kBlocks - kHostBlocks);
  EXPECT_EQ(st.tiers[1].corruptions, 0u);

  // LoadVisit: host blocks lent in place (their bytes are not in scratch), disk blocks read
  // through scratch, every one in order and byte-exact.
  std::vector<std::byte> scratch_bytes(3 * bb);
  std::vector<MutableBlock> scratch;
  for (int i = 0; i < 3; ++i) scratch.emplace_back(scratch_bytes.data() + i * bb, bb);
  auto in_scratch = [&](const std::byte* p) {
    return p >= scratch_bytes.data() && p < scratch_bytes.data() + scratch_bytes.size();
  };
  const uint64_t host_gets = cache.tier(0).stats().gets;
  std::vector<uint32_t> order;
  uint32_t lent = 0;
  auto visited = cache.LoadVisit(*lookup, 1, kBlocks - 1, scratch, [&](uint32_t i, ConstBlock b) {
    order.push_back(i);
    const uint32_t block = 1 + i;
    EXPECT_TRUE(std::equal(b.begin(), b.end(), data[block].begin())) << "block " << block;
    EXPECT_EQ(in_scratch(b.data()), lookup->source[block] != 0) << "block " << block;
    lent += !in_scratch(b.data());
  });
  ASSERT_TRUE(visited.ok()) << visited.status().ToString();
  EXPECT_EQ(visited->loaded_blocks, kBlocks - 1);
  ASSERT_EQ(order.size(), kBlocks - 1);
  for (uint32_t i = 0; i < order.size(); ++i) EXPECT_EQ(order[i], i);
  EXPECT_EQ(lent, lookup->blocks_by_tier[0] - (lookup->source[0] == 0));
  EXPECT_GE(cache.tier(0).stats().gets, host_gets + lent);  // a lend counts as the tier's get

  if (GetParam() == WriteMode::kWriteThrough) {
    // A host block gone since the lookup is read from the disk copy instead, in its place.
    uint32_t gone = 0;
    while (gone < kBlocks && lookup->source[gone] != 0) ++gone;
    ASSERT_LT(gone, kBlocks);
    const BlockKey key[1] = {lookup->keys[gone]};
    ASSERT_TRUE(cache.tier(0).Erase(key).ok());
    uint32_t seen = 0;
    auto again = cache.LoadVisit(*lookup, 0, kBlocks, scratch, [&](uint32_t i, ConstBlock b) {
      EXPECT_EQ(i, seen++);
      EXPECT_TRUE(std::equal(b.begin(), b.end(), data[i].begin())) << "block " << i;
      if (i == gone) {
        EXPECT_TRUE(in_scratch(b.data()));
      }
    });
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    EXPECT_EQ(again->loaded_blocks, kBlocks);
    EXPECT_EQ(seen, kBlocks);
  }
  EXPECT_FALSE(cache.LoadVisit(*lookup, 0, kBlocks, {}, [](uint32_t, ConstBlock) {}).ok());
  EXPECT_FALSE(cache.LoadVisit(*lookup, 1, kBlocks, scratch, [](uint32_t, ConstBlock) {}).ok());
  lookup->pins.Release();
}

TEST(DiskCacheRestartTest, BlocksStoredBeforeARestartLoadBackExactAfterIt) {
  ::kvtier::testing::TempDir dir;
  const KvLayout layout = testing::Layout16KiB();
  const uint64_t bb = layout.bytes_per_block();
  constexpr uint32_t kBlocks = 12;
  auto options = [&] {
    CacheOptions o;
    o.layout = layout;
    o.model_id = "disk-restart-test";
    TierSpec host;
    host.kind = "host";
    host.capacity_bytes = 4 * bb;
    host.params = {{"prefault", "false"}, {"huge_pages", "false"}, {"pin", "false"}};
    TierSpec disk;
    disk.kind = "disk";
    disk.capacity_bytes = 4 << 20;
    disk.params = {{"path", dir.path() + "/ssd"}, {"segment_bytes", "256KiB"}};
    o.tiers = {host, disk};
    return o;
  };
  std::vector<TokenId> tokens(kBlocks * layout.block_tokens);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<TokenId>(i * 13 + 5);
  std::vector<std::vector<std::byte>> data;
  std::vector<ConstBlock> blocks;
  for (uint32_t i = 0; i < kBlocks; ++i) data.push_back(Bytes(100 + i, bb));
  for (auto& d : data) blocks.emplace_back(d);
  {
    auto cache = Cache::Open(options());
    ASSERT_TRUE(cache.ok()) << cache.status().ToString();
    auto stored = (*cache)->Store(tokens, blocks);
    ASSERT_TRUE(stored.ok()) << stored.status().ToString();
    EXPECT_EQ(stored->failed_blocks, 0u) << stored->first_error.ToString();
  }
  // A new process: the host tier is empty, the disk tier rebuilt its index from the files.
  auto cache = Cache::Open(options());
  ASSERT_TRUE(cache.ok()) << cache.status().ToString();
  auto lookup = (*cache)->Lookup(tokens);
  ASSERT_TRUE(lookup.ok()) << lookup.status().ToString();
  ASSERT_EQ(lookup->hit_blocks, kBlocks);
  EXPECT_EQ(lookup->blocks_by_tier[1], kBlocks);
  std::vector<std::vector<std::byte>> out(kBlocks, std::vector<std::byte>(bb));
  std::vector<MutableBlock> dst;
  for (auto& d : out) dst.emplace_back(d);
  auto loaded = (*cache)->Load(*lookup, dst);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ(loaded->loaded_blocks, kBlocks);
  for (uint32_t i = 0; i < kBlocks; ++i) EXPECT_EQ(out[i], data[i]) << "block " << i;
}

INSTANTIATE_TEST_SUITE_P(Modes, DiskCacheTest,
                         ::testing::Values(WriteMode::kWriteThrough, WriteMode::kWriteBack),
                         [](const ::testing::TestParamInfo<WriteMode>& p) {
                           return p.param == WriteMode::kWriteBack ? std::string("WriteBack")
                                                                   : std::string("WriteThrough");
                         });

}  // namespace
}  // namespace kvtier
