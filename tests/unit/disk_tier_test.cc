// DiskTier through the Tier interface and MakeTier("disk"): params, capabilities, the removal
// listener, persistence across reopen, and layer-wise reads through Tier::GetSlice.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <set>
#include <vector>

#include "kvtier/cache.h"
#include "kvtier/tier.h"
#include "testing/test_util.h"
#include "tiers/disk/disk_tier.h"

namespace kvtier {
namespace {

using testing::Key;

std::vector<std::byte> Bytes(uint64_t n, uint64_t size) {
  std::vector<std::byte> b(size);
  for (uint64_t i = 0; i < size; ++i) b[i] = static_cast<std::byte>((n * 131 + i * 7) >> 2);
  return b;
}

// Puts blocks Key(0..2) with Bytes(i, bb); returns their keys.
std::vector<BlockKey> PutThree(Tier& t, uint64_t bb) {
  std::vector<std::vector<std::byte>> data;
  std::vector<BlockKey> keys;
  std::vector<ConstBlock> blocks;
  for (uint64_t i = 0; i < 3; ++i) {
    data.push_back(Bytes(i, bb));
    keys.push_back(Key(i));
  }
  for (auto& d : data) blocks.emplace_back(d);
  std::vector<Status> res(3);
  EXPECT_TRUE(t.Put(keys, blocks, res).ok());
  for (auto& r : res) EXPECT_TRUE(r.ok()) << r.ToString();
  return keys;
}

TierSpec DiskSpec(const std::string& dir, uint64_t capacity) {
  TierSpec s;
  s.kind = "disk";
  s.name = "ssd";
  s.capacity_bytes = capacity;
  s.params = {{"path", dir}, {"segment_bytes", "256KiB"}, {"queue_depth", "4"}, {"sync", "batch"}};
  return s;
}

TEST(DiskTierTest, MakeTierBuildsADiskTierWithItsCapabilities) {
  ::kvtier::testing::TempDir dir;
  auto made = MakeTier(DiskSpec(dir.path(), 4 << 20), testing::Layout16KiB());
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  Tier& t = **made;
  EXPECT_EQ(t.kind(), TierKind::kDisk);
  EXPECT_EQ(t.name(), "ssd");
  const TierCapabilities c = t.capabilities();
  EXPECT_FALSE(c.managed_by_cache);
  EXPECT_TRUE(c.persistent);
  EXPECT_TRUE(c.verify_on_load);
  EXPECT_TRUE(c.verifies_reads);
  EXPECT_TRUE(c.reads_slices);
  EXPECT_FALSE(c.authoritative);  // a new Cache asks Exists: the files outlive its index
  const auto names = TierKindNames();
  EXPECT_NE(std::find(names.begin(), names.end(), "disk"), names.end());
}

TEST(DiskTierTest, BadParamsAreNamed) {
  ::kvtier::testing::TempDir dir;
  TierSpec s = DiskSpec(dir.path(), 4 << 20);
  s.params["queue_depth"] = "lots";
  auto r = MakeTier(s, testing::Layout16KiB());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("queue_depth"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("ssd"), std::string::npos) << r.status().message();

  s = DiskSpec(dir.path(), 4 << 20);
  s.params["colour"] = "blue";
  r = MakeTier(s, testing::Layout16KiB());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("colour"), std::string::npos) << r.status().message();

  s = DiskSpec(dir.path(), 4 << 20);
  s.params.erase("path");
  r = MakeTier(s, testing::Layout16KiB());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("path"), std::string::npos) << r.status().message();

  s = DiskSpec(dir.path(), 4 << 20);
  s.params["sync"] = "sometimes";
  r = MakeTier(s, testing::Layout16KiB());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("sync"), std::string::npos) << r.status().message();

  s = DiskSpec(dir.path(), 300 << 10);  // less than two segments
  r = MakeTier(s, testing::Layout16KiB());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("capacity_bytes"), std::string::npos) << r.status().message();
}

TEST(DiskTierTest, PutGetThroughTheTierInterfaceAndListenerSeesEvictions) {
  ::kvtier::testing::TempDir dir;
  const KvLayout layout = testing::Layout16KiB();
  const uint64_t bb = layout.bytes_per_block();
  auto made = MakeTier(DiskSpec(dir.path(), 1 << 20), layout);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  Tier& t = **made;
  std::set<BlockKey> removed;
  t.SetRemovalListener(
      [&](std::span<const BlockKey> keys) { removed.insert(keys.begin(), keys.end()); });

  const uint64_t n = 3 * (1 << 20) / bb;  // three times the capacity
  for (uint64_t i = 0; i < n; ++i) {
    std::vector<std::byte> b = Bytes(i, bb);
    const BlockKey k[1] = {Key(i)};
    const ConstBlock blk[1] = {ConstBlock(b)};
    Status res[1];
    ASSERT_TRUE(t.Put(k, blk, res).ok());
    ASSERT_TRUE(res[0].ok()) << res[0].ToString();
    ASSERT_LE(t.used_bytes(), t.capacity_bytes());
  }
  EXPECT_FALSE(removed.empty());
  uint64_t hits = 0;
  for (uint64_t i = 0; i < n; ++i) {
    std::vector<std::byte> out(bb);
    const BlockKey k[1] = {Key(i)};
    const MutableBlock o[1] = {MutableBlock(out)};
    Status res[1];
    ASSERT_TRUE(t.Get(k, o, res).ok());
    if (res[0].ok()) {
      ++hits;
      EXPECT_EQ(out, Bytes(i, bb)) << i;
      EXPECT_EQ(removed.count(Key(i)), 0u) << i;
    } else {
      EXPECT_TRUE(res[0].IsNotFound()) << res[0].ToString();
      EXPECT_EQ(removed.count(Key(i)), 1u) << i;
    }
  }
  EXPECT_GT(hits, 0u);
  const TierStats st = t.stats();
  EXPECT_EQ(st.puts, n);
  EXPECT_EQ(st.hits, hits);
}

// Issue 27 item 6: resident blocks were used bytes / block bytes, and a disk tier's used bytes
// count its segment headers, record headers and dead records: an empty tier showed blocks, and
// three blocks showed as four. Now the index's blocks are counted.
TEST(DiskTierTest, ResidentBlocksCountTheIndexNotTheBytes) {
  ::kvtier::testing::TempDir dir;
  const KvLayout layout = testing::Layout16KiB();
  const uint64_t bb = layout.bytes_per_block();
  auto made = MakeTier(DiskSpec(dir.path(), 4 << 20), layout);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  Tier& t = **made;
  EXPECT_EQ(t.stats().resident_blocks, 0u);
  const std::vector<BlockKey> keys = PutThree(t, bb);
  EXPECT_EQ(t.stats().resident_blocks, 3u);
  ASSERT_TRUE(t.Erase(std::span<const BlockKey>(keys).first(1)).ok());
  EXPECT_EQ(t.stats().resident_blocks, 2u);
}

TEST(DiskTierTest, BlocksSurviveReopenAndAreDurableUnderBatchSync) {
  ::kvtier::testing::TempDir dir;
  const KvLayout layout = testing::Layout16KiB();
  const uint64_t bb = layout.bytes_per_block();
  {
    auto made = disk::DiskTier::Open(
        "ssd", layout, 4 << 20,
        *disk::DiskOptionsFromParams({{"path", dir.path()}, {"segment_bytes", "1MiB"}}));
    ASSERT_TRUE(made.ok()) << made.status().ToString();
    std::vector<std::vector<std::byte>> data;
    std::vector<BlockKey> keys;
    std::vector<ConstBlock> blocks;
    for (uint64_t i = 0; i < 10; ++i) {
      data.push_back(Bytes(i, bb));
      keys.push_back(Key(i));
    }
    for (auto& d : data) blocks.emplace_back(d);
    std::vector<Status> res(10);
    ASSERT_TRUE((*made)->Put(keys, blocks, res).ok());
    for (auto& r : res) ASSERT_TRUE(r.ok()) << r.ToString();
    for (uint64_t i = 0; i < 10; ++i) EXPECT_TRUE((*made)->IsDurable(Key(i)));
  }
  auto made = MakeTier(DiskSpec(dir.path(), 4 << 20), layout);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  bool exists[10];
  std::vector<BlockKey> keys;
  for (uint64_t i = 0; i < 10; ++i) keys.push_back(Key(i));
  ASSERT_TRUE((*made)->Exists(keys, exists).ok());
  for (uint64_t i = 0; i < 10; ++i) {
    EXPECT_TRUE(exists[i]) << i;
    std::vector<std::byte> out(bb);
    const MutableBlock o[1] = {MutableBlock(out)};
    Status res[1];
    ASSERT_TRUE((*made)->Get({&keys[i], 1}, o, res).ok());
    ASSERT_TRUE(res[0].ok()) << res[0].ToString();
    EXPECT_EQ(out, Bytes(i, bb));
  }
}

TEST(DiskTierTest, GetSliceReadsLayersAndTheBlocksChecksum) {
  ::kvtier::testing::TempDir dir;
  const KvLayout layout = testing::Layout16KiB();
  const uint64_t bb = layout.bytes_per_block();
  const uint64_t layer = bb / layout.num_layers;
  auto made = MakeTier(DiskSpec(dir.path(), 4 << 20), layout);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  Tier& t = **made;
  std::vector<BlockKey> keys = PutThree(t, bb);
  std::vector<Status> res;

  keys.push_back(Key(42));  // never stored
  std::vector<std::vector<std::byte>> got(4, std::vector<std::byte>(bb));
  for (uint64_t offset = 0; offset < bb; offset += layer) {
    std::vector<MutableBlock> out;
    for (auto& g : got) out.emplace_back(g.data() + offset, layer);
    std::vector<uint64_t> sums(4, 7);
    res.assign(4, Status());
    ASSERT_TRUE(t.GetSlice(keys, offset, out, sums, res).ok());
    for (uint64_t i = 0; i < 3; ++i) {
      ASSERT_TRUE(res[i].ok()) << res[i].ToString();
      EXPECT_EQ(sums[i], Checksum64(Bytes(i, bb))) << i;
    }
    EXPECT_TRUE(res[3].IsNotFound()) << res[3].ToString();
    EXPECT_EQ(sums[3], 0u);
  }
  for (uint64_t i = 0; i < 3; ++i) EXPECT_EQ(got[i], Bytes(i, bb)) << i;

  // A slice past the block's end: refused per block by Tier::GetSlice.
  std::vector<std::byte> tail(200);
  const MutableBlock o[1] = {MutableBlock(tail)};
  Status r[1];
  ASSERT_TRUE(t.GetSlice({&keys[0], 1}, bb - 100, o, {}, r).ok());
  EXPECT_EQ(r[0].code(), StatusCode::kInvalidArgument) << r[0].ToString();
  EXPECT_NE(r[0].message().find("passes the end"), std::string::npos) << r[0].message();
}

TEST(DiskTierTest, OtherLayoutOnTheSameDirectoryIsRefused) {
  ::kvtier::testing::TempDir dir;
  {
    auto made = MakeTier(DiskSpec(dir.path(), 4 << 20), testing::Layout16KiB());
    ASSERT_TRUE(made.ok()) << made.status().ToString();
  }
  KvLayout other = testing::Layout16KiB();
  other.num_layers = 4;
  auto r = MakeTier(DiskSpec(dir.path(), 4 << 20), other);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("layout"), std::string::npos) << r.status().message();
}

}  // namespace
}  // namespace kvtier
