// kvtier serve end to end: the real daemon binary on a private socket, real client processes,
// the real shared arena. Every load is checked byte for byte against the model "a block's
// bytes are a function of its key".
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#define MSGPACK_NO_BOOST 1
#include <map>
#include <msgpack.hpp>
#include <set>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "daemon_harness.h"
#include "events/kv_event_codec.h"
#include "kvtier/client.h"
#include "serve/protocol.h"
#include "serve/server.h"
#include "serve/socket_io.h"
#include "serve_util.h"
#include "testing/kv_event_subscriber.h"
#include "testing/test_util.h"

namespace kvtier::testing {
namespace {

class ServeTest : public ::testing::Test {
 protected:
  TempDir dir_;
};

TEST_F(ServeTest, StoreLookupLoadThroughTheSharedArena) {
  Daemon d(dir_.path(), Config(256));
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  auto c = Client::Open(Opts(d));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_TRUE((*c)->connected());
  EXPECT_EQ(LoadChain(**c, 7, 10), 0);
  StoreResult s = StoreChain(**c, 7, 10);
  EXPECT_EQ(s.stored_blocks, 10u);
  EXPECT_EQ(s.failed_blocks, 0u);
  EXPECT_EQ(LoadChain(**c, 7, 10), 10);
  EXPECT_EQ(LoadChain(**c, 7, 14), 10);  // a longer prompt hits its stored prefix
  int lent = 0;
  EXPECT_EQ(LoadChain(**c, 7, 14, {}, /*visit=*/true, &lent), 10);
  EXPECT_EQ(lent, 10) << "LoadVisit copied through scratch instead of lending the arena's bytes";
  // Storing it again copies nothing.
  s = StoreChain(**c, 7, 10);
  EXPECT_EQ(s.present_blocks, 10u);
  // A second process-like client (its own connection and mapping) sees the same blocks.
  auto c2 = Client::Open(Opts(d));
  ASSERT_TRUE(c2.ok());
  EXPECT_EQ(LoadChain(**c2, 7, 10), 10);
  auto st = (*c2)->GetDaemonStatus();
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(st->cache.tiers[0].resident_blocks, 10u);
  EXPECT_GE(st->clients, 2u);
  EXPECT_EQ(st->pid, static_cast<uint64_t>(d.pid()));
  // The engine's planner declines hits: one-way, counted by the daemon, seen by every client.
  const uint32_t declined[] = {4};
  (*c)->NoteDeclined(declined);
  auto after = (*c)->GetDaemonStatus();  // same connection: after the one-way message
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->cache.tiers[0].declined_blocks, 4u);
  // These clients declared no model revision: the daemon says what that risks.
  EXPECT_NE(d.Log().find("model 'test' declares no revision"), std::string::npos) << d.Log();
}

TEST_F(ServeTest, LeasesEndWithReleaseAndPinsKeepBlocksResident) {
  Daemon d(dir_.path(), Config(8));
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  auto c = Client::Open(Opts(d));
  ASSERT_TRUE(c.ok());
  StoreChain(**c, 1, 4);
  auto lr = (*c)->Lookup(Tokens(16, 1));
  ASSERT_TRUE(lr.ok());
  ASSERT_EQ(lr->hit_blocks, 4u);
  EXPECT_TRUE(PollUntil([&] { return Counter(d, [](auto& s) { return s.leases; }) == 1; }, 2000));
  // Filling the 8-block arena with other blocks cannot evict the pinned four.
  StoreChain(**c, 2, 8);
  std::vector<std::vector<std::byte>> buf(4,
                                          std::vector<std::byte>(SmallLayout().bytes_per_block()));
  std::vector<MutableBlock> dst(buf.begin(), buf.end());
  auto ld = (*c)->Load(*lr, dst);
  ASSERT_TRUE(ld.ok());
  EXPECT_EQ(ld->loaded_blocks, 4u);
  for (int i = 0; i < 4; ++i)
    EXPECT_EQ(buf[i], MakeBlock(buf[i].size(), Seed(lr->keys[i]))) << "block " << i;
  lr->pins.Release();
  EXPECT_TRUE(PollUntil([&] { return Counter(d, [](auto& s) { return s.leases; }) == 0; }, 2000));
}

TEST_F(ServeTest, LeaseExpiresWhenNotReleased) {
  Daemon d(dir_.path(), Config(64, "", "", 100));
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  auto c = Client::Open(Opts(d));
  ASSERT_TRUE(c.ok());
  StoreChain(**c, 1, 4);
  auto lr = (*c)->Lookup(Tokens(16, 1));
  ASSERT_TRUE(lr.ok());
  ASSERT_EQ(lr->hit_blocks, 4u);
  EXPECT_TRUE(PollUntil([&] { return Counter(d, [](auto& s) { return s.leases; }) == 0; }, 3000));
  std::vector<std::vector<std::byte>> buf(4,
                                          std::vector<std::byte>(SmallLayout().bytes_per_block()));
  std::vector<MutableBlock> dst(buf.begin(), buf.end());
  auto ld = (*c)->Load(*lr, dst);
  ASSERT_TRUE(ld.ok());
  EXPECT_EQ(ld->loaded_blocks, 0u);  // an expired lease delivers nothing
  EXPECT_EQ((*c)->client_stats().expired_loads, 1u);
}

// Eight processes share three prefixes of random lengths through a small arena (evictions);
// every block any of them loads must be the bytes its key names.
TEST_F(ServeTest, EightProcessesOverlappingPrefixesByteForByte) {
  Daemon d(dir_.path(), Config(48));  // 4 prefixes of up to 24 blocks: evictions
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  std::vector<pid_t> kids;
  for (int p = 0; p < 8; ++p) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      int code = 0;
      {
        auto c = Client::Open(Opts(d));
        if (!c.ok() || !(*c)->connected()) _exit(3);
        std::mt19937 rng(p);
        int loaded = 0;
        for (int it = 0; it < 60 && code == 0; ++it) {
          const uint32_t base = 1000 * (rng() % 4);
          const uint32_t n = 1 + rng() % 24;
          const int hit = LoadChain(**c, base, n);
          if (hit < 0) code = 1;
          loaded += std::max(hit, 0);
          if (code == 0 && static_cast<uint32_t>(hit) < n) {
            StoreResult s = StoreChain(**c, base, n, static_cast<uint32_t>(hit));
            if (!s.first_error.ok() && s.first_error.code() != StatusCode::kResourceExhausted)
              code = 2;
          }
        }
        if (code == 0 && loaded == 0) code = 4;  // nothing ever hit: the test proved nothing
      }
      _exit(code);
    }
    kids.push_back(pid);
  }
  for (pid_t k : kids) {
    int st = 0;
    ASSERT_EQ(waitpid(k, &st, 0), k);
    ASSERT_TRUE(WIFEXITED(st));
    EXPECT_EQ(WEXITSTATUS(st), 0) << "1 = a loaded block differed from its key's bytes";
  }
  auto st = StatusOf(d);
  ASSERT_TRUE(st.ok());
  EXPECT_GT(st->cache.tiers[0].evictions, 0u);
  EXPECT_EQ(st->leases, 0u);
  EXPECT_EQ(st->reservations, 0u);
}

// A client killed between reserve and commit: its slots come back, nothing it half wrote is
// ever served.
TEST_F(ServeTest, ClientKilledMidStoreLeavesNothingBehind) {
  Daemon d(dir_.path(), Config(32));
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  auto before = StatusOf(d);
  ASSERT_TRUE(before.ok());
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t kid = fork();
  ASSERT_GE(kid, 0);
  if (kid == 0) {
    Raw raw(d.socket());
    int arena_fd = -1;
    if (!raw.Hello(serve::kProtocolVersion, &arena_fd).ok() || arena_fd < 0) _exit(1);
    const KvLayout l = SmallLayout();
    Namespace ns{"test", "", l.fingerprint(), "", ""};
    std::vector<BlockKey> keys;
    HashPrefix(ns.Root(), l.block_tokens, Tokens(16 * l.block_tokens, 55), &keys);
    serve::ReserveReq rq;
    rq.keys = keys;
    serve::Writer w;
    w.Begin(static_cast<uint16_t>(MsgType::kReserve), 0, 2);
    serve::EncodeReserve(rq, &w);
    std::vector<std::byte> p;
    if (!raw.Send(w.Finish()) || !raw.Reply(&p).ok()) _exit(2);
    serve::Reader r(p);
    serve::ReserveReply rr;
    if (!serve::DecodeReserveReply(&r, &rr).ok() || rr.reservation_id == 0) _exit(3);
    struct stat sb;
    fstat(arena_fd, &sb);
    auto* base = static_cast<std::byte*>(
        mmap(nullptr, sb.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, arena_fd, 0));
    // Half of the blocks written, half of one more: then wait to be killed.
    for (int i = 0; i < 8; ++i) std::memset(base + rr.offsets[i], 0xAB, l.bytes_per_block());
    std::memset(base + rr.offsets[8], 0xAB, l.bytes_per_block() / 2);
    (void)!write(ready[1], "r", 1);
    pause();
    _exit(0);
  }
  char ch;
  ASSERT_EQ(read(ready[0], &ch, 1), 1);
  EXPECT_TRUE(
      PollUntil([&] { return Counter(d, [](auto& s) { return s.reservations; }) == 1; }, 2000));
  kill(kid, SIGKILL);
  int st = 0;
  waitpid(kid, &st, 0);
  EXPECT_TRUE(PollUntil(
      [&] {
        auto s = StatusOf(d);
        return s.ok() && s->reservations == 0 && s->clients == 1;  // StatusOf's own connection
      },
      3000));
  auto c = Client::Open(Opts(d));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(LoadChain(**c, 55, 16), 0);  // nothing of the dead client's store is visible
  auto after = StatusOf(d);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->cache.tiers[0].tier.used_bytes, before->cache.tiers[0].tier.used_bytes);
  // Every slot is free again: the whole arena takes a fresh chain.
  StoreResult s = StoreChain(**c, 56, 32);
  EXPECT_EQ(s.stored_blocks, 32u);
  EXPECT_EQ(LoadChain(**c, 56, 32), 32);
}

// Waits until the daemon's SSD tier (tiers[1]) has taken n blocks: it is written in the
// background after a Store returns.
void WaitForSsdPuts(const Daemon& d, uint64_t n) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  for (;;) {
    auto st = StatusOf(d);
    ASSERT_TRUE(st.ok());
    if (st->cache.tiers[1].tier.puts >= n) return;
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "the SSD never got the blocks";
    std::this_thread::yield();
  }
}

// Page-sized blocks: the SSD copy is written from the pinned arena slot as it is (no copy out
// of the arena, no bounce buffer); after a restart every block comes back from SSD intact.
TEST_F(ServeTest, WriteThroughFromTheArenaSlotIsByteExactAfterARestart) {
  const KvLayout l = Layout16KiB();
  const std::string disk = dir_.path() + "/ssd";
  Daemon d(dir_.path(), Config(64, disk, "", 30000, l));
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  auto c = Client::Open(Opts(d, "", "", l));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(StoreChain(**c, 5, 12).stored_blocks, 12u);
  WaitForSsdPuts(d, 12);
  if (HasFatalFailure()) return;
  ASSERT_EQ(d.Signal(SIGKILL), 128 + SIGKILL);
  EXPECT_EQ(LoadChain(**c, 5, 12), 0);  // a miss: the client sees the daemon gone
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  ASSERT_TRUE((*c)->WaitConnected(5000).ok());
  EXPECT_EQ(LoadChain(**c, 5, 12), 12) << d.Log();  // -1: a block that differs
  auto st = StatusOf(d);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->cache.tiers[1].hit_blocks, 12u);
}

TEST_F(ServeTest, DaemonKilledClientsMissThenReconnectAndSsdBlocksServeAgain) {
  const std::string disk = dir_.path() + "/ssd";
  Daemon d(dir_.path(), Config(64, disk));
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  auto c = Client::Open(Opts(d));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(StoreChain(**c, 9, 12).stored_blocks, 12u);
  EXPECT_EQ(LoadChain(**c, 9, 12), 12);
  // Kill the daemon only once the SSD has the chain (a kill before that loses those SSD
  // copies, like the host's).
  WaitForSsdPuts(d, 12);
  if (HasFatalFailure()) return;
  ASSERT_EQ(d.Signal(SIGKILL), 128 + SIGKILL);
  // Misses, within the deadline, never a hang.
  for (int i = 0; i < 3; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(LoadChain(**c, 9, 12), 0);
    const StoreResult s = StoreChain(**c, 10, 4);
    EXPECT_EQ(s.failed_blocks, 4u);
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(1500));
  }
  EXPECT_EQ((*c)->client_stats().dropped_stores, 3u);
  EXPECT_FALSE((*c)->connected());
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  ASSERT_TRUE((*c)->WaitConnected(5000).ok());
  // The restarted daemon reopened the SSD tier: a prefetch stages the first 6 blocks into the
  // arena, then the whole chain comes back through it.
  auto staged = (*c)->Prefetch(Tokens(6 * SmallLayout().block_tokens, 9));
  ASSERT_TRUE(staged.ok());
  EXPECT_EQ(*staged, 6u);
  auto lr = (*c)->Lookup(Tokens(12 * SmallLayout().block_tokens, 9));
  ASSERT_TRUE(lr.ok());
  EXPECT_EQ(lr->blocks_by_tier[0], 6u);  // prefetched: now in the host arena
  EXPECT_EQ(lr->blocks_by_tier[1], 6u);  // still on SSD: staged by Load
  lr->pins.Release();
  EXPECT_EQ(LoadChain(**c, 9, 12), 12);
  auto st = StatusOf(d);
  ASSERT_TRUE(st.ok());
  EXPECT_GE(st->cache.tiers[1].hit_blocks, 12u);
}

TEST_F(ServeTest, DaemonStoppedClientsTimeOutAndGoOn) {
  Daemon d(dir_.path(), Config(64));
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  ClientOptions o = Opts(d);
  o.timeout_ms = 300;
  auto c = Client::Open(o);
  ASSERT_TRUE(c.ok());
  StoreChain(**c, 3, 4);
  ASSERT_EQ(LoadChain(**c, 3, 4), 4);
  kill(d.pid(), SIGSTOP);
  ASSERT_TRUE(d.WaitStopped(5000));
  // Two seconds stopped: every call returns a miss within its deadline (the background
  // reconnects time out too, without holding calls up).
  const auto stopped = std::chrono::steady_clock::now();
  int calls = 0;
  while (std::chrono::steady_clock::now() - stopped < std::chrono::seconds(2)) {
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(LoadChain(**c, 3, 4), 0);
    EXPECT_EQ(StoreChain(**c, 33, 2).failed_blocks, 2u);
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(1000));
    ++calls;
  }
  EXPECT_GT(calls, 10);
  EXPECT_GE((*c)->client_stats().timeouts, 1u);
  EXPECT_FALSE((*c)->connected());
  kill(d.pid(), SIGCONT);
  ASSERT_TRUE((*c)->WaitConnected(5000).ok());
  EXPECT_EQ(LoadChain(**c, 3, 4), 4);
}

TEST_F(ServeTest, GarbageAndTruncatedFramesDisconnectOnlyThatClient) {
  Daemon d(dir_.path(), Config(64));
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  auto good = Client::Open(Opts(d));
  ASSERT_TRUE(good.ok());
  StoreChain(**good, 4, 4);
  {
    Raw raw(d.socket());
    std::vector<std::byte> junk(64, std::byte{0x5a});
    ASSERT_TRUE(raw.Send(junk));
    EXPECT_TRUE(raw.Closed());
    EXPECT_TRUE(d.WaitForLog("disconnecting: bad frame magic", 2000)) << d.Log();
  }
  {
    Raw raw(d.socket());
    ASSERT_TRUE(raw.Hello().ok());
    serve::Writer w;
    w.Begin(static_cast<uint16_t>(MsgType::kLookup), 0, 2);
    for (int i = 0; i < 100; ++i) w.U8(0);
    auto frame = w.Finish();
    ASSERT_TRUE(raw.Send(frame.first(serve::kHeaderBytes + 10)));
    shutdown(raw.fd, SHUT_WR);
    EXPECT_TRUE(raw.Closed());
    EXPECT_TRUE(d.WaitForLog("mid-frame", 2000)) << d.Log();
  }
  {
    Raw raw(d.socket());
    ASSERT_TRUE(raw.Hello().ok());
    serve::Writer w;
    w.Begin(static_cast<uint16_t>(MsgType::kLookup), 0, 2);
    w.U32(1000);  // a tenant string longer than the frame
    ASSERT_TRUE(raw.Send(w.Finish()));
    EXPECT_TRUE(raw.Closed());
    EXPECT_TRUE(d.WaitForLog("lookup: truncated or malformed payload", 2000)) << d.Log();
  }
  EXPECT_EQ(LoadChain(**good, 4, 4), 4);  // the others are unaffected
  EXPECT_EQ((*good)->client_stats().disconnects, 0u);
  auto st = StatusOf(d);
  ASSERT_TRUE(st.ok());
  EXPECT_GE(st->disconnects, 3u);
}

TEST_F(ServeTest, ProtocolVersionMismatchNamesBothVersions) {
  Daemon d(dir_.path(), Config(64));
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  Raw raw(d.socket());
  Status s = raw.Hello(99);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("version 99"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("version " + std::to_string(serve::kProtocolVersion)),
            std::string::npos)
      << s.message();
  EXPECT_TRUE(raw.Closed());
}

TEST(ServeProtocolTest, StatsReplyWithAnUnknownTierKindIsRefusedNamingIt) {
  CacheStats s;
  s.tiers.resize(1);
  s.tiers[0].name = "dram";
  s.tiers[0].kind = TierKind::kRemote;
  serve::Writer w;
  serve::EncodeStatsReply(s, ServeCounters{}, &w);
  std::vector<std::byte> bytes = w.buffer();
  // The reply without tiers (its fields and the tier count), then the tier's name: the kind
  // byte follows.
  serve::Writer empty;
  serve::EncodeStatsReply(CacheStats{}, ServeCounters{}, &empty);
  const size_t kind_at = empty.buffer().size() + 4 + s.tiers[0].name.size();
  ASSERT_EQ(bytes.at(kind_at), std::byte{static_cast<uint8_t>(TierKind::kRemote)});
  {
    serve::Reader r(bytes);
    CacheStats out;
    ServeCounters c;
    ASSERT_TRUE(serve::DecodeStatsReply(&r, &out, &c).ok());
    EXPECT_EQ(out.tiers.at(0).kind, TierKind::kRemote);
  }
  bytes[kind_at] = std::byte{kNumTierKinds};
  serve::Reader r(bytes);
  CacheStats out;
  ServeCounters c;
  Status st = serve::DecodeStatsReply(&r, &out, &c);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("tier 'dram' has unknown kind " + std::to_string(kNumTierKinds)),
            std::string::npos)
      << st.message();
}

TEST_F(ServeTest, LayoutMismatchIsRefusedNamingBoth) {
  Daemon d(dir_.path(), Config(64));
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  ClientOptions o = Opts(d);
  o.layout = SmallLayout(8);
  auto c = Client::Open(o);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find(SmallLayout(8).ToString()), std::string::npos);
  EXPECT_NE(c.status().message().find(SmallLayout().ToString()), std::string::npos);
}

TEST_F(ServeTest, TenantBoundToTokenOrUidCannotBeReadByDeclaringItsName) {
  const std::string tenants =
      "  tenants:\n    - {name: A, token: ta}\n    - {name: B, token: tb}\n"
      "    - {name: C, uids: [" +
      std::to_string(getuid() + 1) + "]}\n";
  Daemon d(dir_.path(), Config(64, "", tenants));
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  auto b = Client::Open(Opts(d, "B", "tb"));
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(StoreChain(**b, 5, 6).stored_blocks, 6u);
  EXPECT_EQ(LoadChain(**b, 5, 6), 6);
  // Declaring B without B's token, or with A's: refused.
  auto a_as_b = Client::Open(Opts(d, "B", "ta"));
  ASSERT_FALSE(a_as_b.ok());
  EXPECT_NE(a_as_b.status().message().find("tenant 'B'"), std::string::npos);
  EXPECT_FALSE(Client::Open(Opts(d, "C", "")).ok());  // bound to another uid
  auto a = Client::Open(Opts(d, "A", "ta"));
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(LoadChain(**a, 5, 6), 0);
  // A request naming B: refused.
  RequestOptions rq;
  rq.tenant = "B";
  EXPECT_FALSE((*a)->Lookup(Tokens(24, 5), rq).ok());
  // B's own key chain, hashed under B's root, sent by A: still A's namespace, no hits.
  std::vector<BlockKey> bkeys;
  HashPrefix((*b)->Root(), SmallLayout().block_tokens, Tokens(24, 5), &bkeys);
  auto lr = (*a)->LookupKeys(bkeys);
  ASSERT_TRUE(lr.ok());
  EXPECT_EQ(lr->hit_blocks, 0u);
}

TEST_F(ServeTest, SigtermDrainsAndExitsZeroSighupReloads) {
  Daemon d(dir_.path(), Config(64));
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  auto c = Client::Open(Opts(d));
  ASSERT_TRUE(c.ok());
  StoreChain(**c, 1, 3);
  std::ofstream(d.config()) << Config(128);  // a new size: applies at restart only
  kill(d.pid(), SIGHUP);
  EXPECT_TRUE(d.WaitForLog("SIGHUP: reloaded", 3000)) << d.Log();
  EXPECT_EQ(d.Signal(SIGTERM), 0) << d.Log();
  struct stat sb;
  EXPECT_NE(stat(d.socket().c_str(), &sb), 0);  // the socket is gone
  EXPECT_EQ(LoadChain(**c, 1, 3), 0);
}

TEST_F(ServeTest, SocketIsGroupOnly) {
  Daemon d(dir_.path(), Config(64));
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  struct stat sb;
  ASSERT_EQ(stat(d.socket().c_str(), &sb), 0);
  EXPECT_EQ(sb.st_mode & 0777, 0660u);
}

// One message of the daemon's KV events (vLLM's format, doc/events.md): its seq, and each
// block hash it names with its event's type, in order. False on timeout.
bool ReceiveEvents(zmq::socket_t& sub, uint64_t* seq,
                   std::vector<std::pair<std::string, BlockKey>>* out) {
  std::vector<zmq::message_t> parts;
  if (!zmq::recv_multipart(sub, std::back_inserter(parts))) return false;
  WireBatch b;
  EXPECT_EQ(parts.size(), 3u);
  EXPECT_TRUE(DecodeBatch(parts[2].to_string(), &b));
  EXPECT_EQ(parts[0].to_string(), "@kvtier-keys");  // vLLM's default topic "" + kvtier's suffix
  *seq = 0;
  for (int i = 0; i < 8; ++i) *seq = *seq << 8 | parts[1].data<uint8_t>()[i];
  for (const WireEvent& e : b.events) {
    for (const std::string& h : e.hashes) {
      EXPECT_EQ(h.size(), 16u);
      BlockKey k;
      for (int i = 0; i < 8; ++i) {
        k.hi = k.hi << 8 | static_cast<uint8_t>(h[i]);
        k.lo = k.lo << 8 | static_cast<uint8_t>(h[8 + i]);
      }
      out->emplace_back(e.type, k);
    }
  }
  return true;
}

// What the log says after `prefix` up to the end of that token.
TEST_F(ServeTest, MetricsScrapedWithCurlAndEveryEventInOrder) {
  Daemon d(dir_.path(),
           Config(8, "", "  metrics_addr: 127.0.0.1:0\n  events_addr: tcp://127.0.0.1:*\n"));
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  ASSERT_TRUE(d.WaitForLog("metrics on http://", 2000));
  const std::string endpoint = LogValue(d.Log(), "KV events on ", " \n");
  const std::string port = LogValue(d.Log(), "metrics on http://127.0.0.1:", "/");
  ASSERT_FALSE(endpoint.empty()) << d.Log();
  ASSERT_FALSE(port.empty()) << d.Log();
  zmq::context_t ctx;
  zmq::socket_t sub(ctx, zmq::socket_type::sub);
  sub.set(zmq::sockopt::subscribe, "@kvtier-keys");
  sub.set(zmq::sockopt::rcvtimeo, 50);
  sub.connect(endpoint);
  auto c = Client::Open(Opts(d));
  ASSERT_TRUE(c.ok());
  struct Ev {
    uint64_t seq;
    std::string type;
    BlockKey key;
  };
  std::vector<Ev> got;
  uint64_t last_seq = 0;
  bool any = false;
  auto receive = [&] {
    uint64_t n = 0;
    std::vector<std::pair<std::string, BlockKey>> blocks;
    if (!ReceiveEvents(sub, &n, &blocks)) return false;
    if (any) {
      EXPECT_EQ(n, last_seq + 1) << "a gap or reorder";
    }
    any = true;
    last_seq = n;
    for (const auto& [type, key] : blocks) got.push_back(Ev{n, type, key});
    return !blocks.empty();
  };
  // ZeroMQ drops what is published before the subscription lands: store probes until one
  // arrives, then every later event must arrive.
  uint32_t probe = 0;
  ASSERT_TRUE(PollUntil(
      [&] {
        StoreChain(**c, 5000 + probe++, 1);
        return receive();
      },
      5000));
  // 20 blocks through an 8-block arena (stores and evictions), then a flush (removals): five
  // chains of 4, as one chain of 20 would be refused past the arena's 8 blocks.
  const uint32_t n = 20;
  for (uint32_t k = 0; k < n / 4; ++k)  // each store evicts older ones
    EXPECT_EQ(StoreChain(**c, 77 + k, 4).stored_blocks, 4u);
  ASSERT_TRUE((*c)->DropAll().ok());
  std::vector<BlockKey> keys;
  const BlockKey root = (*c)->Root();
  for (uint32_t k = 0; k < n / 4; ++k) {
    std::vector<BlockKey> chain;
    HashPrefix(root, SmallLayout().block_tokens, Tokens(4 * SmallLayout().block_tokens, 77 + k),
               &chain);
    keys.insert(keys.end(), chain.begin(), chain.end());
  }
  std::map<BlockKey, std::string> state;  // internal key -> last event
  auto all_removed = [&] {
    for (const BlockKey& k : keys) {
      auto it = state.find(DaemonKey(k, ""));
      if (it == state.end() || it->second != "BlockRemoved") return false;
    }
    return true;
  };
  size_t seen = 0;
  ASSERT_TRUE(PollUntil(
      [&] {
        while (receive()) {
        }
        for (; seen < got.size(); ++seen) {
          // A block is stored before it is removed, and not stored twice while resident.
          std::string& last = state[got[seen].key];
          EXPECT_NE(last, got[seen].type) << got[seen].type << " twice for one block";
          last = got[seen].type;
        }
        return all_removed();
      },
      5000));
  // Every one of the 20 was stored (seen as stored before its removal).
  EXPECT_GE(got.size(), 2 * n);

  // /metrics with curl, parsed.
  FILE* f = popen(("curl -s --max-time 5 http://127.0.0.1:" + port + "/metrics").c_str(), "r");
  ASSERT_NE(f, nullptr);
  std::string text;
  char buf[4096];
  for (size_t r; (r = fread(buf, 1, sizeof(buf), f)) > 0;) text.append(buf, r);
  ASSERT_EQ(pclose(f), 0);
  std::map<std::string, double> metrics;
  std::set<std::string> types;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("# TYPE ", 0) == 0) {  // each metric declared once, or scrapers refuse it
      const std::string name = line.substr(7, line.find(' ', 7) - 7);
      EXPECT_TRUE(types.insert(name).second) << name << " declared twice";
    }
    if (line.empty() || line[0] == '#') continue;
    const auto sp = line.rfind(' ');
    ASSERT_NE(sp, std::string::npos) << line;
    metrics[line.substr(0, sp)] = std::stod(line.substr(sp + 1));
  }
  EXPECT_GE(metrics["kvtier_stored_blocks_total"], n);
  EXPECT_GT(metrics["kvtier_tier_evictions_total{tier=\"host\"}"], 0);
  EXPECT_GE(metrics["kvtier_serve_clients"], 1);
  EXPECT_EQ(metrics.count("kvtier_serve_leases"), 1u);
  // Per tenant (every block was removed above: none held now), and checksum failures.
  EXPECT_EQ(metrics.count("kvtier_serve_tenant_arena_blocks{tenant=\"" + UidTenant("") + "\"}"),
            1u);
  EXPECT_EQ(metrics.count("kvtier_serve_corrupt_blocks_total"), 1u);
}

// A router that binds (the daemon connects, as llm-d expects) sees the daemon's stores with the
// configured medium; after a restart the daemon announces AllBlocksCleared, then every block its
// SSD recovered (read back through the replay socket, from seq 0).
TEST_F(ServeTest, RestartAnnouncesAClearThenTheSsdBlocksToABindingRouter) {
  EventSubscriber router("tcp://127.0.0.1:*", /*bind=*/true, "@kvtier-keys");
  Daemon d(dir_.path(), Config(64, dir_.path() + "/ssd",
                               "  events_addr: " + router.endpoint() +
                                   "\n  events_replay_addr: tcp://127.0.0.1:*\n"
                                   "  events_media: {disk: SSD}\n"));
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  auto c = Client::Open(Opts(d));
  ASSERT_TRUE(c.ok());
  std::set<std::string> want;
  std::vector<BlockKey> keys;
  HashPrefix((*c)->Root(), SmallLayout().block_tokens, Tokens(6 * SmallLayout().block_tokens, 4),
             &keys);
  for (const BlockKey& k : keys) want.insert(events::KeyBytes(DaemonKey(k, "")));
  auto stored_in = [](const std::vector<WireBatch>& batches, size_t from, const char* medium) {
    std::set<std::string> got;
    for (size_t i = from; i < batches.size(); ++i)
      for (const WireEvent& e : batches[i].events)
        if (e.type == "BlockStored" && e.medium == medium)
          got.insert(e.hashes.begin(), e.hashes.end());
    return got;
  };
  // Live, through the connection the daemon made: stored on SSD as "SSD" (a store before the
  // connection is up may be lost, as with vLLM: keep storing new chains until one shows).
  std::vector<WireBatch> live;
  ASSERT_TRUE(PollUntil(
      [&, probe = 0]() mutable {
        StoreChain(**c, 7000 + probe++, 1);
        WireBatch b;
        while (router.Next(&b, 20)) live.push_back(b);
        return !stored_in(live, 0, "SSD").empty();
      },
      5000));
  ASSERT_EQ(StoreChain(**c, 4, 6).stored_blocks, 6u);
  WaitForSsdPuts(d, 6);
  if (HasFatalFailure()) return;
  ASSERT_EQ(d.Signal(SIGTERM), 0) << d.Log();
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  ASSERT_TRUE(d.WaitForLog("KV event replay on ", 2000)) << d.Log();
  const std::string replay = LogValue(d.Log(), "KV event replay on ", " \n");
  ASSERT_FALSE(replay.empty()) << d.Log();
  std::vector<WireBatch> batches;
  ASSERT_TRUE(PollUntil(
      [&] {
        batches.clear();
        if (!Replay(replay, 0, &batches)) return false;
        const std::set<std::string> got = stored_in(batches, 0, "SSD");
        return std::includes(got.begin(), got.end(), want.begin(), want.end());
      },
      5000));
  // The topic "" carries only the start's clear (no engine hashes yet); kvtier's keys follow it.
  size_t first_keys = 0;
  while (first_keys < batches.size() && batches[first_keys].topic != "@kvtier-keys") ++first_keys;
  ASSERT_LT(first_keys, batches.size());
  EXPECT_EQ(batches[first_keys].seq, 0u);
  EXPECT_EQ(batches[first_keys].events[0].type, "AllBlocksCleared");
  const std::set<std::string> recovered = stored_in(batches, first_keys, "SSD");
  EXPECT_TRUE(std::includes(recovered.begin(), recovered.end(), want.begin(), want.end()));
}

// Runs the real CLI; returns its exit status and puts its stdout in *out.
int RunCli(const std::string& args, std::string* out) {
  FILE* f = popen((std::string(KVTIER_CLI_PATH) + " " + args + " 2>&1").c_str(), "r");
  if (!f) return -1;
  char buf[4096];
  for (size_t r; (r = fread(buf, 1, sizeof(buf), f)) > 0;) out->append(buf, r);
  const int st = pclose(f);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

// `kvtier drop --tenant A` drops A's blocks from the arena and the SSD with a removal event
// each, keeps a block a lease pins (and says so), and leaves tenant B's blocks, stored under
// the very same token ids, alone.
TEST_F(ServeTest, DropTenantDropsOnlyThatTenantFromEveryTier) {
  Daemon d(dir_.path(), Config(64, dir_.path() + "/ssd", "  events_addr: tcp://127.0.0.1:*\n"));
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  ASSERT_TRUE(d.WaitForLog("KV events on ", 2000));  // logged once the socket is up
  const std::string endpoint = LogValue(d.Log(), "KV events on ", " \n");
  ASSERT_FALSE(endpoint.empty()) << d.Log();
  zmq::context_t ctx;
  zmq::socket_t sub(ctx, zmq::socket_type::sub);
  sub.set(zmq::sockopt::subscribe, "@kvtier-keys");
  sub.set(zmq::sockopt::rcvtimeo, 50);
  sub.connect(endpoint);
  std::map<BlockKey, int> removed;  // internal key -> blocks named by BlockRemoved events
  auto receive = [&] {
    uint64_t seq = 0;
    std::vector<std::pair<std::string, BlockKey>> blocks;
    if (!ReceiveEvents(sub, &seq, &blocks)) return false;
    for (const auto& [type, key] : blocks)
      if (type == "BlockRemoved") ++removed[key];
    return true;
  };
  auto a = Client::Open(Opts(d, "A"));
  auto b = Client::Open(Opts(d, "B"));
  ASSERT_TRUE(a.ok() && b.ok());
  // Events published before the subscription lands are lost: probe until one arrives.
  uint32_t probe = 0;
  ASSERT_TRUE(PollUntil(
      [&] {
        StoreChain(**b, 9000 + probe++, 1);
        return receive();
      },
      5000));
  ASSERT_EQ(StoreChain(**a, 3, 6).stored_blocks, 6u);
  ASSERT_EQ(StoreChain(**b, 3, 6).stored_blocks, 6u);
  auto lease = (*a)->Lookup(Tokens(2 * SmallLayout().block_tokens, 3));
  ASSERT_TRUE(lease.ok());
  ASSERT_EQ(lease->hit_blocks, 2u);

  std::string out;
  ASSERT_EQ(RunCli("drop --tenant A --socket " + d.socket(), &out), 0) << out;
  EXPECT_NE(out.find("dropped 6 blocks of tenant 'A'; 2 pinned"), std::string::npos) << out;
  lease->pins.Release();
  EXPECT_EQ(LoadChain(**a, 3, 6), 2);  // the pinned two stayed in the arena (not on SSD)
  ASSERT_TRUE((*a)->Ping().ok());      // the daemon has taken the one-way releases before it
  out.clear();
  ASSERT_EQ(RunCli("drop --tenant A --socket " + d.socket(), &out), 0) << out;
  EXPECT_NE(out.find("dropped 2 blocks of tenant 'A'\n"), std::string::npos) << out;
  EXPECT_EQ(LoadChain(**a, 3, 6), 0);
  EXPECT_EQ(LoadChain(**b, 3, 6), 6);

  // A removal event per tier for each of A's blocks (arena and SSD), none for B's.
  std::vector<BlockKey> keys;
  HashPrefix((*a)->Root(), SmallLayout().block_tokens, Tokens(6 * SmallLayout().block_tokens, 3),
             &keys);
  auto all_seen = [&] {
    for (const BlockKey& k : keys)
      if (removed[DaemonKey(k, "A")] < 2) return false;
    return true;
  };
  EXPECT_TRUE(PollUntil(
      [&] {
        while (receive()) {
        }
        return all_seen();
      },
      5000));
  for (const BlockKey& k : keys) EXPECT_EQ(removed[DaemonKey(k, "A")], 2);
  keys.clear();
  HashPrefix((*b)->Root(), SmallLayout().block_tokens, Tokens(6 * SmallLayout().block_tokens, 3),
             &keys);
  for (const BlockKey& k : keys) EXPECT_EQ(removed.count(DaemonKey(k, "B")), 0u);
}

}  // namespace
}  // namespace kvtier::testing

namespace kvtier::testing {
namespace {

// Stores through the daemon carry their session, and session events reach the policy: a
// finished session's blocks go first, though another session's are older (LRU would take
// those).
TEST_F(ServeTest, StoresCarryTheirSessionAndFinishedSessionsAreEvictedFirst) {
  std::string y = Config(16);
  const std::string tier = "params: {prefault: false}}";
  y.replace(y.find(tier), tier.size(), "eviction: session, " + tier);
  Daemon d(dir_.path(), y);
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  auto c = Client::Open(Opts(d));
  ASSERT_TRUE(c.ok());
  RequestOptions s7, s9, s11;
  s7.session_id = 7;
  s9.session_id = 9;
  s11.session_id = 11;
  ASSERT_EQ(StoreChain(**c, 1, 8, 0, s7).stored_blocks, 8u);  // older
  ASSERT_EQ(StoreChain(**c, 2, 8, 0, s9).stored_blocks, 8u);  // newer: the arena is full
  (*c)->NotifySession(7, SessionEvent::kThinking);
  (*c)->NotifySession(9, SessionEvent::kFinished);
  ASSERT_EQ(StoreChain(**c, 3, 4, 0, s11).stored_blocks, 4u);
  EXPECT_EQ(LoadChain(**c, 1, 8, s7), 8);  // the thinking session kept its blocks
  EXPECT_LT(LoadChain(**c, 2, 8, s9), 8);
}

}  // namespace
}  // namespace kvtier::testing
