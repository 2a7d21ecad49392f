// The engine's own block hashes through the daemon (issue 29): a client's Store carries them
// (protocol 4, reserve), the daemon keeps them with the blocks, and its KV events name the
// blocks by them on the engine topic, as vLLM's router computes them from a request.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "events/kv_event_codec.h"
#include "serve_util.h"
#include "testing/kv_event_subscriber.h"

namespace kvtier::testing {
namespace {

// Two engine blocks per kvtier block, 32-byte hashes whose low 8 bytes differ per block.
std::vector<EngineBlockHashes> EngineHashes(const std::vector<TokenId>& tokens, uint32_t blocks,
                                            uint32_t block_tokens, char tag) {
  std::vector<EngineBlockHashes> out;
  std::string prev;
  for (uint32_t b = 0; b < blocks; ++b) {
    EngineBlockHashes e;
    for (uint32_t j = 0; j < 2; ++j)
      e.hashes.push_back(std::string(24, tag) +
                         events::KeyBytes(BlockKey{b * 2 + j + 1, 0}).substr(0, 8));
    e.parent_hash = prev;
    prev = e.hashes.back();
    e.token_ids.assign(tokens.begin() + b * block_tokens, tokens.begin() + (b + 1) * block_tokens);
    out.push_back(std::move(e));
  }
  return out;
}

std::set<uint64_t> Ints(const std::vector<EngineBlockHashes>& v) {
  std::set<uint64_t> out;
  for (const EngineBlockHashes& e : v)
    for (const std::string& h : e.hashes) out.insert(events::EngineHashInt(h));
  return out;
}

TEST(ServeEventsTest, EngineHashesTravelWithStoresAndNameTheBlocksInTheDaemonsEvents) {
  TempDir dir;
  Daemon d(dir.path(), Config(64, "",
                              "  events_addr: tcp://127.0.0.1:*\n"
                              "  events_replay_addr: tcp://127.0.0.1:*\n"));
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  ASSERT_TRUE(d.WaitForLog("KV event replay on ", 2000)) << d.Log();
  const std::string replay = LogValue(d.Log(), "KV event replay on ", " \n");
  auto c = Client::Open(Opts(d));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE((*c)->WantsEngineHashes());  // the daemon said so at hello

  const uint32_t bt = SmallLayout().block_tokens, n = 4;
  const std::vector<TokenId> tokens = Tokens(uint64_t{n} * bt, 11);
  std::vector<std::vector<std::byte>> data(n, MakeBlock(SmallLayout().bytes_per_block(), 5));
  std::vector<ConstBlock> blocks(data.begin(), data.end());
  const std::vector<EngineBlockHashes> engine = EngineHashes(tokens, n, bt, 'v');
  RequestOptions rq;
  rq.engine_hashes = std::span<const EngineBlockHashes>(engine).subspan(1);
  EXPECT_EQ((*c)->Store(tokens, blocks, 0, rq).status().code(), StatusCode::kInvalidArgument);
  rq.engine_hashes = engine;
  auto s = (*c)->Store(tokens, blocks, 0, rq);
  ASSERT_TRUE(s.ok() && s->stored_blocks == n) << s.status().ToString();

  // The engine topic ("" by default) carries the blocks by the engine's hashes, as ints.
  std::vector<WireEvent> stored;
  ASSERT_TRUE(PollUntil(
      [&] {
        std::vector<WireBatch> batches;
        stored.clear();
        if (!Replay(replay, 0, &batches)) return false;
        for (const WireBatch& b : batches)
          if (b.topic.empty())
            for (const WireEvent& e : b.events)
              if (e.type == "BlockStored") stored.push_back(e);
        return stored.size() == n;
      },
      5000))
      << stored.size() << " engine-hash stores seen";
  std::set<uint64_t> got;
  for (const WireEvent& e : stored) {
    EXPECT_EQ(e.medium, "CPU");
    EXPECT_EQ(e.block_size, bt / 2);
    EXPECT_EQ(e.token_ids.size(), bt);
    got.insert(e.int_hashes.begin(), e.int_hashes.end());
  }
  EXPECT_EQ(got, Ints(engine));

  // A client that says nothing of engine hashes stores as before: its blocks are announced by
  // kvtier's keys only.
  EXPECT_EQ(StoreChain(**c, 900, 2).stored_blocks, 2u);
  std::vector<WireBatch> batches;
  ASSERT_TRUE(PollUntil(
      [&] {
        batches.clear();
        if (!Replay(replay, 0, &batches)) return false;
        size_t keyed = 0;
        for (const WireBatch& b : batches)
          if (b.topic == "@kvtier-keys")
            for (const WireEvent& e : b.events)
              keyed += e.type == "BlockStored" ? e.hashes.size() : 0;
        return keyed == 2;
      },
      5000));
}

}  // namespace
}  // namespace kvtier::testing
