// The daemon's config (src/serve/serve_config.cc): the serve: section's checks.
#include <gtest/gtest.h>

#include <string>

#include "serve/serve_options.h"

namespace kvtier::serve {
namespace {

// A small valid config with `serve` as its serve: section's body and `extra_tiers` appended.
std::string Yaml(const std::string& serve, const std::string& extra_tiers = "") {
  return "model_id: test\n"
         "layout: {num_layers: 2, num_kv_heads: 2, head_dim: 8, dtype: fp32, block_tokens: 16}\n"
         "tiers:\n"
         "  - {kind: host, capacity: 1MiB, params: {prefault: false}}\n" +
         extra_tiers + "serve:\n" + serve;
}

Status Parse(const std::string& serve, const std::string& extra_tiers = "") {
  return ParseServeConfigYaml(Yaml(serve, extra_tiers), "t.yaml").status();
}

// Issue 27 item 6: metrics_addr 127.0.0.1:99999 was accepted and bound as port 34463 (httplib
// takes the port modulo 65536), and a bad events_addr was taken silently. Both are refused at
// validation, naming the key and its line.
TEST(ServeConfigTest, BadMetricsAndEventsAddressesAreRefusedNamingTheKey) {
  for (const char* bad : {"127.0.0.1:99999", "99999", ":-1", "127.0.0.1:http", "127.0.0.1:"}) {
    Status st = Parse(std::string("  metrics_addr: \"") + bad + "\"\n");
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(st.message().find("t.yaml:6: serve.metrics_addr: '" + std::string(bad) + "'"),
              std::string::npos)
        << st.message();
  }
  for (const char* bad : {"tcp://127.0.0.1:99999", "udp://127.0.0.1:5557", "127.0.0.1:5557",
                          "tcp://127.0.0.1", "tcp://:5557", "ipc://"}) {
    Status st = Parse(std::string("  events_addr: \"") + bad + "\"\n");
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(st.message().find("serve.events_addr: '" + std::string(bad) + "'"), std::string::npos)
        << st.message();
  }
}

TEST(ServeConfigTest, GoodAddressesAreAccepted) {
  for (const char* good : {"9464", ":0", "127.0.0.1:9464", "0.0.0.0:65535", "localhost:1"})
    EXPECT_TRUE(Parse(std::string("  metrics_addr: \"") + good + "\"\n").ok()) << good;
  for (const char* good : {"tcp://127.0.0.1:5557", "tcp://127.0.0.1:*", "tcp://*:0",
                           "ipc:///run/kvtier/events", "inproc://events"})
    EXPECT_TRUE(Parse(std::string("  events_addr: \"") + good + "\"\n").ok()) << good;
}

// The --metrics-addr flag overrides the config after parsing: Validate checks it the same way.
TEST(ServeConfigTest, ValidateChecksAddressesSetInCode) {
  ServeOptions o;
  o.metrics_addr = "127.0.0.1:99999";
  EXPECT_NE(o.Validate().message().find("metrics_addr: '127.0.0.1:99999'"), std::string::npos);
  o.metrics_addr = "127.0.0.1:9464";
  o.events_addr = "tcp://127.0.0.1:70000";
  EXPECT_NE(o.Validate().message().find("events_addr: "), std::string::npos);
}

// Issue 27 item 5: with no write queue every commit writes the lower tiers itself, so a slow
// SSD holds clients past their deadline: the daemon refuses it.
TEST(ServeConfigTest, NoWriteQueueWithLowerTiersIsRefused) {
  const std::string disk = "  - {kind: disk, capacity: 4MiB, params: {path: /nonexistent}}\n";
  Result<ServeConfig> c =
      ParseServeConfigYaml("write_queue_blocks: 0\n" + Yaml("  lease_ms: 1000\n", disk), "t.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("write_queue_blocks: 0"), std::string::npos)
      << c.status().message();
  EXPECT_TRUE(ParseServeConfigYaml("write_queue_blocks: 0\n" + Yaml("  lease_ms: 1000\n"), "t.yaml")
                  .ok());  // a host tier alone has nothing to wait on
}

// The daemon reads the tiers' admission from the same keys, refused with the same errors.
TEST(ServeConfigTest, AdmissionOfALowerTierIsReadAndCheckedByTheDaemon) {
  const std::string disk =
      "  - kind: disk\n    capacity: 4MiB\n    params: {path: /nonexistent}\n"
      "    admission: {min_reuse: 2, min_prefix_tokens: 4096}\n";
  Result<ServeConfig> c = ParseServeConfigYaml(Yaml("  lease_ms: 1000\n", disk), "t.yaml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->cache.tiers[1].admission.min_reuse, 2u);
  EXPECT_EQ(c->cache.tiers[1].admission.min_prefix_tokens, 4096u);
  const std::string bad =
      "  - kind: disk\n    capacity: 4MiB\n    params: {path: /nonexistent}\n"
      "    admission: {min_reuse: many}\n";
  Status st = Parse("  lease_ms: 1000\n", bad);
  EXPECT_NE(st.message().find("t.yaml:8: tiers[1].admission.min_reuse:"), std::string::npos)
      << st.ToString();
}

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
  // Not a ZeroMQ endpoint: refused when the config is read.
  EXPECT_FALSE(ParseServeConfigYaml(std::string(kBase) + "  events_addr: http://x\n", "t").ok());
}

// An in-process cache (the C API's and Python's YAML) publishes with serve.events_*; the daemon's
// own rules (first tier host, a write queue) do not apply to it.
TEST(ServeConfigTest, InProcessCachesTakeTheEventKeysAndNotTheDaemonsRules) {
  const std::string disk_only =
      "model_id: test\n"
      "layout: {num_layers: 2, num_kv_heads: 2, head_dim: 8, dtype: fp32, block_tokens: 16}\n"
      "write_queue_blocks: 0\n"
      "tiers:\n"
      "  - {kind: disk, capacity: 4MiB, params: {path: /tmp/kvtier-in-process-events}}\n";
  EXPECT_FALSE(ParseServeConfigYaml(disk_only, "t").ok());  // the daemon refuses it
  auto plain = CacheOptionsWithEvents(disk_only, "t");
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_FALSE(plain->events.enabled());
  auto with = CacheOptionsWithEvents(disk_only +
                                         "serve:\n  events_addr: tcp://127.0.0.1:*\n"
                                         "  events_int_hashes: false\n"
                                         "  events_media: {disk: SSD}\n",
                                     "t");
  ASSERT_TRUE(with.ok()) << with.status().ToString();
  EXPECT_EQ(with->events.endpoint, "tcp://127.0.0.1:*");
  EXPECT_FALSE(with->events.int_hashes);
  EXPECT_EQ(with->events.media, std::vector<std::string>{"SSD"});
  const Status bad =
      CacheOptionsWithEvents(disk_only + "serve:\n  events_int_hashes: maybe\n", "t").status();
  EXPECT_NE(bad.message().find("t:7: serve.events_int_hashes"), std::string::npos) << bad.message();
  EXPECT_EQ(CacheOptionsWithEventsFile("/nonexistent/kvtier.yaml").status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvtier::serve
