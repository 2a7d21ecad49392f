#include "events/kv_event_publisher.h"

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <map>
#include <thread>

#include "events/kv_event_codec.h"
#include "testing/kv_event_subscriber.h"
#include "testing/test_util.h"

namespace kvtier::events {
namespace {

using testing::EventSubscriber;
using testing::Key;
using testing::WireBatch;
using testing::WireEvent;

constexpr char kKeysTopic[] = "kv@h:1@m@kvtier-keys";

bool PollUntil(const std::function<bool()>& done, int timeout_ms = 5000) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < end) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return done();
}

std::string Hex(const std::string& bytes) {
  static const char* kDigits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out += kDigits[c >> 4];
    out += kDigits[c & 15];
  }
  return out;
}

TEST(KvEventCodecTest, BytesEqualVllmMsgspecEncoding) {
  // From vLLM 0.32: msgspec.msgpack.Encoder().encode(KVEventBatch(ts=1.5, events=[
  //   AllBlocksCleared(), BlockStored(block_hashes=[bytes(range(16)), bytes(range(16, 32))],
  //   parent_block_hash=None, token_ids=[], block_size=4, lora_id=None, medium="CPU",
  //   lora_name=None), BlockRemoved(block_hashes=[bytes(range(16))], medium="STORAGE")],
  //   data_parallel_rank=2)).hex()
  const std::string want =
      "93cb3ff80000000000009381a474797065b0416c6c426c6f636b73436c656172656488a474797065ab426c6f"
      "636b53746f726564ac626c6f636b5f68617368657392c410000102030405060708090a0b0c0d0e0fc4101011"
      "12131415161718191a1b1c1d1e1fb1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f69647390"
      "aa626c6f636b5f73697a6504a76c6f72615f6964c0a66d656469756da3435055a96c6f72615f6e616d65c083"
      "a474797065ac426c6f636b52656d6f766564ac626c6f636b5f68617368657391c410000102030405060708"
      "090a0b0c0d0e0fa66d656469756da753544f5241474502";
  const BlockKey k1{0x0001020304050607, 0x08090a0b0c0d0e0f};
  const BlockKey k2{0x1011121314151617, 0x18191a1b1c1d1e1f};
  BatchEncoder enc(4, 2);
  enc.Cleared();
  enc.Stored(k1, "CPU");
  enc.Stored(k2, "CPU");  // grouped with k1: one event, as vLLM stores a request's blocks
  enc.Removed(k1, "STORAGE");
  EXPECT_EQ(Hex(enc.Finish(1.5)), want);
}

TEST(KvEventCodecTest, EngineHashesReplaceTheKey) {
  EngineBlockHashes e;
  e.hashes = {"h1", "h2"};
  e.parent_hash = "p0";
  e.token_ids = {1, 2, 3, 4};
  BatchEncoder enc(4, 0);
  enc.EngineStored(&e, "CPU");
  WireBatch b;
  ASSERT_TRUE(testing::DecodeBatch(enc.Finish(2.0), &b));
  ASSERT_EQ(b.events.size(), 1u);
  EXPECT_EQ(b.events[0].hashes, (std::vector<std::string>{"h1", "h2"}));
  EXPECT_EQ(b.events[0].block_size, 2u);  // two engine blocks in one 4-token kvtier block
}

TEST(KvEventEndpointTest, VllmRules) {
  EXPECT_TRUE(IsBindEndpoint("tcp://*:5557"));
  EXPECT_TRUE(IsBindEndpoint("tcp://[::]:5557"));
  EXPECT_TRUE(IsBindEndpoint("ipc:///tmp/kv"));
  EXPECT_TRUE(IsBindEndpoint("inproc://kv"));
  EXPECT_FALSE(IsBindEndpoint("tcp://10.0.0.1:5557"));
  EXPECT_EQ(OffsetEndpoint("tcp://*:5557", 0), "tcp://*:5557");
  EXPECT_EQ(OffsetEndpoint("tcp://*:5557", 3), "tcp://*:5560");
  EXPECT_EQ(OffsetEndpoint("tcp://host:0", 3), "tcp://host:0");
  EXPECT_EQ(OffsetEndpoint("tcp://127.0.0.1:*", 3), "tcp://127.0.0.1:*");
  EXPECT_EQ(OffsetEndpoint("inproc://kv", 2), "inproc://kv_dp2");
  EXPECT_EQ(ExpandTopic("kv@{host}:{port}@{model}", "10.0.0.7", "8000", "llama", 1),
            "kv@10.0.0.7:8000@llama");
  EXPECT_EQ(ExpandTopic("r{dp_rank}-{x}", "", "", "", 5), "r5-{x}");
}

KvEvent Stored(uint64_t seq, int tier = 0) {
  KvEvent e;
  e.seq = seq;
  e.type = KvEvent::Type::kStored;
  e.key = Key(seq);
  e.tier = tier;
  return e;
}

PublisherSetup MakeSetup(const std::string& endpoint) {
  PublisherSetup s;
  s.options.endpoint = endpoint;
  s.options.topic = "kv@{host}:{port}@{model}";
  s.options.topic_host = "h";
  s.options.topic_port = "1";
  s.options.replay_endpoint = "tcp://127.0.0.1:*";
  s.options.batch_interval_ms = 5;
  s.media = {"CPU", "STORAGE"};
  s.block_tokens = 16;
  s.model = "m";
  return s;
}

// Adds probe events until the subscriber receives one (a subscription lands a little after
// connect); returns the next seq to add and the last wire seq received per topic.
uint64_t Probe(KvEventPublisher& p, EventSubscriber& sub, uint64_t* wire_seq) {
  uint64_t seq = 1;
  WireBatch b;
  for (int i = 0; i < 200; ++i) {
    p.Add(Stored(seq++));
    if (sub.Next(&b, 20)) {
      while (sub.Next(&b, 100)) {
      }
      *wire_seq = b.seq;
      return seq;
    }
  }
  ADD_FAILURE() << "no event reached the subscriber";
  return seq;
}

// Checks a publisher's stream as a router sees it: no gap, order kept across out-of-order
// Adds, count batching, media and hashes.
void CheckStream(KvEventPublisher& p, EventSubscriber& sub) {
  uint64_t wire = 0;
  uint64_t seq = Probe(p, sub, &wire);
  // 3 events added last-first: delivered in index order, in one batch.
  for (uint64_t s = seq + 2; s >= seq; --s) p.Add(Stored(s, s == seq + 1 ? 1 : 0));
  WireBatch b;
  ASSERT_TRUE(sub.Next(&b));
  EXPECT_EQ(b.topic, kKeysTopic);
  EXPECT_EQ(b.seq, ++wire);
  ASSERT_EQ(b.events.size(), 3u);
  EXPECT_EQ(b.events[0].type, "BlockStored");
  EXPECT_EQ(b.events[0].hashes, std::vector<std::string>{KeyBytes(Key(seq))});
  EXPECT_EQ(b.events[0].medium, "CPU");
  EXPECT_EQ(b.events[0].block_size, 16u);
  EXPECT_EQ(b.events[1].medium, "STORAGE");
  EXPECT_EQ(b.events[2].hashes, std::vector<std::string>{KeyBytes(Key(seq + 2))});
  seq += 3;
  // Many at once: batches of at most max_batch_events (1024), still without gaps.
  std::vector<std::string> got;
  for (int i = 0; i < 3000; ++i) p.Add(Stored(seq + i));
  while (got.size() < 3000u && sub.Next(&b)) {
    EXPECT_EQ(b.seq, ++wire);
    ASSERT_EQ(b.events.size(), 1u);  // consecutive stores to one medium: one event
    EXPECT_LE(b.events[0].hashes.size(), 1024u);
    got.insert(got.end(), b.events[0].hashes.begin(), b.events[0].hashes.end());
  }
  ASSERT_EQ(got.size(), 3000u);
  for (int i = 0; i < 3000; ++i) ASSERT_EQ(got[i], KeyBytes(Key(seq + i))) << i;
}

TEST(KvEventPublisherTest, SubscriberConnectsToBindingPublisher) {
  auto p = KvEventPublisher::Start(MakeSetup("tcp://127.0.0.1:*"));
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EventSubscriber sub((*p)->endpoint(), /*bind=*/false, kKeysTopic);
  CheckStream(**p, sub);
}

TEST(KvEventPublisherTest, PublisherConnectsToBindingSubscriber) {
  EventSubscriber sub("tcp://127.0.0.1:*", /*bind=*/true, kKeysTopic);
  auto p = KvEventPublisher::Start(MakeSetup(sub.endpoint()));  // no '*': connects
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ((*p)->endpoint(), sub.endpoint());
  CheckStream(**p, sub);
}

TEST(KvEventPublisherTest, ReplayReturnsMissedBatchesFromTheStart) {
  auto p = KvEventPublisher::Start(MakeSetup("tcp://127.0.0.1:*"));
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  uint64_t next = 1;
  {
    EventSubscriber sub((*p)->endpoint(), false);
    uint64_t wire = 0;
    next = Probe(**p, sub, &wire);
  }  // the subscriber goes away; these batches are missed
  for (int i = 0; i < 5; ++i) (*p)->Add(Stored(next++));
  // Every event added so far (how they were batched depends on the publisher's timing).
  std::vector<WireBatch> all;
  ASSERT_TRUE(PollUntil([&] {
    all.clear();
    if (!testing::Replay((*p)->replay_endpoint(), 0, &all)) return false;
    uint64_t stored = 0;
    for (const WireBatch& b : all)
      for (const WireEvent& e : b.events) stored += e.type == "BlockStored" ? e.hashes.size() : 0;
    return stored == next - 1;
  }));
  // Both topics start with AllBlocksCleared at seq 0; the key topic's batches follow 1, 2, ...
  std::map<std::string, uint64_t> next_wire;
  for (const WireBatch& b : all) {
    EXPECT_EQ(b.seq, next_wire[b.topic]++) << b.topic;
    if (b.seq == 0) {  // the start's clear, perhaps with the first events after it
      ASSERT_GE(b.events.size(), 1u);
      EXPECT_EQ(b.events[0].type, "AllBlocksCleared");
      EXPECT_EQ(b.events[0].fields, 1u);
    }
  }
  EXPECT_EQ(next_wire.size(), 2u);  // "kv@h:1@m" and "kv@h:1@m@kvtier-keys"
  // From a later seq: only what follows.
  std::vector<WireBatch> tail;
  ASSERT_TRUE(testing::Replay((*p)->replay_endpoint(), all.back().seq, &tail));
  ASSERT_FALSE(tail.empty());
  EXPECT_EQ(tail.back().seq, all.back().seq);
  EXPECT_EQ(tail.back().events[0].hashes, all.back().events[0].hashes);
}

TEST(KvEventPublisherTest, FullQueueDropsAndCounts) {
  PublisherSetup s = MakeSetup("tcp://127.0.0.1:*");
  s.options.queue_events = 4;
  s.options.batch_interval_ms = 60000;  // nothing leaves until the destructor
  s.options.max_batch_events = 1000;
  auto p = KvEventPublisher::Start(std::move(s));
  ASSERT_TRUE(p.ok());
  for (uint64_t i = 1; i <= 10; ++i) (*p)->Add(Stored(i));
  EXPECT_EQ((*p)->stats().dropped, 7u);  // the start's AllBlocksCleared holds one place
}

TEST(KvEventPublisherTest, DataParallelRankOffsetsThePortAndTagsBatches) {
  EventSubscriber sub("tcp://127.0.0.1:*", true);
  const std::string ep = sub.endpoint();
  const int port = std::stoi(ep.substr(ep.rfind(':') + 1));
  PublisherSetup s = MakeSetup("tcp://127.0.0.1:" + std::to_string(port - 2));
  s.options.data_parallel_rank = 2;
  auto p = KvEventPublisher::Start(std::move(s));
  ASSERT_TRUE(p.ok());
  EXPECT_EQ((*p)->endpoint(), ep);
  uint64_t wire = 0;
  const uint64_t seq = Probe(**p, sub, &wire);
  (*p)->Add(Stored(seq));
  WireBatch b;
  ASSERT_TRUE(sub.Next(&b));
  EXPECT_EQ(b.dp_rank, 2u);
}

}  // namespace
}  // namespace kvtier::events
