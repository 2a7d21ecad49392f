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

// The events of one topic (the key topic by default) from seq 0, once `done` holds for them
// (or after 5 s).
std::vector<WireEvent> ReplayUntil(const Cache& c,
                                   const std::function<bool(const std::vector<WireEvent>&)>& done,
                                   bool engine_topic = false) {
  const KvEventsInfo info = c.events_info();
  const std::string& topic = engine_topic ? info.topic : info.keys_topic;
  std::vector<WireEvent> events;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < end) {
    std::vector<WireBatch> batches;
    events.clear();
    if (testing::Replay(info.replay_endpoint, 0, &batches)) {
      uint64_t want = 0;
      for (const WireBatch& b : batches) {
        if (b.topic != topic) continue;
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

// Two engine blocks of 8 tokens per kvtier block of 16, each hash 32 bytes, as vLLM's.
std::vector<EngineBlockHashes> EngineHashesFor(const testing::StoredRequest& r) {
  std::vector<EngineBlockHashes> out;
  std::string prev;
  for (size_t b = 0; b < r.keys.size(); ++b) {
    EngineBlockHashes e;
    for (int j = 0; j < 2; ++j)
      e.hashes.push_back(std::string(24, 'h') +
                         events::KeyBytes(BlockKey{b * 2 + j + 1, 77}).substr(0, 8));
    e.parent_hash = prev;
    prev = e.hashes.back();
    e.token_ids.assign(r.tokens.begin() + b * 16, r.tokens.begin() + (b + 1) * 16);
    out.push_back(std::move(e));
  }
  return out;
}

// Engine hashes announced stored in `medium` by events [from, to), as vLLM's ints.
std::set<uint64_t> StoredInts(const std::vector<WireEvent>& ev, size_t from, size_t to,
                              const std::string& medium, const std::string& type = "BlockStored") {
  std::set<uint64_t> out;
  for (size_t i = from; i < to && i < ev.size(); ++i)
    if (ev[i].type == type && ev[i].medium == medium)
      out.insert(ev[i].int_hashes.begin(), ev[i].int_hashes.end());
  return out;
}

std::set<uint64_t> IntsOf(const std::vector<EngineBlockHashes>& hashes) {
  std::set<uint64_t> out;
  for (const EngineBlockHashes& e : hashes)
    for (const std::string& h : e.hashes) out.insert(events::EngineHashInt(h));
  return out;
}

TEST(CacheEventsTest, EngineHashesAreAnnouncedInsteadOfKeysUntilTheBlockLeavesEveryTier) {
  testing::TempDir dir;
  auto c = Cache::Open(Options(dir.path(), true));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE((*c)->WantsEngineHashes());
  testing::StoredRequest r(**c, kBlocks, 7);
  const std::vector<EngineBlockHashes> engine = EngineHashesFor(r);
  RequestOptions req;
  req.engine_hashes = std::span<const EngineBlockHashes>(engine).subspan(0, 2);
  EXPECT_EQ((*c)->Store(r.tokens, r.views, 0, req).status().code(),
            StatusCode::kInvalidArgument);  // two entries for six blocks
  req.engine_hashes = engine;
  auto s = (*c)->Store(r.tokens, r.views, 0, req);
  ASSERT_TRUE(s.ok() && s->stored_blocks == kBlocks);
  EXPECT_EQ((*c)->events_info().engine_hash_blocks, kBlocks);
  const std::set<uint64_t> want = IntsOf(engine);

  auto ev = ReplayUntil(
      **c,
      [&](const std::vector<WireEvent>& e) {
        return StoredInts(e, 0, e.size(), "STORAGE") == want;
      },
      /*engine_topic=*/true);
  EXPECT_EQ(StoredInts(ev, 0, ev.size(), "CPU"), want);
  EXPECT_EQ(StoredInts(ev, 0, ev.size(), "STORAGE"), want);
  for (const WireEvent& e : ev) {
    if (e.type != "BlockStored") continue;
    ASSERT_EQ(e.int_hashes.size(), 2u);
    EXPECT_EQ(e.block_size, 8u);  // the engine's block: 16 tokens / 2 hashes
    EXPECT_EQ(e.token_ids.size(), 16u);
    // Each block names the engine block before it (the first none).
    const size_t b = std::distance(
        engine.begin(), std::find_if(engine.begin(), engine.end(), [&](const EngineBlockHashes& h) {
          return events::EngineHashInt(h.hashes[0]) == e.int_hashes[0];
        }));
    ASSERT_LT(b, engine.size());
    if (b == 0) {
      EXPECT_FALSE(e.parent_is_int);
    } else {
      EXPECT_TRUE(e.parent_is_int);
      EXPECT_EQ(e.parent_int, events::EngineHashInt(engine[b - 1].hashes[1]));
    }
    EXPECT_EQ(e.token_ids.front(), r.tokens[b * 16]);
  }
  // None of these blocks is announced by kvtier's key.
  auto keys_ev = ReplayUntil(**c, [](const std::vector<WireEvent>&) { return true; });
  EXPECT_TRUE(Stored(keys_ev, 0, keys_ev.size(), "CPU").empty());

  // A flush of the host tier: cleared, then the disk's copies again, by the engine's hashes.
  EXPECT_EQ(CacheHooks::ClearManaged(**c), kBlocks);
  size_t clear = 0;
  ev = ReplayUntil(
      **c,
      [&](const std::vector<WireEvent>& e) {
        for (size_t i = 1; i < e.size(); ++i)
          if (e[i].type == "AllBlocksCleared") clear = i;
        return clear > 0 && StoredInts(e, clear, e.size(), "STORAGE") == want;
      },
      true);
  ASSERT_GT(clear, 0u);
  EXPECT_EQ(StoredInts(ev, clear, ev.size(), "STORAGE"), want);
  EXPECT_EQ(StoredInts(ev, 0, clear, "CPU", "BlockRemoved"), want);
  EXPECT_EQ((*c)->events_info().engine_hash_blocks, kBlocks);  // the disk still holds them

  // Gone from every tier: removed by the engine's hashes, and no longer kept.
  uint64_t pinned = 0;
  EXPECT_EQ(CacheHooks::DropMatching(
                **c, [](const BlockKey&) { return true; }, &pinned),
            kBlocks);
  ev = ReplayUntil(
      **c,
      [&](const std::vector<WireEvent>& e) {
        return StoredInts(e, clear, e.size(), "STORAGE", "BlockRemoved") == want;
      },
      true);
  EXPECT_EQ(StoredInts(ev, clear, ev.size(), "STORAGE", "BlockRemoved"), want);
  EXPECT_EQ((*c)->events_info().engine_hash_blocks, 0u);
}

TEST(CacheEventsTest, EngineHashesAreNotKeptWhenNothingListens) {
  testing::TempDir dir;
  auto c = Cache::Open(Options(dir.path(), false));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_FALSE((*c)->WantsEngineHashes());
  testing::StoredRequest r(**c, kBlocks, 7);
  const std::vector<EngineBlockHashes> engine = EngineHashesFor(r);
  RequestOptions req;
  req.engine_hashes = engine;
  auto s = (*c)->Store(r.tokens, r.views, 0, req);
  ASSERT_TRUE(s.ok() && s->stored_blocks == kBlocks);
  EXPECT_EQ((*c)->events_info().engine_hash_blocks, 0u);
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
