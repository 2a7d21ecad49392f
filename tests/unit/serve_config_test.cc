#include <gtest/gtest.h>

#include "serve/serve_options.h"

namespace kvtier::serve {
namespace {

constexpr char kBase[] =
    "model_id: m\n"
    "layout: {num_layers: 2, num_kv_heads: 2, head_dim: 8, dtype: fp32, block_tokens: 4}\n"
    "tiers:\n"
    "  - {kind: host, capacity: 1MiB}\n"
    "  - {kind: disk, name: ssd, capacity: 4MiB, params: {path: /tmp/x}}\n"
    "serve:\n";

TEST(ServeConfigTest, EventKeysReachTheCacheOptions) {
  auto c = ParseServeConfigYaml(std::string(kBase) +
                                    "  events_addr: tcp://10.0.0.1:5557\n"
                                    "  events_socket: bind\n"
                                    "  events_topic: 'kv@{host}:{port}@{model}'\n"
                                    "  events_topic_host: 10.0.0.7\n"
                                    "  events_topic_port: '8000'\n"
                                    "  events_replay_addr: tcp://*:5558\n"
                                    "  events_replay_batches: 50\n"
                                    "  events_batch_events: 64\n"
                                    "  events_batch_ms: 2\n"
                                    "  events_queue_events: 1000\n"
                                    "  events_dp_rank: 1\n"
                                    "  events_media: {ssd: NVME}\n",
                                "test.yaml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_TRUE(ApplyEventOptions(c->serve, &c->cache).ok());
  const KvEventsOptions& e = c->cache.events;
  EXPECT_EQ(e.endpoint, "tcp://10.0.0.1:5557");
  EXPECT_EQ(e.socket, KvEventsOptions::Socket::kBind);
  EXPECT_EQ(e.topic, "kv@{host}:{port}@{model}");
  EXPECT_EQ(e.topic_host, "10.0.0.7");
  EXPECT_EQ(e.topic_port, "8000");
  EXPECT_EQ(e.replay_endpoint, "tcp://*:5558");
  EXPECT_EQ(e.replay_batches, 50u);
  EXPECT_EQ(e.max_batch_events, 64u);
  EXPECT_EQ(e.batch_interval_ms, 2u);
  EXPECT_EQ(e.queue_events, 1000u);
  EXPECT_EQ(e.data_parallel_rank, 1u);
  EXPECT_EQ(e.media, (std::vector<std::string>{"", "NVME"}));  // "": the host's default, CPU
}

TEST(ServeConfigTest, BadEventKeysAreRefused) {
  EXPECT_FALSE(ParseServeConfigYaml(std::string(kBase) + "  events_socket: both\n", "t").ok());
  EXPECT_FALSE(ParseServeConfigYaml(std::string(kBase) + "  events_media: [CPU]\n", "t").ok());
  auto c = ParseServeConfigYaml(std::string(kBase) +
                                    "  events_addr: tcp://*:5557\n"
                                    "  events_media: {tape: TAPE}\n",
                                "t");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_FALSE(ApplyEventOptions(c->serve, &c->cache).ok());  // no tier is named tape
  c = ParseServeConfigYaml(std::string(kBase) + "  events_addr: http://x\n", "t");
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(ApplyEventOptions(c->serve, &c->cache).ok());
}

}  // namespace
}  // namespace kvtier::serve
