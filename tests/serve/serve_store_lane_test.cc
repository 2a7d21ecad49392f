// An AsyncStore over a daemon's Client stores through a connection of its own (the store lane),
// so a lookup never queues behind a store its low-priority thread holds up: the lane is a
// second client of the daemon, its stores are what the first client's lookups find, and it
// closes with the queue.
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "kvtier/async_store.h"
#include "kvtier/client.h"
#include "serve_util.h"
#include "testing/test_util.h"

namespace kvtier::testing {
namespace {

TEST(ServeStoreLaneTest, AsyncStoreStoresThroughItsOwnConnection) {
  TempDir dir;
  Daemon d(dir.path(), Config(64));
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  auto c = Client::Open(Opts(d));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto clients = [&] {
    auto st = (*c)->GetDaemonStatus();
    EXPECT_TRUE(st.ok()) << st.status().ToString();
    return st.ok() ? st->clients : 0;
  };
  // Connections the daemon has yet to see closed (the harness's readiness probe) go away.
  auto settles_at = [&](uint64_t want) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (clients() != want && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    return clients() == want;
  };
  const uint64_t before = 1;
  ASSERT_TRUE(settles_at(before)) << clients() << " clients, this one alone expected";
  const KvLayout& l = (*c)->layout();
  std::vector<BlockKey> keys;
  HashPrefix((*c)->Root(), l.block_tokens, Tokens(uint64_t{6} * l.block_tokens, 11), &keys);
  std::vector<std::vector<std::byte>> data;
  for (const BlockKey& k : keys) data.push_back(MakeBlock(l.bytes_per_block(), Seed(k)));
  {
    AsyncStoreOptions o;
    o.priority = AsyncStoreOptions::Priority::kInherit;
    AsyncStore saves(**c, o);
    EXPECT_EQ(clients(), before + 1) << "the queue's lane is a connection of its own";
    StoreJob job;
    job.keys = keys;
    job.blocks.assign(data.begin(), data.end());
    std::promise<uint32_t> stored;
    ASSERT_TRUE(saves.Submit({job}, [&](std::vector<Result<StoreResult>>& r) {
      stored.set_value(r.size() == 1 && r[0].ok() ? r[0]->stored_blocks : 0);
    }));
    auto f = stored.get_future();
    ASSERT_EQ(f.wait_for(std::chrono::seconds(30)), std::future_status::ready);
    EXPECT_EQ(f.get(), 6u);
    EXPECT_EQ(LoadChain(**c, 11, 6), 6) << "the lane's stores are the client's hits";
  }
  EXPECT_TRUE(settles_at(before)) << "the lane outlived its queue: " << clients() << " clients";
}

// Shared-memory pages mapped into this process (/proc/self/status RssShmem), in bytes.
uint64_t RssShmemBytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("RssShmem:", 0) == 0) return std::stoull(line.substr(9)) * 1024;
  return 0;
}

// serve.warm_ahead: the daemon claims untouched slots for a tenant and tells its clients, which
// fault them in on a thread of their own; the clients of a tenant in one process (an engine's
// own and its store lane) share one mapping, so either one's warming serves both.
TEST(ServeStoreLaneTest, ClientsOfATenantShareOneMappingWarmedAheadOfTheirStores) {
  TempDir dir;
  const KvLayout l = SmallLayout();
  const uint64_t ahead = 32, bb = l.bytes_per_block();
  // Shared-arena slots start on pages: the claim counts them.
  const auto page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t stride = (bb + page - 1) / page * page;
  Daemon d(dir.path(), Config(256, "", "  warm_ahead: " + std::to_string(ahead * stride) + "\n"));
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  const uint64_t shmem0 = RssShmemBytes();
  auto c = Client::Open(Opts(d));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto claimed = [&] {
    auto st = (*c)->GetDaemonStatus();
    EXPECT_TRUE(st.ok()) << st.status().ToString();
    return st.ok() ? st->warm_claimed_blocks : 0;
  };
  auto warmed = [](Client& x, uint64_t want) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (x.client_stats().warmed_bytes < want && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    return x.client_stats().warmed_bytes;
  };
  EXPECT_EQ(claimed(), ahead) << "hello claims serve.warm_ahead";
  EXPECT_GE(warmed(**c, ahead * stride), ahead * stride);
  EXPECT_GE(RssShmemBytes() - shmem0, ahead * stride) << "the warmed pages are not mapped here";
  auto c2 = Client::Open(Opts(d));
  ASSERT_TRUE(c2.ok()) << c2.status().ToString();
  EXPECT_EQ(claimed(), ahead) << "the tenant still has its claim: nothing more";
  // 20 stores leave 12 claimed slots, under half: the reserve's reply claims 20 more.
  EXPECT_EQ(StoreChain(**c2, 5, 20).stored_blocks, 20u);
  EXPECT_EQ(claimed(), ahead + 20);
  EXPECT_GE(warmed(**c2, 20 * stride), 20 * stride);
  const std::byte* at[2] = {nullptr, nullptr};
  std::vector<std::byte> scratch(bb);
  const MutableBlock one[] = {MutableBlock(scratch)};
  for (int i = 0; i < 2; ++i) {
    Client& x = i == 0 ? **c : **c2;
    auto lr = x.Lookup(Tokens(uint64_t{20} * l.block_tokens, 5));
    ASSERT_TRUE(lr.ok() && lr->hit_blocks == 20u);
    auto ld = x.LoadVisit(*lr, 0, 1, one, [&](uint32_t, ConstBlock b) { at[i] = b.data(); });
    ASSERT_TRUE(ld.ok() && ld->loaded_blocks == 1u);
  }
  EXPECT_EQ(at[0], at[1]) << "two mappings of one tenant's arena in one process";
}

TEST(ServeStoreLaneTest, WarmAheadZeroClaimsNothing) {
  TempDir dir;
  Daemon d(dir.path(), Config(64, "", "  warm_ahead: 0\n"));
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  auto c = Client::Open(Opts(d));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(StoreChain(**c, 5, 10).stored_blocks, 10u);
  auto st = (*c)->GetDaemonStatus();
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(st->warm_claimed_blocks, 0u);
  EXPECT_EQ((*c)->client_stats().warmed_bytes, 0u);
}

}  // namespace
}  // namespace kvtier::testing
