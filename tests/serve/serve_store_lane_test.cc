// An AsyncStore over a daemon's Client stores through a connection of its own (the store lane),
// so a lookup never queues behind a store its low-priority thread holds up: the lane is a
// second client of the daemon, its stores are what the first client's lookups find, and it
// closes with the queue.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
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

}  // namespace
}  // namespace kvtier::testing
