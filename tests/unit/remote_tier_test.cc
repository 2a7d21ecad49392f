// RemoteTier against a real single redis-server on 127.0.0.1: round trips, misses, TTL, AUTH,
// maxmemory, values corrupted inside Redis, a dead or hung server, and the option parser.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include "testing/redis_harness.h"
#include "testing/test_util.h"
#include "tiers/remote/remote_tier.h"
#include "tiers/remote/value_format.h"

namespace kvtier::remote {
namespace {

using testing::BlockBytes;
using testing::Key;
using testing::RedisMissingReason;
using testing::RedisServer;
using testing::SmallLayout;

// While alive, captures what the default logger writes: the tier logged nothing about outages
// and corruption, so these tests check that it does now.
class LogCapture {
 public:
  LogCapture() : sink_(std::make_shared<spdlog::sinks::ostream_sink_mt>(out_)) {
    spdlog::default_logger()->sinks().push_back(sink_);
  }
  ~LogCapture() {
    auto& sinks = spdlog::default_logger()->sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), sink_), sinks.end());
  }
  std::string text() {
    sink_->flush();
    return out_.str();
  }

 private:
  std::ostringstream out_;
  std::shared_ptr<spdlog::sinks::ostream_sink_mt> sink_;
};

class RemoteTierTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    shared_.Start(false, [] { return RedisServer::Start({}); });
    server_ = shared_.get();
  }
  static void TearDownTestSuite() {
    shared_.Stop();
    server_ = nullptr;
  }
  void SetUp() override {
    std::string reason = RedisMissingReason();
    if (!reason.empty()) GTEST_SKIP() << reason;
    ASSERT_NE(server_, nullptr) << shared_.start_error();
  }

  // A distinct key prefix per test keeps tests apart on the shared server.
  RemoteTierOptions Options(const std::string& url) const {
    RemoteTierOptions o;
    o.layout = SmallLayout(64);
    o.capacity_bytes = 64 << 20;
    o.url = url;
    o.key_prefix =
        std::string("t:") + ::testing::UnitTest::GetInstance()->current_test_info()->name() + ":";
    o.breaker.initial_backoff_ns = 20'000'000;
    o.breaker.max_backoff_ns = 100'000'000;
    return o;
  }

  // Puts blocks for keys 0..n-1 (salt) and returns their contents.
  static std::vector<std::vector<std::byte>> PutKeys(RemoteTier& tier, size_t n, uint64_t salt,
                                                     std::vector<Status>* results) {
    std::vector<BlockKey> keys;
    std::vector<std::vector<std::byte>> data;
    std::vector<ConstBlock> blocks;
    for (size_t i = 0; i < n; ++i) {
      keys.push_back(Key(i, salt));
      data.push_back(BlockBytes(keys.back(), tier.block_bytes()));
    }
    for (auto& d : data) blocks.emplace_back(d);
    results->assign(n, Status::Ok());
    EXPECT_TRUE(tier.Put(keys, blocks, *results).ok());
    return data;
  }
  static std::vector<Status> GetKeys(RemoteTier& tier, size_t n, uint64_t salt,
                                     std::vector<std::vector<std::byte>>* out) {
    std::vector<BlockKey> keys;
    out->assign(n, std::vector<std::byte>(tier.block_bytes()));
    std::vector<MutableBlock> spans;
    for (size_t i = 0; i < n; ++i) {
      keys.push_back(Key(i, salt));
      spans.emplace_back((*out)[i]);
    }
    std::vector<Status> results(n);
    EXPECT_TRUE(tier.Get(keys, spans, results).ok());
    return results;
  }

  static RedisServer* server_;
  static testing::SuiteRedis<RedisServer> shared_;
};
RedisServer* RemoteTierTest::server_ = nullptr;
testing::SuiteRedis<RedisServer> RemoteTierTest::shared_;

TEST_F(RemoteTierTest, RoundTripIsByteExactAndCapabilitiesSayShared) {
  auto tier = testing::OpenRemoteTier(Options(server_->url()));
  ASSERT_NE(tier, nullptr);
  EXPECT_FALSE(tier->is_cluster());
  TierCapabilities caps = tier->capabilities();
  EXPECT_FALSE(caps.managed_by_cache);
  EXPECT_FALSE(caps.authoritative);
  EXPECT_TRUE(caps.shared);
  EXPECT_TRUE(caps.verify_on_load);
  EXPECT_TRUE(caps.verifies_reads);
  std::vector<Status> put;
  auto data = PutKeys(*tier, 40, 1, &put);
  for (const Status& s : put) ASSERT_TRUE(s.ok()) << s.ToString();
  std::vector<std::vector<std::byte>> out;
  std::vector<Status> got = GetKeys(*tier, 40, 1, &out);
  for (size_t i = 0; i < 40; ++i) {
    ASSERT_TRUE(got[i].ok()) << i << ": " << got[i].ToString();
    EXPECT_EQ(out[i], data[i]) << i;
  }
  // The value in Redis is the header, the block and the checksum trailer.
  Result<testing::RedisReplyText> len =
      server_->Command({"STRLEN", RedisKeyOf(tier->options().key_prefix, Key(0, 1))});
  ASSERT_TRUE(len.ok());
  EXPECT_EQ(len->text,
            std::to_string(kValueHeaderBytes + tier->block_bytes() + kValueTrailerBytes));
  TierStats st = tier->stats();
  EXPECT_EQ(st.hits, 40u);
  EXPECT_EQ(st.puts, 40u);
}

// 2 MiB blocks take the large-value path: several connections per call, send windows, a Put
// checksummed a value ahead, a Get read straight into the caller's buffer with SO_RCVLOWAT
// raised; the short replies that follow on the same pooled connections must not wait on it.
TEST_F(RemoteTierTest, LargeBlocksRoundTripAndPooledConnectionsStayUsable) {
  RemoteTierOptions o = Options(server_->url());
  o.layout.head_dim = 1024;  // 2 layers * K,V * 2 heads * 1024 * 4 B * 64 tokens = 2 MiB
  o.timeout_ms = 5000;       // a short reply stuck behind a stale low-water mark fails here
  auto tier = testing::OpenRemoteTier(o);
  ASSERT_NE(tier, nullptr);
  ASSERT_EQ(tier->block_bytes(), 2u << 20);
  std::vector<Status> put;
  auto data = PutKeys(*tier, 6, 7, &put);
  for (const Status& s : put) ASSERT_TRUE(s.ok()) << s.ToString();
  for (int round = 0; round < 2; ++round) {
    std::vector<std::vector<std::byte>> out;
    std::vector<Status> got = GetKeys(*tier, 6, 7, &out);
    for (size_t i = 0; i < 6; ++i) {
      ASSERT_TRUE(got[i].ok()) << i << ": " << got[i].ToString();
      EXPECT_TRUE(out[i] == data[i]) << "block " << i << " differs";
    }
    std::vector<BlockKey> keys = {Key(0, 7), Key(99, 7)};
    bool exists[2] = {false, true};
    ASSERT_TRUE(tier->Exists(keys, exists).ok());
    EXPECT_TRUE(exists[0]);
    EXPECT_FALSE(exists[1]);
  }
}

TEST_F(RemoteTierTest, MissesExistsAndErase) {
  auto tier = testing::OpenRemoteTier(Options(server_->url()));
  ASSERT_NE(tier, nullptr);
  std::vector<Status> put;
  PutKeys(*tier, 3, 2, &put);
  std::vector<BlockKey> keys = {Key(0, 2), Key(99, 2), Key(2, 2)};
  bool exists[3] = {false, true, false};
  ASSERT_TRUE(tier->Exists(keys, exists).ok());
  EXPECT_TRUE(exists[0]);
  EXPECT_FALSE(exists[1]);
  EXPECT_TRUE(exists[2]);
  std::vector<std::byte> buf(tier->block_bytes());
  MutableBlock one[1] = {buf};
  Status r[1];
  BlockKey missing[1] = {Key(99, 2)};
  ASSERT_TRUE(tier->Get(missing, one, r).ok());
  EXPECT_TRUE(r[0].IsNotFound()) << r[0].ToString();
  ASSERT_TRUE(tier->Erase(std::span(keys).first(1)).ok());
  ASSERT_TRUE(tier->Exists(keys, exists).ok());
  EXPECT_FALSE(exists[0]);
  EXPECT_TRUE(exists[2]);
}

TEST_F(RemoteTierTest, WrongSizedBlockFailsAloneAndNeverReachesRedis) {
  auto tier = testing::OpenRemoteTier(Options(server_->url()));
  ASSERT_NE(tier, nullptr);
  std::vector<std::byte> good(tier->block_bytes(), std::byte{1});
  std::vector<std::byte> bad(tier->block_bytes() - 1);
  BlockKey keys[2] = {Key(0, 3), Key(1, 3)};
  ConstBlock blocks[2] = {good, bad};
  Status r[2];
  ASSERT_TRUE(tier->Put(keys, blocks, r).ok());
  EXPECT_TRUE(r[0].ok());
  EXPECT_EQ(r[1].code(), StatusCode::kInvalidArgument);
  Result<testing::RedisReplyText> e =
      server_->Command({"EXISTS", RedisKeyOf(tier->options().key_prefix, keys[1])});
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->text, "0");
}

TEST_F(RemoteTierTest, TtlIsSetOnEveryValue) {
  RemoteTierOptions o = Options(server_->url());
  o.ttl_s = 30;
  auto tier = testing::OpenRemoteTier(o);
  ASSERT_NE(tier, nullptr);
  std::vector<Status> put;
  PutKeys(*tier, 2, 4, &put);
  ASSERT_TRUE(put[0].ok()) << put[0].ToString();
  Result<testing::RedisReplyText> ttl =
      server_->Command({"TTL", RedisKeyOf(o.key_prefix, Key(1, 4))});
  ASSERT_TRUE(ttl.ok());
  int secs = std::atoi(ttl->text.c_str());
  EXPECT_GT(secs, 0);
  EXPECT_LE(secs, 30);
  // Without ttl_s values do not expire.
  auto plain = testing::OpenRemoteTier(Options(server_->url()));
  ASSERT_NE(plain, nullptr);
  std::vector<Status> put2;
  PutKeys(*plain, 1, 5, &put2);
  ttl = server_->Command({"TTL", RedisKeyOf(plain->options().key_prefix, Key(0, 5))});
  ASSERT_TRUE(ttl.ok());
  EXPECT_EQ(ttl->text, "-1");
}

TEST_F(RemoteTierTest, ValueCorruptedInsideRedisIsAMissNotServed) {
  auto tier = testing::OpenRemoteTier(Options(server_->url()));
  ASSERT_NE(tier, nullptr);
  std::vector<BlockKey> removed;
  tier->SetRemovalListener([&](std::span<const BlockKey> keys) {
    removed.insert(removed.end(), keys.begin(), keys.end());
  });
  std::vector<Status> put;
  auto data = PutKeys(*tier, 5, 6, &put);
  const std::string& prefix = tier->options().key_prefix;
  // 0: a payload byte flipped; 1: the header's key field changed; 2: truncated;
  // 3: another block's value copied under this key; 4: untouched.
  // Flipped, not overwritten: a fixed byte could equal the one it replaces.
  Result<testing::RedisReplyText> b0 =
      server_->Command({"GETRANGE", RedisKeyOf(prefix, Key(0, 6)), "1000", "1000"});
  ASSERT_TRUE(b0.ok() && b0->text.size() == 1);
  const std::string flipped(1, static_cast<char>(~b0->text[0]));
  ASSERT_TRUE(server_->Command({"SETRANGE", RedisKeyOf(prefix, Key(0, 6)), "1000", flipped}).ok());
  ASSERT_TRUE(server_->Command({"SETRANGE", RedisKeyOf(prefix, Key(1, 6)), "10", "Z"}).ok());
  ASSERT_TRUE(server_->Command({"SET", RedisKeyOf(prefix, Key(2, 6)), "short"}).ok());
  Result<testing::RedisReplyText> v4 = server_->Command({"GET", RedisKeyOf(prefix, Key(4, 6))});
  ASSERT_TRUE(v4.ok());
  ASSERT_TRUE(server_->Command({"SET", RedisKeyOf(prefix, Key(3, 6)), v4->text}).ok());

  std::vector<std::vector<std::byte>> out;
  LogCapture log;
  std::vector<Status> got = GetKeys(*tier, 5, 6, &out);
  EXPECT_NE(log.text().find("4 value(s) failed verification and are deleted"), std::string::npos)
      << log.text();
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(got[i].code(), StatusCode::kCorruption) << i << ": " << got[i].ToString();
  }
  ASSERT_TRUE(got[4].ok());
  EXPECT_EQ(out[4], data[4]);
  EXPECT_EQ(tier->remote_stats().corruptions, 4u);
  // The same count reaches the tier's stats (and from there the Cache's stats and /metrics).
  uint64_t counted = 0;
  for (const auto& c : tier->stats().counters) {
    if (std::string_view(c.name) == "remote_corruptions") counted = c.value;
  }
  EXPECT_EQ(counted, 4u);
  // The tier dropped the bad values from Redis and said so.
  EXPECT_EQ(removed.size(), 4u);
  got = GetKeys(*tier, 5, 6, &out);
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(got[i].IsNotFound()) << i << ": " << got[i].ToString();
}

// A key of the wrong type under a tier key (a list written by something else) was answered
// WRONGTYPE, mapped to Internal and never deleted: EXISTS kept finding it, so the block missed
// for ever. It is corruption: not served, deleted, reported removed.
TEST_F(RemoteTierTest, WrongTypeValueIsDroppedLikeCorruption) {
  auto tier = testing::OpenRemoteTier(Options(server_->url()));
  ASSERT_NE(tier, nullptr);
  std::vector<BlockKey> removed;
  tier->SetRemovalListener([&](std::span<const BlockKey> keys) {
    removed.insert(removed.end(), keys.begin(), keys.end());
  });
  std::vector<Status> put;
  PutKeys(*tier, 2, 12, &put);
  const std::string rkey = RedisKeyOf(tier->options().key_prefix, Key(0, 12));
  ASSERT_TRUE(server_->Command({"DEL", rkey}).ok());
  ASSERT_TRUE(server_->Command({"RPUSH", rkey, "a", "b"}).ok());
  std::vector<std::vector<std::byte>> out;
  std::vector<Status> got = GetKeys(*tier, 2, 12, &out);
  EXPECT_EQ(got[0].code(), StatusCode::kCorruption) << got[0].ToString();
  EXPECT_TRUE(got[1].ok()) << got[1].ToString();
  EXPECT_EQ(tier->remote_stats().corruptions, 1u);
  ASSERT_EQ(removed.size(), 1u);
  Result<testing::RedisReplyText> exists = server_->Command({"EXISTS", rkey});
  ASSERT_TRUE(exists.ok());
  EXPECT_EQ(exists->text, "0");
}

// A server of 3 MiB that refuses writes past it (noeviction).
Result<std::unique_ptr<RedisServer>> SmallServer() {
  RedisServer::Options so;
  so.args = {"--maxmemory", "3mb", "--maxmemory-policy", "noeviction"};
  return RedisServer::Start(so);
}

// Issue 27 item 6: a server at maxmemory refused writes and the tier only counted them, so
// nothing in the log said why the remote tier stored nothing. Now it says so, at most every 10 s.
TEST_F(RemoteTierTest, WritesRefusedAtMaxmemoryAreLoggedAtMostOnceAPeriod) {
  Result<std::unique_ptr<RedisServer>> small = SmallServer();
  ASSERT_TRUE(small.ok()) << small.status().ToString();
  auto tier = testing::OpenRemoteTier(Options((*small)->url()));
  ASSERT_NE(tier, nullptr);
  LogCapture log;
  std::vector<Status> put;
  PutKeys(*tier, 400, 8, &put);  // 6.4 MiB into a 3 MiB server
  ASSERT_GT(tier->remote_stats().oom_rejections, 1u);
  const std::string text = log.text();
  size_t lines = 0;
  for (size_t at = text.find("refused for room"); at != std::string::npos;
       at = text.find("refused for room", at + 1))
    ++lines;
  EXPECT_EQ(lines, 1u) << text;
  EXPECT_NE(text.find("maxmemory"), std::string::npos) << text;
}

// Issue 27 item 6: resident blocks were used_memory / block_bytes, and used_memory counts the
// server's own memory: an empty Redis showed 57 blocks. Now the keys are counted.
TEST_F(RemoteTierTest, ResidentBlocksAreCountedNotDerivedFromTheServersMemory) {
  Result<std::unique_ptr<RedisServer>> own = RedisServer::Start({});
  ASSERT_TRUE(own.ok()) << own.status().ToString();
  auto tier = testing::OpenRemoteTier(Options((*own)->url()));
  ASSERT_NE(tier, nullptr);
  EXPECT_EQ(tier->stats().resident_blocks, 0u);
  std::vector<Status> put;
  PutKeys(*tier, 10, 9, &put);
  // Usage is re-read every second: poll for it (up to 5 s).
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (tier->stats().resident_blocks != 10 && std::chrono::steady_clock::now() < end)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(tier->stats().resident_blocks, 10u);
}

TEST_F(RemoteTierTest, ServerAtMaxmemoryRefusesWritesAndServesNothingWrong) {
  Result<std::unique_ptr<RedisServer>> small = SmallServer();
  ASSERT_TRUE(small.ok()) << small.status().ToString();
  auto tier = testing::OpenRemoteTier(Options((*small)->url()));
  ASSERT_NE(tier, nullptr);
  const size_t n = 400;  // 6.4 MiB of blocks into a 3 MiB server
  std::vector<Status> put;
  auto data = PutKeys(*tier, n, 7, &put);
  size_t ok = 0, full = 0;
  for (const Status& s : put) {
    if (s.ok()) ++ok;
    if (s.code() == StatusCode::kResourceExhausted) ++full;
  }
  EXPECT_GT(ok, 0u);
  EXPECT_GT(full, 0u);
  EXPECT_EQ(ok + full, n) << "every put either stored or was refused for room";
  EXPECT_GT(tier->remote_stats().oom_rejections, 0u);
  std::vector<std::vector<std::byte>> out;
  std::vector<Status> got = GetKeys(*tier, n, 7, &out);
  for (size_t i = 0; i < n; ++i) {
    if (put[i].ok()) {
      ASSERT_TRUE(got[i].ok()) << i << ": " << got[i].ToString();
      EXPECT_EQ(out[i], data[i]) << i;
    } else {
      EXPECT_TRUE(got[i].IsNotFound()) << i << ": " << got[i].ToString();
    }
  }
}

TEST_F(RemoteTierTest, AuthWithPasswordAndAclUser) {
  RedisServer::Options so;
  so.args = {"--requirepass", "s3cret", "--user", "alice", "on", ">alicepw", "~*", "&*", "+@all"};
  Result<std::unique_ptr<RedisServer>> secured = RedisServer::Start(so);
  ASSERT_TRUE(secured.ok()) << secured.status().ToString();
  const std::string addr = (*secured)->address();

  auto by_password = testing::OpenRemoteTier(Options("redis://:s3cret@" + addr));
  ASSERT_NE(by_password, nullptr);
  std::vector<Status> put;
  PutKeys(*by_password, 2, 8, &put);
  EXPECT_TRUE(put[0].ok()) << put[0].ToString();

  RemoteTierOptions acl = Options("redis://" + addr);
  acl.user = "alice";
  acl.password = "alicepw";
  auto by_user = testing::OpenRemoteTier(acl);
  ASSERT_NE(by_user, nullptr);
  std::vector<std::vector<std::byte>> out;
  acl.key_prefix = by_password->options().key_prefix;
  auto same_prefix = testing::OpenRemoteTier(acl);
  ASSERT_NE(same_prefix, nullptr);
  std::vector<Status> got = GetKeys(*same_prefix, 2, 8, &out);
  EXPECT_TRUE(got[0].ok()) << got[0].ToString();

  Result<std::unique_ptr<RemoteTier>> wrong = RemoteTier::Open(Options("redis://:nope@" + addr));
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(wrong.status().message().find("password"), std::string::npos)
      << wrong.status().ToString();
  EXPECT_EQ(wrong.status().message().find("nope"), std::string::npos) << "password leaked";
  acl.password = "bad";
  Result<std::unique_ptr<RemoteTier>> wrong_user = RemoteTier::Open(acl);
  ASSERT_FALSE(wrong_user.ok());
  EXPECT_NE(wrong_user.status().message().find("user"), std::string::npos);
  Result<std::unique_ptr<RemoteTier>> none = RemoteTier::Open(Options("redis://" + addr));
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kInvalidArgument) << none.status().ToString();
}

TEST_F(RemoteTierTest, DeadServerFailsFastThenComesBack) {
  Result<std::unique_ptr<RedisServer>> s = RedisServer::Start({});
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  RedisServer& server = **s;
  RemoteTierOptions o = Options(server.url());
  o.timeout_ms = 300;
  auto tier = testing::OpenRemoteTier(o);
  ASSERT_NE(tier, nullptr);
  std::vector<Status> put;
  PutKeys(*tier, 4, 9, &put);
  ASSERT_TRUE(put[0].ok());
  LogCapture log;
  ASSERT_TRUE(server.Kill().ok());

  for (int round = 0; round < 6; ++round) {
    auto start = std::chrono::steady_clock::now();
    std::vector<std::vector<std::byte>> out;
    std::vector<Status> got = GetKeys(*tier, 4, 9, &out);
    auto took = std::chrono::steady_clock::now() - start;
    EXPECT_LT(took, std::chrono::milliseconds(o.timeout_ms + 200)) << "held past the deadline";
    for (const Status& g : got) EXPECT_EQ(g.code(), StatusCode::kUnavailable) << g.ToString();
  }
  RemoteStats rs = tier->remote_stats();
  EXPECT_GE(rs.breaker_opens, 1u);
  EXPECT_GE(rs.fast_failures, 1u) << "an open breaker should refuse without connecting";
  EXPECT_NE(log.text().find(server.address() + ": circuit opened"), std::string::npos)
      << log.text();

  ASSERT_TRUE(server.Restart().ok());
  // The breaker probes again after its backoff (<= 125 ms here); the data died with the server.
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  bool back = false;
  while (!back && std::chrono::steady_clock::now() < until) {
    PutKeys(*tier, 4, 9, &put);
    back = put[0].ok();
  }
  ASSERT_TRUE(back) << put[0].ToString();
  std::vector<std::vector<std::byte>> out;
  std::vector<Status> got = GetKeys(*tier, 4, 9, &out);
  for (const Status& g : got) EXPECT_TRUE(g.ok()) << g.ToString();
  EXPECT_NE(log.text().find(server.address() + ": answers again; circuit closed"),
            std::string::npos)
      << log.text();
}

TEST_F(RemoteTierTest, HungServerIsCutOffAtTheDeadline) {
  Result<std::unique_ptr<RedisServer>> s = RedisServer::Start({});
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  RemoteTierOptions o = Options((*s)->url());
  o.timeout_ms = 200;
  auto tier = testing::OpenRemoteTier(o);
  ASSERT_NE(tier, nullptr);
  std::vector<Status> put;
  PutKeys(*tier, 2, 10, &put);
  ASSERT_TRUE(put[0].ok());
  LogCapture log;
  ASSERT_EQ(kill((*s)->pid(), SIGSTOP), 0);
  auto start = std::chrono::steady_clock::now();
  std::vector<std::vector<std::byte>> out;
  std::vector<Status> got = GetKeys(*tier, 2, 10, &out);
  auto took = std::chrono::steady_clock::now() - start;
  ASSERT_EQ(kill((*s)->pid(), SIGCONT), 0);
  EXPECT_GE(took, std::chrono::milliseconds(150));
  EXPECT_LT(took, std::chrono::milliseconds(700));
  for (const Status& g : got) EXPECT_EQ(g.code(), StatusCode::kUnavailable) << g.ToString();
  EXPECT_GE(tier->remote_stats().timeouts, 1u);
  EXPECT_NE(log.text().find("timed out after 200 ms"), std::string::npos) << log.text();
  got = GetKeys(*tier, 2, 10, &out);  // a fresh connection; the server runs again
  for (const Status& g : got) EXPECT_TRUE(g.ok()) << g.ToString();
}

// A fake Redis on a loopback port: it accepts connections and, to every request, answers at
// most one byte every `drip_ms` (never a whole reply), or nothing at all when drip_ms is 0.
class StallingServer {
 public:
  explicit StallingServer(int drip_ms) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), len) != 0 ||
        ::listen(listen_fd_, 8) != 0 ||
        ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      return;
    }
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this, drip_ms] {
      std::vector<int> clients;
      const std::string reply = "$100000\r\n" + std::string(64, 'x');
      size_t sent = 0;
      while (!stop_.load()) {
        pollfd p{listen_fd_, POLLIN, 0};
        if (::poll(&p, 1, drip_ms > 0 ? drip_ms : 50) > 0) {
          const int c = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
          if (c >= 0) clients.push_back(c);
        }
        if (drip_ms > 0 && sent < reply.size()) {
          for (int c : clients) (void)::send(c, &reply[sent], 1, MSG_NOSIGNAL);
          ++sent;
        }
      }
      for (int c : clients) ::close(c);
    });
  }
  ~StallingServer() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
    if (listen_fd_ >= 0) ::close(listen_fd_);
  }
  std::string url() const { return "redis://127.0.0.1:" + std::to_string(port_); }
  int port() const { return port_; }

 private:
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// A server dripping a byte well within the op timeout held startup for as long as it dripped
// (each read was bounded, the whole reply was not): 42.9 s with timeout_ms 1000. A silent one
// failed with "Resource temporarily unavailable". Now one deadline bounds the whole call, and
// the error says it timed out.
TEST(RemoteTierDeadlineTest, StallingServerIsCutOffAtTheOpenDeadline) {
  for (int drip_ms : {100, 0}) {
    StallingServer server(drip_ms);
    ASSERT_NE(server.port(), 0);
    RemoteTierOptions o;
    o.layout = SmallLayout(64);
    o.capacity_bytes = 64 << 20;
    o.url = server.url();
    o.timeout_ms = 400;
    const auto start = std::chrono::steady_clock::now();
    Result<std::unique_ptr<RemoteTier>> t = RemoteTier::Open(o);
    const auto took = std::chrono::steady_clock::now() - start;
    ASSERT_FALSE(t.ok()) << drip_ms;
    EXPECT_EQ(t.status().code(), StatusCode::kUnavailable) << t.status().ToString();
    EXPECT_NE(t.status().message().find("timed out after"), std::string::npos)
        << t.status().ToString();
    EXPECT_LT(took, std::chrono::milliseconds(1500)) << "drip every " << drip_ms << " ms";
  }
}

TEST_F(RemoteTierTest, UnreachableAtOpenUnlessLazy) {
  // A port nothing listens on: start a server to learn a free port, then stop it.
  Result<std::unique_ptr<RedisServer>> s = RedisServer::Start({});
  ASSERT_TRUE(s.ok());
  std::string url = (*s)->url();
  ASSERT_TRUE((*s)->Stop().ok());
  Result<std::unique_ptr<RemoteTier>> t = RemoteTier::Open(Options(url));
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kUnavailable) << t.status().ToString();
  RemoteTierOptions lazy = Options(url);
  lazy.lazy_connect = true;
  auto tier = testing::OpenRemoteTier(lazy);
  ASSERT_NE(tier, nullptr);
  std::vector<std::vector<std::byte>> out;
  std::vector<Status> got = GetKeys(*tier, 1, 11, &out);
  EXPECT_EQ(got[0].code(), StatusCode::kUnavailable);
  ASSERT_TRUE((*s)->Restart().ok());
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  std::vector<Status> put;
  do {
    PutKeys(*tier, 1, 11, &put);
  } while (!put[0].ok() && std::chrono::steady_clock::now() < until);
  EXPECT_TRUE(put[0].ok()) << put[0].ToString();
}

TEST_F(RemoteTierTest, ConcurrentCallersSeeTheirOwnBytes) {
  auto tier = testing::OpenRemoteTier(Options(server_->url()));
  ASSERT_NE(tier, nullptr);
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 5; ++round) {
        uint64_t salt = 100 + t * 10 + round;
        std::vector<Status> put;
        auto data = PutKeys(*tier, 8, salt, &put);
        std::vector<std::vector<std::byte>> out;
        std::vector<Status> got = GetKeys(*tier, 8, salt, &out);
        for (size_t i = 0; i < 8; ++i) {
          if (!put[i].ok() || !got[i].ok() || out[i] != data[i]) bad.fetch_add(1);
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
}

TEST(RemoteTierOptionsTest, ParamsAreCheckedAndNamed) {
  KvLayout l = SmallLayout(64);
  auto parse = [&](std::map<std::string, std::string> p) {
    return RemoteTierOptionsFromParams("remote", l, 1 << 20, p);
  };
  Result<RemoteTierOptions> ok = parse({{"url", "redis://127.0.0.1:6379"},
                                        {"timeout_ms", "250"},
                                        {"ttl_s", "60"},
                                        {"user", "u"},
                                        {"password", "p"},
                                        {"lazy_connect", "true"}});
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->timeout_ms, 250);
  EXPECT_EQ(ok->ttl_s, 60);
  EXPECT_EQ(ok->user, "u");
  EXPECT_TRUE(ok->lazy_connect);
  struct Case {
    std::map<std::string, std::string> params;
    const char* names;
  } cases[] = {
      {{}, "params.url"},
      {{{"url", "http://x"}}, "url"},
      {{{"url", "redis://h:1"}, {"timeout_ms", "0"}}, "params.timeout_ms"},
      {{{"url", "redis://h:1"}, {"timeout_ms", "fast"}}, "params.timeout_ms"},
      {{{"url", "redis://h:1"}, {"ttl_s", "-1"}}, "params.ttl_s"},
      {{{"url", "redis://h:1"}, {"mode", "ring"}}, "mode"},
      {{{"url", "redis://h:1"}, {"key_prefix", "{a}"}}, "key_prefix"},
      {{{"url", "redis://h:1"}, {"lazy_connect", "maybe"}}, "params.lazy_connect"},
      {{{"url", "redis://h:1"}, {"breaker_failures", "0"}}, "params.breaker_failures"},
      {{{"url", "redis://h:1"}, {"urll", "x"}}, "params.urll"},
  };
  for (const Case& c : cases) {
    Result<RemoteTierOptions> r = parse(c.params);
    ASSERT_FALSE(r.ok()) << c.names;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(c.names), std::string::npos) << r.status().ToString();
  }
}

}  // namespace
}  // namespace kvtier::remote
