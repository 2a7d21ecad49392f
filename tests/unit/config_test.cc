#include "kvtier/config.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "config/tier_params.h"
#include "testing/test_util.h"
#include "tiers/disk/disk_tier.h"

namespace kvtier {
namespace {

TEST(ConfigTest, ParsesAFullConfig) {
  auto o = ParseCacheOptionsYaml(R"(
model_id: llama-3.1-8b
model_revision: 0e7c2a1
layout: {preset: llama-3.1-8b, block_tokens: 16}
tenant: team-a
write_mode: write-back
verify_checksums: false
tiers:
  - {kind: host, name: dram, capacity: 64MiB, threads: 2, eviction: s3fifo}
  - kind: host
    name: cold
    capacity: 64MiB
    admission: {kind: after-n-hits, hits: 2}
)",
                                 "test.yaml");
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->model_id, "llama-3.1-8b");
  EXPECT_EQ(o->model_revision, "0e7c2a1");
  EXPECT_EQ(o->layout.block_tokens, 16u);
  EXPECT_EQ(o->layout.bytes_per_block(), 2u << 20);
  EXPECT_EQ(o->tenant, "team-a");
  EXPECT_EQ(o->write_mode, WriteMode::kWriteBack);
  EXPECT_FALSE(o->verify_checksums);
  ASSERT_EQ(o->tiers.size(), 2u);
  EXPECT_EQ(o->tiers[0].name, "dram");
  EXPECT_EQ(o->tiers[0].capacity_bytes, 64u << 20);
  EXPECT_EQ(o->tiers[0].threads, 2);
  EXPECT_EQ(o->tiers[0].eviction, "s3fifo");
  EXPECT_EQ(o->tiers[1].admission.min_reuse, 2u);  // after-n-hits' hits is min_reuse
  EXPECT_EQ(o->tiers[1].admission.min_prefix_tokens, 0u);
  auto cache = Cache::Open(*o);
  EXPECT_TRUE(cache.ok()) << cache.status().ToString();
}

TEST(ConfigTest, ExplicitLayoutFields) {
  auto o = ParseCacheOptionsYaml(R"(
layout: {num_layers: 2, num_kv_heads: 1, head_dim: 576, dtype: fp8, attention: mla}
tiers: [{kind: host, capacity: 1MiB}]
)",
                                 "x.yaml");
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->layout.attention, AttentionKind::kMla);
  EXPECT_EQ(o->layout.bytes_per_token(), 2u * 576);
}

void ExpectError(const std::string& yaml, const std::string& fragment) {
  auto o = ParseCacheOptionsYaml(yaml, "bad.yaml");
  ASSERT_FALSE(o.ok()) << "accepted: " << yaml;
  EXPECT_EQ(o.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(o.status().message().find(fragment), std::string::npos)
      << "message: " << o.status().message() << "\nwanted: " << fragment;
}

TEST(ConfigTest, ErrorsNameFileLineAndKey) {
  ExpectError("layout: {preset: llama-3.1-8b}\ntiers:\n  - {kind: host, capacity: 8XB}\n",
              "bad.yaml:3: tiers[0].capacity: cannot parse '8XB' as a size");
  ExpectError("layout: {preset: llama-3.1-8b}\ntiers: [{kind: host, capacity: 1GiB, thread: 2}]\n",
              "tiers[0].thread: unknown key");
  ExpectError("layout: {preset: nope}\ntiers: [{kind: host, capacity: 1GiB}]\n",
              "layout.preset: unknown layout preset 'nope'");
  ExpectError("layout: {preset: llama-3.1-8b}\n", "tiers: want a non-empty list");
  ExpectError("tiers: [{kind: host, capacity: 1GiB}]\n", "layout: missing");
  ExpectError(
      "layout: {preset: llama-3.1-8b, dtype: int4}\ntiers: [{kind: host, capacity: 1GiB}]\n",
      "layout.dtype: unknown dtype 'int4'");
  ExpectError(
      "layout: {preset: llama-3.1-8b}\nwrite_mode: sometimes\ntiers: [{kind: host, capacity: "
      "1GiB}]\n",
      "write_mode: unknown mode 'sometimes'");
  ExpectError(
      "layout: {preset: llama-3.1-8b}\ntiers: [{kind: host, capacity: 1GiB, eviction: mru}]\n",
      "tiers[0].eviction: unknown eviction policy 'mru'");
  ExpectError(
      "layout: {preset: llama-3.1-8b}\ntiers: [{kind: host, capacity: 1GiB, threads: -2}]\n",
      "tiers[0].threads: want a non-negative integer");
  ExpectError("layout: {preset: llama-3.1-8b}\ntiers: [{kind: host, capacity: 1KiB}]\n",
              "tiers[0].capacity_bytes");
  ExpectError("layout: [unclosed\n", "bad.yaml:");
}

// doc/config.md's grouped layout, with a host tier of 8 of its blocks.
const char* kGroupedYaml = R"(model_id: hybrid
layout:
  block_tokens: 128
  groups:
    - {kind: sliding_window, num_layers: 2, num_kv_heads: 2, head_dim: 64, dtype: fp32, window: 32, page_tokens: 32}
    - {kind: full, num_layers: 2, num_kv_heads: 2, head_dim: 64, dtype: fp32}
    - {kind: latent, num_layers: 4, head_dim: 576, dtype: bf16}
    - {kind: state, num_layers: 3, state_bytes: 65536, dtype: fp32}
tiers: [{kind: host, capacity: 16MiB}]
)";

TEST(ConfigTest, GroupedLayout) {
  auto o = ParseCacheOptionsYaml(kGroupedYaml, "hybrid.yaml");
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  const KvLayout& l = o->layout;
  ASSERT_EQ(l.groups.size(), 4u);
  EXPECT_EQ(l.block_tokens, 128u);
  const KvLayoutGroup swa{KvGroupKind::kSlidingWindow, 2, 2, 64, DType::kFp32, 32, 32, 0};
  const KvLayoutGroup full{KvGroupKind::kFull, 2, 2, 64, DType::kFp32, 0, 0, 0};
  const KvLayoutGroup latent{KvGroupKind::kLatent, 4, 1, 576, DType::kBf16, 0, 0, 0};  // 1 head
  const KvLayoutGroup state{KvGroupKind::kState, 3, 0, 0, DType::kFp32, 0, 0, 65536};
  EXPECT_EQ(l.groups[0], swa);
  EXPECT_EQ(l.groups[1], full);
  EXPECT_EQ(l.groups[2], latent);
  EXPECT_EQ(l.groups[3], state);
  EXPECT_EQ(l.bytes_per_block(), 65536u + 262144 + 589824);  // the states: in state records
  EXPECT_EQ(l.state_bytes(), 196608u);
  // The same mapping alone, as the C API's layout_yaml takes it.
  auto only = ParseLayoutYaml(
      "block_tokens: 128\ngroups:\n  - {kind: full, num_layers: 2, num_kv_heads: 2, "
      "head_dim: 64, dtype: fp32}\n",
      "layout_yaml");
  ASSERT_TRUE(only.ok()) << only.status().ToString();
  EXPECT_EQ(only->groups, std::vector<KvLayoutGroup>{full});
  auto cache = Cache::Open(*o);
  EXPECT_TRUE(cache.ok()) << cache.status().ToString();
}

TEST(ConfigTest, GroupedLayoutErrorsNameFileLineAndKey) {
  const std::string tiers = "tiers: [{kind: host, capacity: 1GiB}]\n";
  const std::string full = "{kind: full, num_layers: 2, num_kv_heads: 2, head_dim: 64}";
  ExpectError("layout:\n  num_layers: 2\n  groups:\n    - " + full + "\n" + tiers,
              "bad.yaml:2: layout.num_layers: not with groups");
  ExpectError("layout:\n  groups: [" + full + "]\n  preset: llama-3.1-8b\n" + tiers,
              "bad.yaml:3: layout.preset: not with groups");
  ExpectError("layout:\n  groups:\n    - {kind: global, num_layers: 2}\n" + tiers,
              "bad.yaml:3: layout.groups[0].kind: unknown kind 'global' (full, latent, "
              "sliding_window, state)");
  ExpectError("layout:\n  groups:\n    - {kind: full, num_layers: 2, heads: 2}\n" + tiers,
              "bad.yaml:3: layout.groups[0].heads: unknown key");
  ExpectError("layout:\n  groups:\n    - " + full +
                  "\n    - {kind: sliding_window, num_layers: 2, num_kv_heads: 2, head_dim: 64, "
                  "window: 32, page_tokens: 48}\n" +
                  tiers,
              "bad.yaml:4: layout.groups[1].page_tokens: must divide block_tokens 64");
  ExpectError("layout: {groups: []}\n" + tiers, "layout.groups: want a non-empty list");
}

TEST(ConfigTest, AdmissionRulesAndTheirOlderKindForms) {
  auto admission = [](const std::string& a) {
    auto o = ParseCacheOptionsYaml(
        "layout: {preset: llama-3.1-8b}\ntiers:\n"
        "  - {kind: host, capacity: 1GiB}\n"
        "  - {kind: host, name: low, capacity: 1GiB, admission: " +
            a + "}\n",
        "a.yaml");
    EXPECT_TRUE(o.ok()) << o.status().ToString();
    return o.ok() ? o->tiers[1].admission : AdmissionOptions{};
  };
  AdmissionOptions a = admission("{min_reuse: 2, min_prefix_tokens: 4096}");
  EXPECT_EQ(a.min_reuse, 2u);
  EXPECT_EQ(a.min_prefix_tokens, 4096u);
  EXPECT_TRUE(a.count_reuse_after_eviction);  // the default
  EXPECT_FALSE(
      admission("{min_reuse: 1, count_reuse_after_eviction: false}").count_reuse_after_eviction);
  EXPECT_TRUE(admission("always").admits_all());
  EXPECT_EQ(admission("after-n-hits").min_reuse, 2u);
  EXPECT_EQ(admission("{kind: after-n-hits, hits: 3}").min_reuse, 3u);
  a = admission("{kind: min-prefix-tokens, min_prefix_tokens: 1024}");
  EXPECT_EQ(a.min_prefix_tokens, 1024u);
  EXPECT_EQ(a.min_reuse, 0u);
}

TEST(ConfigTest, BadAdmissionIsRefusedNamingTheKey) {
  const std::string head =
      "layout: {preset: llama-3.1-8b}\ntiers:\n  - {kind: host, capacity: 1GiB}\n"
      "  - kind: host\n    name: low\n    capacity: 1GiB\n";
  ExpectError(head + "    admission: {min_reuse: 70000}\n",
              "bad.yaml:7: tiers[1].admission.min_reuse: must be in 0..65535");
  ExpectError(head + "    admission: {min_reuse: -1}\n",
              "bad.yaml:7: tiers[1].admission.min_reuse: want a non-negative integer");
  ExpectError(head + "    admission: {min_prefix_tokens: lots}\n",
              "bad.yaml:7: tiers[1].admission.min_prefix_tokens:");
  ExpectError(head + "    admission: {min_reuse: 2, hit: 2}\n",
              "bad.yaml:7: tiers[1].admission.hit: unknown key (known: kind, min_reuse, "
              "min_prefix_tokens, hits, count_reuse_after_eviction)");
  ExpectError(head + "    admission: {min_reuse: 1, count_reuse_after_eviction: maybe}\n",
              "bad.yaml:7: tiers[1].admission.count_reuse_after_eviction:");
  ExpectError(head + "    admission: {hits: 2}\n",
              "tiers[1].admission.hits: only with kind: after-n-hits");
  ExpectError(head + "    admission: {kind: after-n-hits, min_reuse: 2}\n",
              "tiers[1].admission.min_reuse: not with kind: after-n-hits");
  ExpectError(head + "    admission: sometimes\n",
              "bad.yaml:7: tiers[1].admission: unknown "
              "admission 'sometimes'");
  ExpectError(
      "layout: {preset: llama-3.1-8b}\ntiers:\n  - kind: host\n    capacity: 1GiB\n"
      "    admission: {min_reuse: 2}\n  - {kind: host, name: low, capacity: 1GiB}\n",
      "bad.yaml:5: tiers[0].admission: the first tier takes every block");
  // The same rule for an engine that fills CacheOptions itself.
  CacheOptions o;
  o.layout = *LayoutPreset("llama-3.1-8b");
  TierSpec t;
  t.kind = "host";
  t.capacity_bytes = 1 << 30;
  o.tiers = {t, t};
  o.tiers[1].name = "low";
  o.tiers[1].admission.min_reuse = 65536;
  EXPECT_NE(o.Validate().message().find("tiers[1].admission: min_reuse: must be in 0..65535"),
            std::string::npos)
      << o.Validate().ToString();
  o.tiers[1].admission.min_reuse = 2;
  o.tiers[0].admission.min_prefix_tokens = 64;
  EXPECT_NE(o.Validate().message().find("tiers[0].admission: the first tier"), std::string::npos)
      << o.Validate().ToString();
}

// Tier parameters were checked only when the tier opened, with no file or line ("tier 'disk':
// params.segment_bytes: ..."), although this page promises both for every error.
TEST(ConfigTest, TierParameterErrorsNameFileLineAndKey) {
  ExpectError(
      "layout: {preset: llama-3.1-8b}\ntiers:\n  - kind: disk\n    capacity: 1GiB\n    params:\n"
      "      path: /tmp/x\n      segment_bytes: lots\n",
      "bad.yaml:7: tiers[0].params.segment_bytes: 'lots' is not a byte size");
  ExpectError(
      "layout: {preset: llama-3.1-8b}\ntiers:\n  - kind: disk\n    capacity: 1GiB\n    params:\n"
      "      path: /tmp/x\n      colour: blue\n",
      "bad.yaml:7: tiers[0].params.colour: unknown disk tier param");
  ExpectError(
      "layout: {preset: llama-3.1-8b}\ntiers:\n  - kind: remote\n    capacity: 1GiB\n"
      "    params: {url: 'redis://127.0.0.1:6379', timeout_ms: soon}\n",
      "bad.yaml:5: tiers[0].params.timeout_ms:");
}

// Host params were read only when the tier opened, with no file or line.
TEST(ConfigTest, HostTierParamErrorsNameFileLineAndKey) {
  const std::string head =
      "layout: {preset: llama-3.1-8b}\ntiers:\n  - kind: host\n    capacity: 1GiB\n";
  ExpectError(head + "    params:\n      pin: false\n      prefault: maybe\n",
              "bad.yaml:7: tiers[0].params.prefault: 'maybe' is not true or false");
  ExpectError(head + "    params:\n      pinned: false\n",
              "bad.yaml:6: tiers[0].params.pinned: unknown host tier param (known: prefault, "
              "huge_pages, pin, prefault_background, warm_ahead)");
  ExpectError(head + "    params:\n      warm_ahead: lots\n",
              "bad.yaml:6: tiers[0].params.warm_ahead: 'lots' is not a byte size");
  ExpectError(head + "    threads: 99\n", "bad.yaml:5: tiers[0].threads: must be in 1..64");
  ExpectError(
      "layout: {preset: llama-3.1-8b}\ntiers:\n  - kind: emulated_device\n    capacity: 1GiB\n"
      "    params: {pinned: true}\n",
      "bad.yaml:5: tiers[0].params.pinned: unknown emulated_device tier param (known: prefault,");
  // The old name of the emulated device tier is refused at its line, naming the new one.
  ExpectError("layout: {preset: llama-3.1-8b}\ntiers:\n  - kind: device\n    capacity: 1GiB\n",
              "bad.yaml:3: tiers[0].kind: kind 'device' is now 'emulated_device'");
}

TEST(ConfigTest, DiskTierParamErrorsNameFileLineAndKey) {
  const std::string head =
      "layout: {preset: llama-3.1-8b}\ntiers:\n  - {kind: host, capacity: 1GiB}\n"
      "  - kind: disk\n    capacity: 1GiB\n    params:\n      path: /tmp/x\n";
  ExpectError(head + "      queue_depth: 0\n",
              "bad.yaml:8: tiers[1].params.queue_depth: '0' is not an integer in [1, 4096]");
  ExpectError(head + "      sync: sometimes\n",
              "bad.yaml:8: tiers[1].params.sync: 'sometimes' is not none, batch or interval");
  ExpectError(head + "      direct_io: perhaps\n",
              "bad.yaml:8: tiers[1].params.direct_io: 'perhaps' is not true or false");
  ExpectError(head + "      sync: interval\n      sync_interval_ms: 0\n",
              "bad.yaml:9: tiers[1].params.sync_interval_ms: must be > 0 with sync=interval");
  ExpectError(
      "layout: {preset: llama-3.1-8b}\ntiers:\n  - kind: disk\n    capacity: 1GiB\n"
      "    params: {io: uring}\n",
      "bad.yaml:5: tiers[0].params.path: the disk tier needs a directory");
}

TEST(ConfigTest, RemoteTierParamErrorsNameFileLineAndKey) {
  const std::string head =
      "layout: {preset: llama-3.1-8b}\ntiers:\n  - kind: remote\n    capacity: 1GiB\n"
      "    params:\n      url: redis://127.0.0.1:6379\n";
  ExpectError(head + "      timeout_ms: 0\n",
              "bad.yaml:7: tiers[0].params.timeout_ms: '0' is not an integer in [1, 2147483647]");
  ExpectError(head + "      mode: ring\n",
              "bad.yaml:7: tiers[0].params.mode: 'ring' is not auto, single or cluster");
  ExpectError(head + "      lazy_connect: sometimes\n",
              "bad.yaml:7: tiers[0].params.lazy_connect: 'sometimes' is not true or false");
  ExpectError(head + "      timeout: 5\n",
              "bad.yaml:7: tiers[0].params.timeout: unknown remote tier param (known: url, user,");
  ExpectError(
      "layout: {preset: llama-3.1-8b}\ntiers:\n  - kind: remote\n    capacity: 1GiB\n"
      "    params:\n      mode: cluster\n      url: redis://127.0.0.1:6379/3\n",
      "bad.yaml:7: tiers[0].params.url: a cluster has only database 0");
  ExpectError(head + "      key_prefix: '{a}'\n",
              "bad.yaml:7: tiers[0].params.key_prefix: must not contain '{' or '}'");
}

// The YAML, a params map and the typed struct are one vocabulary: each gives the same settings.
TEST(ConfigTest, TypedParamsAndParamsMapAgree) {
  auto o = ParseCacheOptionsYaml(R"(
layout: {preset: llama-3.1-8b}
tiers:
  - {kind: host, capacity: 64MiB, params: {prefault: no, huge_pages: off, pin: 0}}
  - kind: disk
    capacity: 1GiB
    params: {path: /tmp/kv, segment_bytes: 64MiB, buffer_bytes: 8MiB, queue_depth: 7,
             sync: interval, sync_interval_ms: 20, io: pread, register_buffers: false,
             direct_io: false, reinsert_hot: false}
  - kind: remote
    capacity: 1GiB
    params: {url: 'redis://h:1', user: u, password: p, mode: single, key_prefix: 'kv:',
             ttl_s: 60, connect_timeout_ms: 50, timeout_ms: 250, max_redirects: 2,
             max_idle_connections: 3, breaker_failures: 4, breaker_backoff_ms: 10,
             breaker_max_backoff_ms: 90, lazy_connect: true, connections_per_node: 5,
             set_window: 6, get_window: 0}
)",
                                 "t.yaml");
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  ASSERT_EQ(o->tiers.size(), 3u);

  HostTierParams host;
  host.prefault = false;
  host.huge_pages = false;
  host.pin = false;
  ASSERT_TRUE(o->tiers[0].host.has_value());
  EXPECT_EQ(*o->tiers[0].host, host);
  EXPECT_TRUE(o->tiers[0].params.empty());
  auto host_map = ReadHostTierParams({{"prefault", "false"}, {"huge_pages", "0"}, {"pin", "no"}});
  ASSERT_TRUE(host_map.ok()) << host_map.status().ToString();
  EXPECT_EQ(*host_map, host);

  DiskTierParams disk;
  disk.path = "/tmp/kv";
  disk.segment_bytes = 64u << 20;
  disk.buffer_bytes = 8u << 20;
  disk.queue_depth = 7;
  disk.sync = "interval";
  disk.sync_interval_ms = 20;
  disk.io = "sync";  // "pread" is its alias
  disk.register_buffers = false;
  disk.direct_io = false;
  disk.reinsert_hot = false;
  ASSERT_TRUE(o->tiers[1].disk.has_value());
  EXPECT_EQ(*o->tiers[1].disk, disk);
  auto disk_map = ReadDiskTierParams({{"path", "/tmp/kv"},
                                      {"segment_bytes", "67108864"},
                                      {"buffer_bytes", "8MiB"},
                                      {"queue_depth", "7"},
                                      {"sync", "interval"},
                                      {"sync_interval_ms", "20"},
                                      {"io", "sync"},
                                      {"register_buffers", "off"},
                                      {"direct_io", "false"},
                                      {"reinsert_hot", "no"}});
  ASSERT_TRUE(disk_map.ok()) << disk_map.status().ToString();
  EXPECT_EQ(*disk_map, disk);
  // Every key of the table was set away from its default, so none is silently dropped.
  EXPECT_EQ(TierParamKeys("disk").size(), 10u);

  RemoteTierParams remote;
  remote.url = "redis://h:1";
  remote.user = "u";
  remote.password = "p";
  remote.mode = "single";
  remote.key_prefix = "kv:";
  remote.ttl_s = 60;
  remote.connect_timeout_ms = 50;
  remote.timeout_ms = 250;
  remote.max_redirects = 2;
  remote.max_idle_connections = 3;
  remote.breaker_failures = 4;
  remote.breaker_backoff_ms = 10;
  remote.breaker_max_backoff_ms = 90;
  remote.lazy_connect = true;
  remote.connections_per_node = 5;
  remote.set_window = 6;
  remote.get_window = 0;
  ASSERT_TRUE(o->tiers[2].remote.has_value());
  EXPECT_EQ(*o->tiers[2].remote, remote);
  EXPECT_EQ(TierParamKeys("remote").size(), 17u);
}

// A typed struct is checked by the same table as a params string.
TEST(ConfigTest, TypedParamsAreCheckedLikeStrings) {
  DiskTierParams disk;
  disk.path = "/tmp/kv";
  disk.queue_depth = 0;
  Status s = disk.Validate();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "queue_depth: must be in [1, 4096], got 0");
  disk.queue_depth = 8;
  disk.io = "floppy";
  EXPECT_EQ(disk.Validate().message(), "io: 'floppy' is not auto, uring, io_uring, sync or pread");
  disk.io = "io_uring";
  EXPECT_TRUE(disk.Validate().ok());
  EXPECT_EQ(disk::DiskOptionsFrom(disk).io, disk::IoBackend::kUring);

  RemoteTierParams remote;
  EXPECT_EQ(remote.Validate().message(), "url: required (redis://host:port)");
  remote.url = "redis://h:1";
  remote.connections_per_node = 65;
  EXPECT_EQ(remote.Validate().message(), "connections_per_node: must be in [1, 64], got 65");

  TierSpec spec;
  spec.kind = "disk";
  spec.name = "ssd";
  spec.capacity_bytes = 1 << 30;
  spec.disk = disk;
  spec.disk->queue_depth = 5000;
  auto tier = MakeTier(spec, KvLayout{});
  ASSERT_FALSE(tier.ok());
  EXPECT_NE(tier.status().message().find("tier 'ssd': params.queue_depth: must be in [1, 4096]"),
            std::string::npos)
      << tier.status().ToString();
  spec.disk->queue_depth = 8;
  spec.params["path"] = "/tmp/kv";
  EXPECT_NE(CheckTierSpecParams(spec).message().find("not both"), std::string::npos);
  spec.params.clear();
  spec.kind = "host";
  EXPECT_NE(CheckTierSpecParams(spec).message().find("another kind than 'host'"),
            std::string::npos);
}

// The typed struct opens the same tier as the params map: what one stores, the other reads.
TEST(ConfigTest, TypedDiskParamsOpenTheSameTierAsTheMap) {
  testing::TempDir dir;
  KvLayout layout = testing::SmallLayout();
  TierSpec by_map;
  by_map.kind = "disk";
  by_map.capacity_bytes = 4 << 20;
  by_map.params = {{"path", dir.path()}, {"segment_bytes", "256KiB"}, {"io", "sync"}};
  TierSpec typed = by_map;
  typed.params.clear();
  typed.disk = DiskTierParams{};
  typed.disk->path = dir.path();
  typed.disk->segment_bytes = 256 << 10;
  typed.disk->io = "sync";
  BlockKey key{1, 2};
  std::vector<std::byte> block(layout.bytes_per_block(), std::byte{7});
  {
    auto a = MakeTier(by_map, layout);
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    std::vector<Status> put(1);
    ConstBlock c(block);
    ASSERT_TRUE((*a)->Put(std::span(&key, 1), std::span(&c, 1), put).ok());
    ASSERT_TRUE(put[0].ok()) << put[0].ToString();
  }
  auto b = MakeTier(typed, layout);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  std::vector<std::byte> out(block.size());
  std::vector<Status> got(1);
  MutableBlock m(out);
  ASSERT_TRUE((*b)->Get(std::span(&key, 1), std::span(&m, 1), got).ok());
  ASSERT_TRUE(got[0].ok()) << got[0].ToString();
  EXPECT_EQ(out, block);
}

// Top-level bools took yes/on but not 1/0, tier params the reverse: one vocabulary now.
TEST(ConfigTest, EveryBoolKeyTakesTheSameWords) {
  for (const char* word : {"false", "no", "off", "0"}) {
    auto o = ParseCacheOptionsYaml(std::string("layout: {preset: llama-3.1-8b}\n"
                                               "verify_checksums: ") +
                                       word + "\npromote_on_load: " + word +
                                       "\ntiers:\n  - {kind: host, capacity: 1GiB, params: "
                                       "{prefault: " +
                                       word + "}}\n",
                                   "b.yaml");
    ASSERT_TRUE(o.ok()) << word << ": " << o.status().ToString();
    EXPECT_FALSE(o->verify_checksums) << word;
    EXPECT_FALSE(o->promote_on_load) << word;
    ASSERT_TRUE(o->tiers[0].host.has_value());
    EXPECT_FALSE(o->tiers[0].host->prefault) << word;
  }
  ExpectError("layout: {preset: llama-3.1-8b}\nverify_checksums: nope\ntiers: []\n",
              "bad.yaml:2: verify_checksums: want true or false, got 'nope'");
}

TEST(ConfigTest, WriteQueueBlocks) {
  auto o = ParseCacheOptionsYaml(
      "layout: {preset: llama-3.1-8b}\nwrite_queue_blocks: 0\ntiers:\n  - {kind: host, capacity: "
      "1GiB}\n",
      "q.yaml");
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->write_queue_blocks, 0u);
  auto d = ParseCacheOptionsYaml(
      "layout: {preset: llama-3.1-8b}\ntiers:\n  - {kind: host, capacity: 1GiB}\n", "d.yaml");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->write_queue_blocks, CacheOptions{}.write_queue_blocks);
  ExpectError("layout: {preset: llama-3.1-8b}\nwrite_queue_blocks: 99999999999\ntiers: []\n",
              "bad.yaml:2: write_queue_blocks: at most 1048576 blocks (0 = synchronous writes)");
}

TEST(ConfigTest, LoadsAFile) {
  testing::TempDir dir;
  std::string path = dir.path() + "/kvtier.yaml";
  std::ofstream(path) << "layout: {preset: deepseek-v3}\ntiers: [{kind: host, capacity: 256MiB}]\n";
  auto o = LoadCacheOptionsFile(path);
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->layout.attention, AttentionKind::kMla);
  auto missing = LoadCacheOptionsFile(dir.path() + "/none.yaml");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("none.yaml"), std::string::npos);
}

}  // namespace
}  // namespace kvtier
