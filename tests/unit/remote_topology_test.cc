// RemoteTier against a real 3-master Redis Cluster on 127.0.0.1 (one cluster for the suite):
// keys spread by hash slot, ASK and MOVED during a live slot migration, and a master killed
// mid-run and brought back.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <random>
#include <vector>

#include "testing/redis_harness.h"
#include "testing/test_util.h"
#include "tiers/remote/remote_tier.h"
#include "tiers/remote/value_format.h"

namespace kvtier::remote {
namespace {

using testing::BlockBytes;
using testing::Key;
using testing::RedisCluster;
using testing::RedisMissingReason;
using testing::RedisReplyText;
using testing::RedisServer;
using testing::SmallLayout;

struct Round {
  std::vector<Status> put, got;
  int hits = 0;
  int wrong = 0;  // OK but bytes differ: must never happen
  std::chrono::nanoseconds longest{0};
};

// Puts then gets keys [0, n) of `salt`, checking every hit byte for byte.
Round PutGet(RemoteTier& tier, size_t n, uint64_t salt) {
  Round r;
  std::vector<BlockKey> keys;
  std::vector<std::vector<std::byte>> data, out;
  std::vector<ConstBlock> blocks;
  std::vector<MutableBlock> spans;
  for (size_t i = 0; i < n; ++i) {
    keys.push_back(Key(i, salt));
    data.push_back(BlockBytes(keys.back(), tier.block_bytes()));
    out.emplace_back(tier.block_bytes());
  }
  for (size_t i = 0; i < n; ++i) {
    blocks.emplace_back(data[i]);
    spans.emplace_back(out[i]);
  }
  r.put.assign(n, Status::Ok());
  r.got.assign(n, Status::Ok());
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(tier.Put(keys, blocks, r.put).ok());
  auto t1 = std::chrono::steady_clock::now();
  EXPECT_TRUE(tier.Get(keys, spans, r.got).ok());
  auto t2 = std::chrono::steady_clock::now();
  r.longest = std::max(t1 - t0, t2 - t1);
  for (size_t i = 0; i < n; ++i) {
    if (!r.got[i].ok()) continue;
    ++r.hits;
    if (out[i] != data[i]) ++r.wrong;
  }
  return r;
}

class RemoteClusterTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    shared_.Start(true, [] { return RedisCluster::Start(3); });
    cluster_ = shared_.get();
  }
  static void TearDownTestSuite() {
    shared_.Stop();
    cluster_ = nullptr;
  }
  void SetUp() override {
    std::string reason = RedisMissingReason(/*cluster=*/true);
    if (!reason.empty()) GTEST_SKIP() << reason;
    ASSERT_NE(cluster_, nullptr) << shared_.start_error();
    ASSERT_TRUE(cluster_->WaitHealthy().ok());
  }
  RemoteTierOptions Options() const {
    RemoteTierOptions o;
    o.layout = SmallLayout(64);
    o.capacity_bytes = 64 << 20;
    o.url = cluster_->url();
    o.key_prefix =
        std::string("c:") + ::testing::UnitTest::GetInstance()->current_test_info()->name() + ":";
    o.timeout_ms = 500;
    o.breaker.initial_backoff_ns = 20'000'000;
    o.breaker.max_backoff_ns = 100'000'000;
    return o;
  }
  static std::string MyId(int node) {
    Result<RedisReplyText> id = cluster_->node(node).Command({"CLUSTER", "MYID"});
    return id.ok() ? id->text : "";
  }

  static RedisCluster* cluster_;
  static testing::SuiteRedis<RedisCluster> shared_;
};
RedisCluster* RemoteClusterTest::cluster_ = nullptr;
testing::SuiteRedis<RedisCluster> RemoteClusterTest::shared_;

TEST_F(RemoteClusterTest, SpreadsKeysOverEveryMasterAndRoundTrips) {
  auto tier = testing::OpenRemoteTier(Options());
  ASSERT_NE(tier, nullptr);
  EXPECT_TRUE(tier->is_cluster());
  EXPECT_EQ(tier->remote_stats().nodes, 3);
  Round r = PutGet(*tier, 300, 1);
  for (const Status& s : r.put) ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(r.hits, 300);
  EXPECT_EQ(r.wrong, 0);
  EXPECT_EQ(tier->remote_stats().moved, 0u) << "routing by CRC16 slots should need no redirect";
  for (int n = 0; n < 3; ++n) {
    Result<RedisReplyText> size = cluster_->node(n).Command({"DBSIZE"});
    ASSERT_TRUE(size.ok());
    EXPECT_GT(std::atoi(size->text.c_str()), 50) << "node " << n;
  }
  // Exists and Erase route the same way.
  std::vector<BlockKey> keys = {Key(0, 1), Key(1, 1), Key(2, 1), Key(999, 1)};
  bool exists[4];
  ASSERT_TRUE(tier->Exists(keys, exists).ok());
  EXPECT_TRUE(exists[0] && exists[1] && exists[2]);
  EXPECT_FALSE(exists[3]);
  ASSERT_TRUE(tier->Erase(keys).ok());
  ASSERT_TRUE(tier->Exists(keys, exists).ok());
  EXPECT_FALSE(exists[0] || exists[1] || exists[2]);
}

TEST_F(RemoteClusterTest, FollowsAskAndMovedDuringASlotMigration) {
  RemoteTierOptions o = Options();
  auto tier = testing::OpenRemoteTier(o);
  ASSERT_NE(tier, nullptr);
  // Two block keys in one hash slot.
  BlockKey k1 = Key(0, 2);
  int slot = KeyHashSlot(RedisKeyOf(o.key_prefix, k1));
  BlockKey k2;
  for (uint64_t i = 1;; ++i) {
    k2 = Key(i, 2);
    if (KeyHashSlot(RedisKeyOf(o.key_prefix, k2)) == slot) break;
  }
  const std::string r1 = RedisKeyOf(o.key_prefix, k1);
  Result<int> src_r = cluster_->NodeOfKey(r1);
  ASSERT_TRUE(src_r.ok()) << src_r.status().ToString();
  int src = *src_r, dst = (src + 1) % 3;
  std::string src_id = MyId(src), dst_id = MyId(dst);
  ASSERT_FALSE(src_id.empty());
  std::vector<std::byte> d1 = BlockBytes(k1, tier->block_bytes());
  std::vector<std::byte> d2 = BlockBytes(k2, tier->block_bytes());
  auto put = [&](const BlockKey& k, const std::vector<std::byte>& d) {
    ConstBlock b[1] = {d};
    Status s[1];
    EXPECT_TRUE(tier->Put(std::span(&k, 1), b, s).ok());
    return s[0];
  };
  auto get = [&](const BlockKey& k, const std::vector<std::byte>& want) {
    std::vector<std::byte> buf(tier->block_bytes());
    MutableBlock b[1] = {buf};
    Status s[1];
    EXPECT_TRUE(tier->Get(std::span(&k, 1), b, s).ok());
    if (s[0].ok() && buf != want) return Status::Internal("wrong bytes served");
    return s[0];
  };
  ASSERT_TRUE(put(k1, d1).ok());

  auto cmd = [&](int node, std::vector<std::string> argv) {
    Result<RedisReplyText> r = cluster_->node(node).Command(argv);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_FALSE(r->error) << argv[0] << " " << argv[1] << ": " << r->text;
  };
  cmd(dst, {"CLUSTER", "SETSLOT", std::to_string(slot), "IMPORTING", src_id});
  cmd(src, {"CLUSTER", "SETSLOT", std::to_string(slot), "MIGRATING", dst_id});

  // A new key of a migrating slot goes to the target by ASK.
  Status s = put(k2, d2);
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_GE(tier->remote_stats().asks, 1u);
  EXPECT_TRUE(get(k1, d1).ok());  // still on the source
  s = get(k2, d2);
  EXPECT_TRUE(s.ok()) << s.ToString();

  // Move k1 too, then hand the slot over for good: the source now answers MOVED.
  cmd(src, {"MIGRATE", "127.0.0.1", std::to_string(cluster_->node(dst).port()), "", "0", "5000",
            "KEYS", r1});
  s = get(k1, d1);
  EXPECT_TRUE(s.ok()) << s.ToString();
  for (int n = 0; n < 3; ++n) {
    cmd(n, {"CLUSTER", "SETSLOT", std::to_string(slot), "NODE", dst_id});
  }
  uint64_t moved_before = tier->remote_stats().moved;
  s = get(k1, d1);
  EXPECT_TRUE(s.ok()) << s.ToString();
  s = get(k2, d2);
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_GE(tier->remote_stats().moved, moved_before + 1);
  // After the MOVED the slot map is right: no more redirects for this slot.
  uint64_t moved_after = tier->remote_stats().moved;
  EXPECT_TRUE(get(k1, d1).ok());
  EXPECT_EQ(tier->remote_stats().moved, moved_after);
  ASSERT_TRUE(cluster_->WaitHealthy().ok());
}

TEST_F(RemoteClusterTest, KilledMasterCostsOnlyItsKeysAndComesBack) {
  RemoteTierOptions o = Options();
  o.timeout_ms = 400;
  auto tier = testing::OpenRemoteTier(o);
  ASSERT_NE(tier, nullptr);
  const size_t n = 60;
  const auto slack = std::chrono::milliseconds(o.timeout_ms + 400);
  for (uint64_t round = 0; round < 3; ++round) {
    Round r = PutGet(*tier, n, 100 + round);
    EXPECT_EQ(r.hits, static_cast<int>(n));
    EXPECT_EQ(r.wrong, 0);
  }
  RedisServer& victim = cluster_->node(1);
  ASSERT_TRUE(victim.Kill().ok());
  int rounds_with_failures = 0;
  for (uint64_t round = 3; round < 12; ++round) {
    Round r = PutGet(*tier, n, 100 + round);
    EXPECT_EQ(r.wrong, 0) << "a wrong block was served";
    EXPECT_LT(r.longest, slack) << "a call was held past its deadline";
    // About a third of the slots died with the master; the rest keep serving.
    EXPECT_GT(r.hits, static_cast<int>(n / 3)) << "round " << round;
    EXPECT_LT(r.hits, static_cast<int>(n)) << "round " << round;
    for (size_t i = 0; i < n; ++i) {
      if (!r.got[i].ok()) {
        EXPECT_TRUE(r.got[i].code() == StatusCode::kUnavailable || r.got[i].IsNotFound())
            << r.got[i].ToString();
      }
    }
    rounds_with_failures += r.hits < static_cast<int>(n);
  }
  EXPECT_EQ(rounds_with_failures, 9);
  EXPECT_GE(tier->remote_stats().fast_failures, 1u);

  ASSERT_TRUE(victim.Restart().ok());
  ASSERT_TRUE(cluster_->WaitHealthy().ok());
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  Round r;
  for (uint64_t round = 20; std::chrono::steady_clock::now() < until; ++round) {
    r = PutGet(*tier, n, 100 + round);
    EXPECT_EQ(r.wrong, 0);
    if (r.hits == static_cast<int>(n)) break;
  }
  EXPECT_EQ(r.hits, static_cast<int>(n)) << "hits did not come back after the master returned";
}

}  // namespace
}  // namespace kvtier::remote
