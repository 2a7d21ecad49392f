#include "tiers/host/host_tier.h"

#include <sys/mman.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "testing/test_util.h"

namespace kvtier {
namespace {

using testing::MakeBlock;
using testing::SmallLayout;

std::unique_ptr<HostTier> Open(uint64_t blocks, int threads = 1) {
  HostTierOptions o;
  o.capacity_bytes = blocks * SmallLayout().bytes_per_block();
  o.threads = threads;
  auto t = HostTier::Open(SmallLayout(), o);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return std::move(t).value();
}

TEST(HostTierTest, PutGetRoundTripsBytes) {
  for (int threads : {1, 2, 4}) {
    auto tier = Open(64, threads);
    const size_t bb = tier->block_bytes();
    std::vector<std::vector<std::byte>> data;
    std::vector<BlockKey> keys;
    std::vector<ConstBlock> in;
    for (int i = 0; i < 40; ++i) {
      data.push_back(MakeBlock(bb, i));
      keys.push_back(BlockKey{1, uint64_t(i)});
    }
    for (auto& d : data) in.emplace_back(d);
    std::vector<Status> res(40);
    ASSERT_TRUE(tier->Put(keys, in, res).ok());
    for (auto& s : res) ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(tier->used_bytes(), 40 * bb);

    std::vector<std::vector<std::byte>> out(40, std::vector<std::byte>(bb));
    std::vector<MutableBlock> outs;
    for (auto& o : out) outs.emplace_back(o);
    ASSERT_TRUE(tier->Get(keys, outs, res).ok());
    for (int i = 0; i < 40; ++i) {
      ASSERT_TRUE(res[i].ok());
      EXPECT_EQ(out[i], data[i]) << "block " << i << " threads " << threads;
    }
    TierStats st = tier->stats();
    EXPECT_EQ(st.puts, 40u);
    EXPECT_EQ(st.hits, 40u);
    EXPECT_EQ(st.get_bytes, 40 * bb);
  }
}

// The background prefault faults pages in without writing them: blocks put while it runs keep
// their bytes, it finishes, and a tier closed while it runs stops it.
TEST(HostTierTest, BackgroundPrefaultKeepsBlocksPutMeanwhile) {
  const KvLayout l = SmallLayout();
  HostTierOptions o;
  o.capacity_bytes = (32u << 20) / l.bytes_per_block() * l.bytes_per_block();
  o.huge_pages = false;  // 4 KiB pages: many calls, so puts meet it mid-way
  auto t = HostTier::Open(l, o);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  auto tier = std::move(t).value();
  const size_t bb = tier->block_bytes();
  const int n = static_cast<int>(tier->slots());
  std::vector<std::vector<std::byte>> data;
  std::vector<BlockKey> keys;
  std::vector<ConstBlock> in;
  for (int i = 0; i < n; ++i) {
    data.push_back(MakeBlock(bb, i));
    keys.push_back(BlockKey{7, uint64_t(i)});
  }
  for (auto& d : data) in.emplace_back(d);
  std::vector<Status> res(n);
  ASSERT_TRUE(tier->Put(keys, in, res).ok());
  for (auto& s : res) ASSERT_TRUE(s.ok()) << s.ToString();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (tier->prefault_seconds() == 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_GT(tier->prefault_seconds(), 0) << "the prefault did not finish within 60 s";
  std::vector<std::vector<std::byte>> out(n, std::vector<std::byte>(bb));
  std::vector<MutableBlock> outs;
  for (auto& b : out) outs.emplace_back(b);
  ASSERT_TRUE(tier->Get(keys, outs, res).ok());
  for (int i = 0; i < n; ++i) {
    ASSERT_TRUE(res[i].ok()) << i;
    ASSERT_EQ(out[i], data[i]) << "block " << i;
  }
  // Closed while it runs: the destructor stops and joins it.
  auto big = HostTier::Open(l, o);
  ASSERT_TRUE(big.ok());
  big.value().reset();
}

TEST(HostTierTest, LargeBatchSplitAcrossThreadsIsExact) {
  // Big enough to cross the parallel threshold, with blocks split mid-way between threads.
  KvLayout l = SmallLayout(300);  // 153,600-byte blocks: not a multiple of 4 KiB
  HostTierOptions o;
  o.capacity_bytes = 20 * l.bytes_per_block();
  o.threads = 3;
  auto tier = std::move(HostTier::Open(l, o)).value();
  std::vector<std::vector<std::byte>> data, out;
  std::vector<BlockKey> keys;
  std::vector<ConstBlock> in;
  std::vector<MutableBlock> outs;
  for (int i = 0; i < 20; ++i) {
    data.push_back(MakeBlock(l.bytes_per_block(), 100 + i));
    out.emplace_back(l.bytes_per_block());
    keys.push_back(BlockKey{2, uint64_t(i)});
  }
  for (int i = 0; i < 20; ++i) {
    in.emplace_back(data[i]);
    outs.emplace_back(out[i]);
  }
  std::vector<Status> res(20);
  ASSERT_TRUE(tier->Put(keys, in, res).ok());
  ASSERT_TRUE(tier->Get(keys, outs, res).ok());
  for (int i = 0; i < 20; ++i) EXPECT_EQ(out[i], data[i]) << i;
}

TEST(HostTierTest, CapacityIsNeverExceeded) {
  auto tier = Open(4);
  auto b = MakeBlock(tier->block_bytes(), 1);
  std::vector<BlockKey> keys;
  std::vector<ConstBlock> in;
  for (int i = 0; i < 6; ++i) {
    keys.push_back(BlockKey{0, uint64_t(i)});
    in.emplace_back(b);
  }
  std::vector<Status> res(6);
  ASSERT_TRUE(tier->Put(keys, in, res).ok());
  int ok = 0;
  for (auto& s : res) {
    if (s.ok())
      ++ok;
    else
      EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  }
  EXPECT_EQ(ok, 4);
  EXPECT_EQ(tier->used_bytes(), tier->capacity_bytes());
  ASSERT_TRUE(tier->Erase(std::span<const BlockKey>(keys).subspan(0, 1)).ok());
  std::vector<Status> one(1);
  ASSERT_TRUE(tier->Put(std::span<const BlockKey>(keys).subspan(5, 1),
                        std::span<const ConstBlock>(in).subspan(0, 1), one)
                  .ok());
  EXPECT_TRUE(one[0].ok());
}

TEST(HostTierTest, OverwriteReplacesContent) {
  auto tier = Open(2);
  auto a = MakeBlock(tier->block_bytes(), 1), b = MakeBlock(tier->block_bytes(), 2);
  BlockKey k[1] = {BlockKey{9, 9}};
  Status s[1];
  ConstBlock in[1] = {a};
  ASSERT_TRUE(tier->Put(k, in, s).ok());
  in[0] = b;
  ASSERT_TRUE(tier->Put(k, in, s).ok());
  ASSERT_TRUE(s[0].ok());
  std::vector<std::byte> out(tier->block_bytes());
  MutableBlock o[1] = {out};
  ASSERT_TRUE(tier->Get(k, o, s).ok());
  EXPECT_EQ(out, b);
  EXPECT_EQ(tier->used_bytes(), tier->block_bytes());
}

TEST(HostTierTest, BadInputIsInvalidArgument) {
  HostTierOptions o;
  o.capacity_bytes = 10;  // less than a block
  auto t = HostTier::Open(SmallLayout(), o);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find("capacity"), std::string::npos);
  o.capacity_bytes = 1 << 20;
  o.threads = 0;
  EXPECT_NE(HostTier::Open(SmallLayout(), o).status().message().find("threads"), std::string::npos);

  auto tier = Open(4);
  std::vector<std::byte> small(10);
  BlockKey k[1] = {BlockKey{1, 1}};
  ConstBlock in[1] = {small};
  Status s[1];
  ASSERT_TRUE(tier->Put(k, in, s).ok());
  EXPECT_EQ(s[0].code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s[0].message().find("10 bytes"), std::string::npos);
  Status two[2];
  EXPECT_EQ(tier->Put(k, in, two).code(), StatusCode::kInvalidArgument);  // count mismatch
  MutableBlock out[1] = {small};
  ASSERT_TRUE(tier->Get(k, out, s).ok());
  EXPECT_EQ(s[0].code(), StatusCode::kInvalidArgument);
}

TEST(HostTierTest, MissIsNotFound) {
  auto tier = Open(4);
  std::vector<std::byte> out(tier->block_bytes());
  BlockKey k[1] = {BlockKey{5, 5}};
  MutableBlock o[1] = {out};
  Status s[1];
  ASSERT_TRUE(tier->Get(k, o, s).ok());
  EXPECT_TRUE(s[0].IsNotFound());
  bool e[1];
  ASSERT_TRUE(tier->Exists(k, e).ok());
  EXPECT_FALSE(e[0]);
}

TEST(HostTierTest, ConcurrentReadersNeverSeeTornBlocks) {
  auto tier = Open(16, 2);
  const size_t bb = tier->block_bytes();
  std::atomic<bool> stop{false};
  // Writer keeps overwriting key k with blocks whose every byte equals a version number.
  std::thread writer([&] {
    std::vector<std::byte> b(bb);
    BlockKey k[1] = {BlockKey{3, 3}};
    Status s[1];
    for (int v = 0; v < 3000; ++v) {
      std::memset(b.data(), v & 0xff, bb);
      ConstBlock in[1] = {b};
      (void)tier->Put(k, in, s);
    }
    stop = true;
  });
  std::vector<std::byte> out(bb);
  BlockKey k[1] = {BlockKey{3, 3}};
  MutableBlock o[1] = {out};
  Status s[1];
  while (!stop) {
    ASSERT_TRUE(tier->Get(k, o, s).ok());
    if (!s[0].ok()) continue;
    for (size_t i = 1; i < bb; ++i) ASSERT_EQ(out[i], out[0]) << "torn read at byte " << i;
  }
  writer.join();
}

}  // namespace
}  // namespace kvtier

namespace kvtier {
namespace {

// A key of tenant tag `tag` (the daemon's internal keys carry it in the upper half of lo).
BlockKey Tagged(uint32_t tag, uint64_t i) {
  return BlockKey{i * 7919 + 1, (uint64_t{tag} << 32) | i};
}

// Whether any of `bytes` appears in fd's whole memfd.
bool MemfdHolds(int fd, size_t size, const std::vector<std::byte>& bytes) {
  void* p = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return false;
  const bool found = memmem(p, size, bytes.data(), bytes.size()) != nullptr;
  munmap(p, size);
  return found;
}

// warm_ahead: the bytes past the slots handed out so far are faulted in ahead of the stores,
// topped up as slots are handed out, never past the arena.
TEST(HostTierTest, WarmAheadFaultsInPastTheSlotsHandedOut) {
  const KvLayout l = testing::Layout16KiB();
  const uint64_t bb = l.bytes_per_block();
  HostTierOptions o;
  o.capacity_bytes = 24 * bb;
  o.prefault = false;
  o.huge_pages = false;  // page by page, so residency tells what was faulted in
  o.warm_ahead = 8 * bb;
  auto t = HostTier::Open(l, o);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  HostTier& tier = **t;
  const auto page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  auto resident = [&](uint64_t from_block, uint64_t to_block) {  // pages in, of those blocks
    const size_t pages = (to_block - from_block) * bb / page;
    std::vector<unsigned char> in(pages);
    EXPECT_EQ(mincore(tier.SlotPtr(0) + from_block * bb, pages * page, in.data()), 0);
    size_t n = 0;
    for (unsigned char c : in) n += c & 1;
    return n;
  };
  auto warmed = [&](uint64_t want) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (tier.warmed_bytes() < want && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    return tier.warmed_bytes();
  };
  ASSERT_EQ(warmed(8 * bb), 8 * bb) << "the first warm_ahead bytes at open";
  EXPECT_EQ(resident(0, 8), 8 * bb / page);
  EXPECT_EQ(resident(8, 24), 0u) << "nothing past warm_ahead";
  // Six slots handed out: the fifth's end plus half of warm_ahead passed the 8 warmed, so they
  // were topped up by warm_ahead, to 16.
  std::vector<std::vector<std::byte>> data;
  std::vector<ConstBlock> blocks;
  std::vector<BlockKey> keys;
  for (uint64_t i = 0; i < 24; ++i) {
    data.push_back(MakeBlock(bb, 500 + i));
    keys.push_back(BlockKey{i + 1, i * 3 + 1});
  }
  for (auto& d : data) blocks.emplace_back(d);
  std::vector<Status> res(24);
  ASSERT_TRUE(tier.Put(std::span<const BlockKey>(keys).first(6),
                       std::span<const ConstBlock>(blocks).first(6), std::span(res).first(6))
                  .ok());
  EXPECT_EQ(warmed(16 * bb), 16 * bb);
  EXPECT_EQ(resident(0, 16), 16 * bb / page);
  EXPECT_EQ(resident(16, 24), 0u);
  // The rest: warming stops at the arena's end.
  ASSERT_TRUE(tier.Put(std::span<const BlockKey>(keys).subspan(6),
                       std::span<const ConstBlock>(blocks).subspan(6), std::span(res).subspan(6))
                  .ok());
  EXPECT_EQ(warmed(24 * bb), 24 * bb);
  EXPECT_LE(tier.warmed_bytes(), 24 * bb);
  bool counted = false;
  for (const auto& c : tier.stats().counters) counted |= c.name == "warmed_bytes" && c.value > 0;
  EXPECT_TRUE(counted) << "the tier's stats count the warmed bytes";
}

// A shared (partitioned) arena of `blocks` SmallLayout() blocks with room for 2 tenants.
std::unique_ptr<HostTier> OpenShared(uint64_t blocks, bool prefault = true) {
  HostTierOptions o;
  o.capacity_bytes = blocks * SmallLayout().bytes_per_block();
  o.shared = true;
  o.prefault = prefault;
  o.max_partitions = 2;
  auto t = HostTier::Open(SmallLayout(), o);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? std::move(t).value() : nullptr;
}

TEST(HostTierSharedTest, PartitionsHoldOnlyTheirOwnTenantsBytesAndAreSealed) {
  auto t = OpenShared(4);
  ASSERT_NE(t, nullptr);
  HostTier& tier = *t;
  auto a = tier.AddPartition(0xA, "a");
  auto b = tier.AddPartition(0xB, "b");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*tier.AddPartition(0xA, "a"), *a);
  EXPECT_FALSE(tier.AddPartition(0xA, "not-a").ok());  // a colliding tag is refused
  EXPECT_EQ(tier.AddPartition(0xC, "c").status().code(), StatusCode::kResourceExhausted);
  const size_t bb = tier.block_bytes();
  // A fills the whole arena, then B takes every slot over: A's pages are punched out.
  std::vector<std::vector<std::byte>> da, db;
  std::vector<BlockKey> ka, kb;
  std::vector<ConstBlock> ia, ib;
  for (uint64_t i = 0; i < 4; ++i) {
    da.push_back(MakeBlock(bb, 100 + i));
    db.push_back(MakeBlock(bb, 200 + i));
    ka.push_back(Tagged(0xA, i));
    kb.push_back(Tagged(0xB, i));
  }
  for (auto& d : da) ia.emplace_back(d);
  for (auto& d : db) ib.emplace_back(d);
  std::vector<Status> res(4);
  ASSERT_TRUE(tier.Put(ka, ia, res).ok());
  const int fa = tier.partition_fd(*a), fb = tier.partition_fd(*b);
  EXPECT_TRUE(MemfdHolds(fa, tier.arena_bytes(), da[0]));
  EXPECT_FALSE(MemfdHolds(fb, tier.arena_bytes(), da[0]));
  EXPECT_EQ(tier.usage(*a).held, 4u);
  ASSERT_TRUE(tier.Erase(ka).ok());
  ASSERT_TRUE(tier.Put(kb, ib, res).ok());
  for (auto& s : res) EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(tier.usage(*a).held, 0u);
  EXPECT_EQ(tier.usage(*b).held, 4u);
  for (uint64_t i = 0; i < 4; ++i) {
    EXPECT_FALSE(MemfdHolds(fa, tier.arena_bytes(), da[i])) << "A's pages stayed, slot " << i;
    EXPECT_FALSE(MemfdHolds(fa, tier.arena_bytes(), db[i])) << "B's bytes in A's memfd";
    EXPECT_TRUE(MemfdHolds(fb, tier.arena_bytes(), db[i]));
  }
  std::vector<std::byte> got(bb);
  std::vector<MutableBlock> out{MutableBlock(got)};
  std::vector<Status> one(1);
  ASSERT_TRUE(tier.Get(std::span<const BlockKey>(&kb[2], 1), out, one).ok());
  EXPECT_TRUE(one[0].ok());
  EXPECT_EQ(got, db[2]);
  // Sealed: whoever holds the fd can neither shrink nor grow it.
  EXPECT_NE(ftruncate(fb, 0), 0);
  EXPECT_NE(ftruncate(fb, static_cast<off_t>(tier.arena_bytes()) * 2), 0);
}

// Claimed slots come after the ones a partition freed itself, lowest first, only from slots
// nobody was handed yet, within the partition's bounds; another partition may still take them,
// and then their pages leave the claimer's memfd.
TEST(HostTierSharedTest, ClaimAheadHandsAPartitionUntouchedSlotsNextLowestFirst) {
  auto t = OpenShared(8);
  ASSERT_NE(t, nullptr);
  HostTier& tier = *t;
  const int a = *tier.AddPartition(0xA, "a"), b = *tier.AddPartition(0xB, "b");
  auto offsets = [&](std::initializer_list<uint32_t> slots) {
    std::vector<uint64_t> v;
    for (uint32_t s : slots) v.push_back(tier.SlotOffset(s));
    return v;
  };
  std::vector<uint64_t> warm;
  EXPECT_EQ(tier.ClaimAhead(0, 4, &warm), 0u);  // partition 0 serves no writer
  EXPECT_EQ(tier.ClaimAhead(a, 4, &warm), 4u);
  EXPECT_EQ(warm, offsets({0, 1, 2, 3}));
  EXPECT_EQ(tier.ClaimAhead(a, 4, &warm), 0u);  // half or more still free: no claim
  std::vector<uint32_t> got;
  ASSERT_EQ(tier.ReserveSlots(a, 3, &got), 3u);
  EXPECT_EQ(got, (std::vector<uint32_t>{0, 1, 2}));
  warm.clear();
  EXPECT_EQ(tier.ClaimAhead(a, 4, &warm), 3u);  // one left: topped up to 4
  EXPECT_EQ(warm, offsets({4, 5, 6}));
  tier.ReleaseSlots(std::span<const uint32_t>(&got[2], 1));  // A frees slot 2: handed first
  got.clear();
  ASSERT_EQ(tier.ReserveSlots(a, 5, &got), 5u);
  EXPECT_EQ(got, (std::vector<uint32_t>{2, 3, 4, 5, 6}));
  EXPECT_EQ(tier.usage(a).held, 7u);
  tier.SetBounds(b, HostTier::Bounds{0, 0});  // B may hold nothing: nothing claimed for it
  warm.clear();
  EXPECT_EQ(tier.ClaimAhead(b, 4, &warm), 0u);
  tier.SetBounds(b, HostTier::Bounds{});
  EXPECT_EQ(tier.ClaimAhead(b, 4, &warm), 1u);  // the last untouched slot
  EXPECT_EQ(warm, offsets({7}));
  warm.clear();
  EXPECT_EQ(tier.ClaimAhead(b, 4, &warm), 0u);  // none untouched left; A's are not taken
  EXPECT_TRUE(warm.empty());
}

TEST(HostTierSharedTest, AClaimedSlotTakenByAnotherPartitionLeavesTheClaimersMemfd) {
  auto t = OpenShared(2);
  ASSERT_NE(t, nullptr);
  HostTier& tier = *t;
  const int a = *tier.AddPartition(0xA, "a"), b = *tier.AddPartition(0xB, "b");
  std::vector<uint64_t> warm;
  ASSERT_EQ(tier.ClaimAhead(a, 2, &warm), 2u);
  // A's client faults the claimed slots in (here: writes them).
  const std::vector<std::byte> mark = MakeBlock(tier.block_bytes(), 7);
  for (uint64_t off : warm)
    ASSERT_EQ(pwrite(tier.partition_fd(a), mark.data(), mark.size(), static_cast<off_t>(off)),
              static_cast<ssize_t>(mark.size()));
  ASSERT_TRUE(MemfdHolds(tier.partition_fd(a), tier.arena_bytes(), mark));
  std::vector<uint32_t> got;
  ASSERT_EQ(tier.ReserveSlots(b, 2, &got), 2u);  // B's stores take A's claimed (free) slots
  EXPECT_FALSE(MemfdHolds(tier.partition_fd(a), tier.arena_bytes(), mark));
  EXPECT_EQ(tier.usage(b).held, 2u);
}

// A daemon's partition 0 holds no pages, and its slots move without a punch; once it held a
// block (an untagged key), a claim takes the slot's pages out of its memfd.
TEST(HostTierSharedTest, ClaimAheadTakesPartitionZerosPagesOnceItHeldABlock) {
  auto t = OpenShared(4, /*prefault=*/false);
  ASSERT_NE(t, nullptr);
  HostTier& tier = *t;
  const int a = *tier.AddPartition(0xA, "a");
  const std::vector<std::byte> mark = MakeBlock(tier.block_bytes(), 9);
  const BlockKey untagged = Tagged(0, 1);
  const ConstBlock one[] = {ConstBlock(mark)};
  std::vector<Status> res(1);
  ASSERT_TRUE(tier.Put(std::span<const BlockKey>(&untagged, 1), one, res).ok());
  ASSERT_TRUE(res[0].ok()) << res[0].ToString();
  ASSERT_TRUE(MemfdHolds(tier.arena_fd(), tier.arena_bytes(), mark));
  ASSERT_TRUE(tier.Erase(std::span<const BlockKey>(&untagged, 1)).ok());
  std::vector<uint64_t> warm;
  ASSERT_EQ(tier.ClaimAhead(a, 8, &warm), 4u);  // every slot, the one that held the block too
  EXPECT_FALSE(MemfdHolds(tier.arena_fd(), tier.arena_bytes(), mark));
}

}  // namespace
}  // namespace kvtier
