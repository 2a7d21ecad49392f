// The Cache's own KV-event publisher (CacheOptions::events): what an in-process engine's router
// sees, in vLLM's format, read back through the replay socket.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <set>
#include <thread>

#include "cache/cache_hooks.h"
#include "events/kv_event_codec.h"
#include "kvtier/cache.h"
#include "testing/kv_event_subscriber.h"
#include "testing/test_util.h"

namespace kvtier {
namespace {

using testing::WireBatch;
using testing::WireEvent;

constexpr uint32_t kBlocks = 6;

CacheOptions Options(const std::string& dir, bool events) {
  CacheOptions o;
  o.layout = testing::Layout16KiB();
  o.model_id = "events-test";
  o.write_queue_blocks = 0;  // every tier written before Store returns
  TierSpec host;
  host.kind = "host";
  host.capacity_bytes = 16 * o.layout.bytes_per_block();
  host.params = {{"prefault", "false"}, {"huge_pages", "false"}, {"pin", "false"}};
  TierSpec disk;
  disk.kind = "disk";
  disk.capacity_bytes = 4 << 20;
  disk.params = {{"path", dir + "/ssd"}, {"segment_bytes", "256KiB"}};
  o.tiers = {host, disk};
  if (events) {
    o.events.endpoint = "tcp://127.0.0.1:*";
    o.events.replay_endpoint = "tcp://127.0.0.1:*";
    o.events.batch_interval_ms = 1;
  }
  return o;
}

std::vector<BlockKey> StoreBlocks(Cache& c) {
  testing::StoredRequest r(c, kBlocks, 7);
  auto s = c.Store(r.tokens, r.views);
  EXPECT_TRUE(s.ok() && s->stored_blocks == kBlocks);
  return r.keys;
}

// The key topic's events from seq 0, once `done` holds for them (or after 5 s).
std::vector<WireEvent> ReplayUntil(const Cache& c,
                                   const std::function<bool(const std::vector<WireEvent>&)>& done) {
  const KvEventsInfo info = c.events_info();
  std::vector<WireEvent> events;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < end) {
    std::vector<WireBatch> batches;
    events.clear();
    if (testing::Replay(info.replay_endpoint, 0, &batches)) {
      uint64_t want = 0;
      for (const WireBatch& b : batches) {
        if (b.topic != info.keys_topic) continue;
        EXPECT_EQ(b.seq, want++);  // no gap
        events.insert(events.end(), b.events.begin(), b.events.end());
      }
      if (done(events)) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return events;
}

std::set<std::string> HashesOf(const std::vector<BlockKey>& keys) {
  std::set<std::string> out;
  for (const BlockKey& k : keys) out.insert(events::KeyBytes(k));
  return out;
}

// Hashes announced stored in `medium` by events [from, to).
std::set<std::string> Stored(const std::vector<WireEvent>& ev, size_t from, size_t to,
                             const std::string& medium) {
  std::set<std::string> out;
  for (size_t i = from; i < to && i < ev.size(); ++i)
    if (ev[i].type == "BlockStored" && ev[i].medium == medium)
      out.insert(ev[i].hashes.begin(), ev[i].hashes.end());
  return out;
}

TEST(CacheEventsTest, StoresAnnouncedPerMediumAndAFlushClearsThenReannounces) {
  testing::TempDir dir;
  auto c = Cache::Open(Options(dir.path(), true));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const std::vector<BlockKey> keys = StoreBlocks(**c);
  EXPECT_EQ(CacheHooks::ClearManaged(**c), kBlocks);  // the host tier; the disk keeps them
  size_t last_clear = 0;
  auto ev = ReplayUntil(**c, [&](const std::vector<WireEvent>& e) {
    for (size_t i = 1; i < e.size(); ++i)
      if (e[i].type == "AllBlocksCleared") last_clear = i;
    return last_clear > 0 && Stored(e, last_clear, e.size(), "STORAGE") == HashesOf(keys);
  });
  ASSERT_FALSE(ev.empty());
  EXPECT_EQ(ev[0].type, "AllBlocksCleared");  // at start
  ASSERT_GT(last_clear, 0u) << "no AllBlocksCleared after the flush";
  EXPECT_EQ(Stored(ev, 1, last_clear, "CPU"), HashesOf(keys));
  EXPECT_EQ(Stored(ev, 1, last_clear, "STORAGE"), HashesOf(keys));
  EXPECT_EQ(Stored(ev, last_clear, ev.size(), "STORAGE"), HashesOf(keys));
  EXPECT_TRUE(Stored(ev, last_clear, ev.size(), "CPU").empty());
  for (const WireEvent& e : ev) {
    if (e.type == "BlockStored") {
      EXPECT_EQ(e.block_size, testing::Layout16KiB().block_tokens);
    }
  }
}

TEST(CacheEventsTest, RestartAnnouncesTheBlocksTheDiskRecovered) {
  testing::TempDir dir;
  std::vector<BlockKey> keys;
  {
    auto c = Cache::Open(Options(dir.path(), false));
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    keys = StoreBlocks(**c);
  }
  auto c = Cache::Open(Options(dir.path(), true));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto ev = ReplayUntil(**c, [&](const std::vector<WireEvent>& e) {
    return Stored(e, 0, e.size(), "STORAGE") == HashesOf(keys);
  });
  ASSERT_FALSE(ev.empty());
  EXPECT_EQ(ev[0].type, "AllBlocksCleared");
  EXPECT_EQ(Stored(ev, 1, ev.size(), "STORAGE"), HashesOf(keys));
  // The recovered blocks are in the index now: a lookup finds them all on disk.
  testing::StoredRequest r(**c, kBlocks, 7);
  auto l = (*c)->Lookup(r.tokens);
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->hit_blocks, kBlocks);
  EXPECT_EQ((*c)->events_info().dropped, 0u);
}

TEST(CacheEventsTest, BadOptionsAreRefused) {
  testing::TempDir dir;
  CacheOptions o = Options(dir.path(), true);
  o.events.endpoint = "http://x";
  EXPECT_EQ(Cache::Open(o).status().code(), StatusCode::kInvalidArgument);
  o = Options(dir.path(), true);
  o.events.media = {"a", "b", "c"};
  EXPECT_EQ(Cache::Open(o).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvtier
