// The daemon as a trust boundary (doc/serve.md, "Isolation"): hostile clients on the raw
// protocol truncate, scan and overwrite what they map, flood the socket before hello and stall
// mid-frame, while a good client of another tenant keeps getting bit-exact blocks.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <memory>

#include <gtest/gtest.h>

#include "serve_util.h"

namespace kvtier::testing {
namespace {

class ServeHostileTest : public ::testing::Test {
 protected:
  TempDir dir_;
};

// The daemon's resident set, in bytes (0 when unreadable).
uint64_t RssBytes(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  return 0;
}

// The bytes of blocks [0, n) of prefix `base` under c's root, as StoreChain writes them.
std::vector<std::vector<std::byte>> ChainBytes(KvCache& c, uint32_t base, uint32_t n) {
  const KvLayout& l = c.layout();
  std::vector<BlockKey> keys;
  HashPrefix(c.Root(), l.block_tokens, Tokens(uint64_t{n} * l.block_tokens, base), &keys);
  std::vector<std::vector<std::byte>> out;
  for (const BlockKey& k : keys) out.push_back(MakeBlock(l.bytes_per_block(), Seed(k)));
  return out;
}

// A mapping of a passed arena fd, unmapped on scope exit.
struct Mapping {
  std::byte* base = nullptr;
  size_t bytes = 0;
  explicit Mapping(int fd) {
    struct stat sb;
    if (fstat(fd, &sb) != 0) return;
    bytes = static_cast<size_t>(sb.st_size);
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p != MAP_FAILED) base = static_cast<std::byte*>(p);
  }
  ~Mapping() {
    if (base) munmap(base, bytes);
  }
};

TEST_F(ServeHostileTest, ArenaCannotBeTruncatedScannedOrOverwrittenAcrossTenants) {
  Daemon d(dir_.path(), Config(64, "", "  tenants:\n    - {name: B, token: tb}\n"));
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  auto b = Client::Open(Opts(d, "B", "tb"));
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  ASSERT_EQ(StoreChain(**b, 5, 8).stored_blocks, 8u);

  Raw hostile(d.socket());
  int fd = -1;
  ASSERT_TRUE(hostile.Hello(serve::kProtocolVersion, &fd, "A").ok());
  ASSERT_GE(fd, 0);
  struct stat sb;
  ASSERT_EQ(fstat(fd, &sb), 0);
  // Sealed: no shrink, no grow, not even through a reopened /proc path.
  EXPECT_NE(ftruncate(fd, 0), 0);
  EXPECT_EQ(errno, EPERM);
  const int again = open(("/proc/self/fd/" + std::to_string(fd)).c_str(), O_RDWR);
  ASSERT_GE(again, 0);
  EXPECT_NE(ftruncate(again, 0), 0);
  EXPECT_NE(ftruncate(again, sb.st_size * 2), 0);
  EXPECT_NE(fcntl(again, F_ADD_SEALS, F_SEAL_WRITE), 0);  // sealed against new seals too
  close(again);
  {
    // A scan of everything this client can map finds none of B's blocks, then it overwrites
    // all of it.
    Mapping m(fd);
    ASSERT_NE(m.base, nullptr);
    int found = 0;
    for (const auto& block : ChainBytes(**b, 5, 8))
      found += memmem(m.base, m.bytes, block.data(), 256) != nullptr;
    EXPECT_EQ(found, 0);
    std::memset(m.base, 0xFF, m.bytes);
  }
  close(fd);
  EXPECT_EQ(LoadChain(**b, 5, 8), 8);  // bit-exact (LoadChain compares every byte)
  // B's blocks are in B's own partition: a second B client maps and finds them.
  Raw peer(d.socket());
  int bfd = -1;
  ASSERT_TRUE(peer.Hello(serve::kProtocolVersion, &bfd, "B", "tb").ok());
  {
    Mapping m(bfd);
    ASSERT_NE(m.base, nullptr);
    EXPECT_NE(memmem(m.base, m.bytes, ChainBytes(**b, 5, 8)[0].data(), 256), nullptr);
  }
  close(bfd);
  EXPECT_TRUE(StatusOf(d).ok()) << d.Log();
}

// Another uid declaring the same (unlisted) tenant name gets a tenant of its own.
TEST_F(ServeHostileTest, AnotherUidDeclaringTheSameNameSeesNothing) {
  if (getuid() != 0) GTEST_SKIP() << "needs root to run a client as uid 65534 (CI runs as root)";
  ASSERT_EQ(chmod(dir_.path().c_str(), 0711), 0);
  Daemon d(dir_.path(), Config(64, "", "  socket_mode: 0666\n"));
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  auto root = Client::Open(Opts(d));
  ASSERT_TRUE(root.ok());
  ASSERT_EQ(StoreChain(**root, 4, 8).stored_blocks, 8u);
  const auto blocks = ChainBytes(**root, 4, 8);
  const pid_t kid = fork();
  ASSERT_GE(kid, 0);
  if (kid == 0) {
    if (setgid(65534) != 0 || setuid(65534) != 0) _exit(10);
    Raw other(d.socket());
    int fd = -1;
    if (!other.Hello(serve::kProtocolVersion, &fd).ok() || fd < 0) _exit(11);
    Mapping m(fd);
    if (m.base == nullptr) _exit(12);
    for (const auto& block : blocks)
      if (memmem(m.base, m.bytes, block.data(), 256) != nullptr) _exit(1);
    // Its lookups of the same tokens hit nothing either.
    ClientOptions o = Opts(d);
    auto c = Client::Open(o);
    if (!c.ok() || LoadChain(**c, 4, 8) != 0) _exit(2);
    _exit(0);
  }
  int st = 0;
  ASSERT_EQ(waitpid(kid, &st, 0), kid);
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 0) << "1: root's bytes in its mapping; 2: a hit on root's blocks";
  EXPECT_EQ(LoadChain(**root, 4, 8), 8);
}

TEST_F(ServeHostileTest, BytesChangedAfterCommitAreMissesThenRepaired) {
  Daemon d(dir_.path(), Config(64));
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  auto c = Client::Open(Opts(d));
  ASSERT_TRUE(c.ok());
  ASSERT_EQ(StoreChain(**c, 3, 6).stored_blocks, 6u);
  ASSERT_EQ(StoreChain(**c, 4, 6).stored_blocks, 6u);
  // Another process of the same tenant zeroes the arena it shares with c.
  Raw same(d.socket());
  int fd = -1;
  ASSERT_TRUE(same.Hello(serve::kProtocolVersion, &fd).ok());
  {
    Mapping m(fd);
    ASSERT_NE(m.base, nullptr);
    std::memset(m.base, 0, m.bytes);
  }
  close(fd);
  EXPECT_EQ(LoadChain(**c, 3, 6), 0);  // a miss (recompute), never a wrong hit
  EXPECT_EQ((*c)->client_stats().corrupt_blocks, 1u);
  EXPECT_EQ(LoadChain(**c, 4, 6, {}, /*visit=*/true), 0);  // lent, then checked: the same
  EXPECT_EQ((*c)->client_stats().corrupt_blocks, 2u);
  // Each report is verified and the block dropped, so storing again repairs the chain.
  int loaded = 0;
  for (int round = 0; round < 8 && loaded != 6; ++round) {
    StoreChain(**c, 3, 6);
    loaded = LoadChain(**c, 3, 6);
    ASSERT_GE(loaded, 0) << "a wrong block was served";
  }
  EXPECT_EQ(loaded, 6);
  EXPECT_TRUE(d.WaitForLog("changed in the arena after its commit", 1000)) << d.Log();
}

// A lent load of many blocks: one changed in the middle ends the load there, the blocks
// before it loaded and checked.
TEST_F(ServeHostileTest, AChangedBlockInsideALargeLentLoadEndsItThere) {
  KvLayout big = SmallLayout(16);
  big.num_layers = 4;
  big.num_kv_heads = 4;
  big.head_dim = 64;  // fp32: 128 KiB blocks, as a real model's
  ASSERT_EQ(big.bytes_per_block(), size_t{128} << 10);
  Daemon d(dir_.path(), Config(64, "", "", 30000, big));
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  auto c = Client::Open(Opts(d, "", "", big));
  ASSERT_TRUE(c.ok());
  ASSERT_EQ(StoreChain(**c, 6, 24).stored_blocks, 24u);
  ASSERT_EQ(LoadChain(**c, 6, 24, {}, /*visit=*/true), 24);
  // Another process of the same tenant flips a byte of block 13 where the arena holds it.
  Raw same(d.socket());
  int fd = -1;
  ASSERT_TRUE(same.Hello(serve::kProtocolVersion, &fd, "", "", big).ok());
  {
    Mapping m(fd);
    ASSERT_NE(m.base, nullptr);
    const auto block = ChainBytes(**c, 6, 24)[13];
    auto* at = static_cast<std::byte*>(memmem(m.base, m.bytes, block.data(), block.size()));
    ASSERT_NE(at, nullptr);
    at[block.size() / 2] ^= std::byte{1};
  }
  close(fd);
  EXPECT_EQ(LoadChain(**c, 6, 24, {}, /*visit=*/true), 13);  // the first 13, never a wrong one
  EXPECT_EQ((*c)->client_stats().corrupt_blocks, 1u);
}

TEST_F(ServeHostileTest, FloodsBeforeHelloAndStalledFramesAreBounded) {
  Daemon d(dir_.path(), Config(16, "",
                               "  max_pending: 4\n  hello_timeout_ms: 300\n"
                               "  frame_timeout_ms: 300\n"));
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  auto good = Client::Open(Opts(d));
  ASSERT_TRUE(good.ok());
  ASSERT_EQ(StoreChain(**good, 9, 4).stored_blocks, 4u);
  const uint64_t rss0 = RssBytes(d.pid());
  // Twenty clients past hello each announce a 32 MiB frame and send 1 MiB of it, then stall.
  std::vector<std::unique_ptr<Raw>> stalled;
  std::vector<std::byte> chunk(1u << 20);
  for (int i = 0; i < 20; ++i) {
    auto r = std::make_unique<Raw>(d.socket());
    ASSERT_TRUE(r->Hello().ok());
    std::byte hdr[serve::kHeaderBytes];
    serve::EncodeHeader({serve::kMaxPayload, static_cast<uint16_t>(MsgType::kLookup), 0, 2}, hdr);
    ASSERT_TRUE(r->Send(hdr));
    ASSERT_TRUE(r->Send(chunk));
    stalled.push_back(std::move(r));
  }
  const uint64_t rss1 = RssBytes(d.pid());
  // Before: each announced frame was allocated and zeroed whole (20 x 32 MiB = 640 MiB). Now
  // about 20 x 1.25 MiB; the bound leaves room for a sanitizer's shadow and quarantine (ASan
  // measured +68 MiB).
  EXPECT_LT(rss1, rss0 + (160ull << 20)) << rss0 << " -> " << rss1;
  for (auto& r : stalled) EXPECT_TRUE(r->Closed());  // frame_timeout_ms
  // Idle sockets that never say hello fill max_pending, not max_clients: status is told why.
  std::vector<std::unique_ptr<Raw>> idle;
  for (int i = 0; i < 4; ++i) idle.push_back(std::make_unique<Raw>(d.socket()));
  ASSERT_TRUE(
      PollUntil([&] { return Counter(d, [](auto& s) { return s.clients; }) == UINT64_MAX; }, 2000));
  auto refused = StatusOf(d);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("waiting for hello"), std::string::npos)
      << refused.status().ToString() << "\n"
      << d.Log();
  // A pre-hello frame larger than a hello is refused before it is read.
  for (auto& r : idle) EXPECT_TRUE(r->Closed());  // hello_timeout_ms
  Raw big(d.socket());
  std::byte hdr[serve::kHeaderBytes];
  serve::EncodeHeader({serve::kMaxPayload, static_cast<uint16_t>(MsgType::kHello), 0, 1}, hdr);
  ASSERT_TRUE(big.Send(hdr));
  EXPECT_TRUE(big.Closed());
  // The good client was never hurt, and the daemon answers.
  EXPECT_EQ(LoadChain(**good, 9, 4), 4);
  EXPECT_TRUE(StatusOf(d).ok()) << d.Log();
}

TEST_F(ServeHostileTest, TenantSharesHoldWhileAnotherStoresTenTimesTheArena) {
  Daemon d(dir_.path(), Config(64, "",
                               "  tenants:\n"
                               "    - {name: R, token: tr, reserved_share: 0.5}\n"
                               "    - {name: M, token: tm, max_share: 0.25}\n"));
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  auto r = Client::Open(Opts(d, "R", "tr"));
  auto m = Client::Open(Opts(d, "M", "tm"));
  auto h = Client::Open(Opts(d, "H"));
  ASSERT_TRUE(r.ok() && m.ok() && h.ok());
  ASSERT_EQ(StoreChain(**r, 1, 24).stored_blocks, 24u);
  for (uint32_t i = 0; i < 40; ++i) StoreChain(**h, 100 + i, 16);  // 640 blocks: 10x the arena
  EXPECT_EQ(LoadChain(**r, 1, 24), 24);                            // R keeps its reserved half
  EXPECT_EQ(LoadChain(**h, 139, 16), 16);                          // H still stores into the rest
  // M holds at most a quarter (16 blocks), evicting its own beyond that, not H's.
  EXPECT_LE(StoreChain(**m, 500, 40).stored_blocks, 16u);
  EXPECT_EQ(LoadChain(**h, 139, 16), 16);
  EXPECT_EQ(LoadChain(**r, 1, 24), 24);
  StoreChain(**m, 600, 12);
  EXPECT_EQ(LoadChain(**m, 600, 12), 12);
  EXPECT_EQ(LoadChain(**r, 1, 24), 24);
}

}  // namespace
}  // namespace kvtier::testing
