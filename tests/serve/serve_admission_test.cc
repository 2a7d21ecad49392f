// Admission below the arena through the daemon (issue 30): the same rule and counters as the
// in-process Cache (tests/unit/cache_admission_test.cc), reached through a client's commits and
// lookups. The daemon runs in this process so the test can drain its writer (Cache::WaitForWrites)
// instead of polling; the client still talks to it over the socket and the shared arena.
#include <gtest/gtest.h>

#include <string>

#include "kvtier/client.h"
#include "serve/serve_options.h"
#include "serve/server.h"
#include "serve_util.h"
#include "testing/test_util.h"

namespace kvtier::testing {
namespace {

struct AdmissionDaemon {
  TempDir dir;
  std::unique_ptr<serve::Server> server;
  std::unique_ptr<Client> client;

  // A daemon read from YAML, as `kvtier serve --config` reads it: an arena of arena_blocks over
  // a disk tier with `admission`.
  void Start(uint64_t arena_blocks, const std::string& admission,
             const std::string& write_mode = "write-through") {
    const KvLayout l = SmallLayout();
    std::string y = "model_id: test\nwrite_mode: " + write_mode + "\nlayout: " + LayoutYaml(l) +
                    "\ntiers:\n  - {kind: host, capacity: " +
                    std::to_string(arena_blocks * l.bytes_per_block()) +
                    ", params: {prefault: false}}\n"
                    "  - {kind: disk, capacity: 4MiB, admission: " +
                    admission + ", params: {path: " + dir.path() +
                    "/ssd, io: sync, direct_io: false, buffer_bytes: 1MiB, sync: none}}\n";
    auto cfg = serve::ParseServeConfigYaml(y, "admission.yaml");
    ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
    cfg->serve.socket_path = dir.path() + "/s.sock";
    auto s = serve::Server::Start(cfg->cache, cfg->serve);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    server = std::move(s).value();
    ClientOptions o;
    o.socket_path = cfg->serve.socket_path;
    o.layout = l;
    o.model_id = "test";
    o.timeout_ms = 5000;
    auto c = Client::Open(o);
    ASSERT_TRUE(c.ok() && (*c)->connected()) << c.status().ToString();
    client = std::move(c).value();
  }
  ~AdmissionDaemon() {
    client.reset();
    if (server) server->Stop();
  }
  // The disk tier's stats once every queued write is done.
  CacheStats::PerTier Disk() {
    server->cache().WaitForWrites();
    return server->cache().stats().tiers[1];
  }
};

TEST(ServeAdmissionTest, MinReuseWritesDownOnTheSecondHitAndMinPrefixSkipsShortRequests) {
  AdmissionDaemon d;
  d.Start(64, "{min_reuse: 2, min_prefix_tokens: " +
                  std::to_string(4 * SmallLayout().block_tokens) + "}");
  if (HasFatalFailure()) return;
  EXPECT_EQ(StoreChain(*d.client, 100, 4).stored_blocks, 4u);
  EXPECT_EQ(StoreChain(*d.client, 200, 2).stored_blocks, 2u);  // too short for the disk
  CacheStats::PerTier t = d.Disk();
  EXPECT_EQ(t.skipped_reuse, 4u);
  EXPECT_EQ(t.skipped_prefix, 2u);
  EXPECT_EQ(t.rejected, 6u);
  EXPECT_EQ(t.admitted, 0u);
  EXPECT_EQ(t.tier.puts, 0u) << "a commit wrote a block no rule admits";

  EXPECT_EQ(LoadChain(*d.client, 100, 4), 4);
  EXPECT_EQ(LoadChain(*d.client, 200, 2), 2);
  EXPECT_EQ(d.Disk().tier.puts, 0u) << "one hit is below min_reuse 2";

  EXPECT_EQ(LoadChain(*d.client, 100, 4), 4);
  EXPECT_EQ(LoadChain(*d.client, 200, 2), 2);
  t = d.Disk();
  EXPECT_EQ(t.admitted, 4u);
  EXPECT_EQ(t.tier.puts, 4u) << "the second hit did not write the long request down";
  EXPECT_EQ(t.resident_blocks, 4u);
  EXPECT_EQ(t.skipped_reuse, 4u);
  EXPECT_EQ(t.skipped_prefix, 2u);
  EXPECT_EQ(d.server->cache().stats().write_through_dropped_blocks, 0u);

  // The daemon's status, what `kvtier status` and /metrics print, carries the same counters.
  auto st = d.client->GetDaemonStatus();
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(st->cache.tiers[1].admitted, 4u);
  EXPECT_EQ(st->cache.tiers[1].skipped_reuse, 4u);
  EXPECT_EQ(st->cache.tiers[1].skipped_prefix, 2u);
  EXPECT_NE(d.server->cache().PrometheusText().find(
                "kvtier_tier_admission_skipped_reuse_total{tier=\"disk\"} 4\n"),
            std::string::npos)
      << d.server->cache().PrometheusText();
}

TEST(ServeAdmissionTest, WriteBackVictimsOfTheArenaGoDownOnlyWhenReused) {
  AdmissionDaemon d;
  d.Start(4, "{min_reuse: 1}", "write-back");
  if (HasFatalFailure()) return;
  EXPECT_EQ(StoreChain(*d.client, 100, 4).stored_blocks, 4u);
  EXPECT_EQ(LoadChain(*d.client, 100, 4), 4);                  // hit once
  EXPECT_EQ(StoreChain(*d.client, 200, 4).stored_blocks, 4u);  // 100's blocks are victims
  EXPECT_EQ(StoreChain(*d.client, 300, 4).stored_blocks, 4u);  // 200's, never hit
  const CacheStats::PerTier t = d.Disk();
  EXPECT_EQ(t.admitted, 4u);
  EXPECT_EQ(t.skipped_reuse, 4u);
  EXPECT_EQ(t.tier.puts, 4u);
  // From the disk, byte for byte, lent where the daemon staged them (LoadVisit).
  EXPECT_EQ(LoadChain(*d.client, 100, 4, {}, /*visit=*/true), 4);
  EXPECT_EQ(LoadChain(*d.client, 200, 4), 0);
}

// A block refused at commit and evicted from the arena, then missed by a lookup, is written
// down at its next commit (count_reuse_after_eviction, the default), as in process.
TEST(ServeAdmissionTest, AMissAfterEvictionCountsAsReuseForTheNextCommit) {
  AdmissionDaemon d;
  d.Start(4, "{min_reuse: 1}");
  if (HasFatalFailure()) return;
  EXPECT_EQ(StoreChain(*d.client, 100, 4).stored_blocks, 4u);
  d.server->cache().WaitForWrites();
  EXPECT_EQ(StoreChain(*d.client, 200, 4).stored_blocks, 4u);  // 100 leaves the arena
  EXPECT_EQ(d.Disk().tier.puts, 0u);
  EXPECT_EQ(LoadChain(*d.client, 100, 4), 0);  // reused after it left: a miss, counted
  EXPECT_EQ(StoreChain(*d.client, 100, 4).stored_blocks, 4u);
  EXPECT_EQ(d.Disk().tier.puts, 4u) << "the miss did not count as 100's reuse";
  EXPECT_EQ(StoreChain(*d.client, 300, 4).stored_blocks, 4u);  // 100 leaves the arena again
  d.server->cache().WaitForWrites();
  EXPECT_EQ(LoadChain(*d.client, 100, 4), 4);  // from the disk, byte for byte
  EXPECT_EQ(LoadChain(*d.client, 200, 4), 0) << "never reused, never written down";
}

}  // namespace
}  // namespace kvtier::testing
