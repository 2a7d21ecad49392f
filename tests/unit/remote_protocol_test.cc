// Unit tests of the remote tier's pure parts: value header, URL, hash slots, CLUSTER SLOTS and
// redirect parsing, the streaming RESP reader and the circuit breaker. No server needed.
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tiers/remote/circuit_breaker.h"
#include "tiers/remote/cluster_slots.h"
#include "tiers/remote/redis_url.h"
#include "tiers/remote/resp_reader.h"
#include "tiers/remote/value_format.h"

namespace kvtier::remote {
namespace {

std::vector<std::byte> Bytes(std::string_view s) {
  std::vector<std::byte> v(s.size());
  std::memcpy(v.data(), s.data(), s.size());
  return v;
}

std::vector<std::byte> RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::byte> v(n);
  for (auto& b : v) b = static_cast<std::byte>(rng());
  return v;
}

// ---- value header ----

TEST(RemoteValueTest, RoundTripsAndVerifies) {
  BlockKey key{0x0123456789abcdef, 0xfedcba9876543210};
  std::vector<std::byte> payload = RandomBytes(1000, 7);
  ValueHeaderBytes h = EncodeValueHeader({key, 42, payload.size()});
  ValueTrailerBytes t = EncodeValueTrailer(Checksum64(payload));
  Result<ValueHeader> back = DecodeValueHeader(h);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->key, key);
  EXPECT_EQ(back->layout_fingerprint, 42u);
  EXPECT_EQ(back->payload_bytes, 1000u);
  EXPECT_TRUE(VerifyValue(h, payload, t, key, 42).ok());
  EXPECT_TRUE(VerifyValueDigest(h, payload.size(), t, Checksum64(payload), key, 42).ok());
}

TEST(RemoteValueTest, RejectsEveryKindOfMismatch) {
  BlockKey key{1, 2};
  std::vector<std::byte> payload = RandomBytes(256, 9);
  ValueHeaderBytes h = EncodeValueHeader({key, 42, payload.size()});
  ValueTrailerBytes t = EncodeValueTrailer(Checksum64(payload));
  EXPECT_EQ(VerifyValue(h, payload, t, BlockKey{1, 3}, 42).code(), StatusCode::kCorruption);
  EXPECT_EQ(VerifyValue(h, payload, t, key, 43).code(), StatusCode::kCorruption);
  EXPECT_EQ(VerifyValue(h, std::span(payload).first(255), t, key, 42).code(),
            StatusCode::kCorruption);
  std::vector<std::byte> flipped = payload;
  flipped[100] ^= std::byte{1};
  EXPECT_EQ(VerifyValue(h, flipped, t, key, 42).code(), StatusCode::kCorruption);
  ValueTrailerBytes bad_trailer = t;
  bad_trailer[3] ^= std::byte{4};
  EXPECT_EQ(VerifyValue(h, payload, bad_trailer, key, 42).code(), StatusCode::kCorruption);
  EXPECT_EQ(VerifyValue(h, payload, std::span(t).first(7), key, 42).code(),
            StatusCode::kCorruption);
  ValueHeaderBytes bad_magic = h;
  bad_magic[0] ^= std::byte{0xff};
  EXPECT_EQ(VerifyValue(bad_magic, payload, t, key, 42).code(), StatusCode::kCorruption);
  ValueHeaderBytes bad_version = h;
  bad_version[4] = std::byte{9};
  EXPECT_EQ(DecodeValueHeader(bad_version).status().code(), StatusCode::kCorruption);
  ValueHeaderBytes reserved = h;
  reserved[44] = std::byte{1};
  EXPECT_EQ(DecodeValueHeader(reserved).status().code(), StatusCode::kCorruption);
  EXPECT_EQ(DecodeValueHeader(std::span(h).first(47)).status().code(), StatusCode::kCorruption);
}

TEST(RemoteValueTest, HeaderIsLittleEndianWithMagicFirst) {
  ValueHeaderBytes h = EncodeValueHeader({BlockKey{0x1122334455667788, 0}, 0, 0});
  EXPECT_EQ(std::memcmp(h.data(), "KVTR", 4), 0);
  EXPECT_EQ(h[4], std::byte{1});   // version 1
  EXPECT_EQ(h[6], std::byte{48});  // header size
  EXPECT_EQ(h[8], std::byte{0x88});
  EXPECT_EQ(h[15], std::byte{0x11});
  ValueTrailerBytes t = EncodeValueTrailer(0x0102030405060708);
  EXPECT_EQ(t[0], std::byte{0x08});
  EXPECT_EQ(t[7], std::byte{0x01});
}

TEST(RemoteValueTest, RedisKeyIsPrefixPlusHex) {
  BlockKey key{0xab, 0xcd};
  EXPECT_EQ(RedisKeyOf("kvtier:", key), "kvtier:" + key.ToHex());
}

// ---- URL ----

TEST(RedisUrlTest, ParsesHostsCredentialsAndDb) {
  Result<RedisUrl> u = ParseRedisUrl("redis://alice:s%40cret@10.0.0.1:7000,10.0.0.2,[::1]:7002/0");
  ASSERT_TRUE(u.ok()) << u.status().ToString();
  EXPECT_EQ(u->user, "alice");
  EXPECT_EQ(u->password, "s@cret");
  ASSERT_EQ(u->seeds.size(), 3u);
  EXPECT_EQ(u->seeds[0], (NodeAddress{"10.0.0.1", 7000}));
  EXPECT_EQ(u->seeds[1], (NodeAddress{"10.0.0.2", 6379}));
  EXPECT_EQ(u->seeds[2], (NodeAddress{"::1", 7002}));
  EXPECT_EQ(u->Redacted(), "redis://alice:***@10.0.0.1:7000,10.0.0.2:6379,[::1]:7002");

  Result<RedisUrl> p = ParseRedisUrl("redis://:pw@h:1/3");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->user, "");
  EXPECT_EQ(p->password, "pw");
  EXPECT_EQ(p->db, 3);
  Result<RedisUrl> list = ParseRedisUrl("redis://a:1,redis://b:2");
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(list->seeds[1], (NodeAddress{"b", 2}));
}

TEST(RedisUrlTest, RejectsBadInputWithAReason) {
  for (const char* bad : {"http://h:1", "redis://", "redis://h:0", "redis://h:70000", "redis://h:x",
                          "redis://h:", "redis://@h", "redis://h:1/x", "redis://a%zz:b@h",
                          "redis://h:1,,h:2", "redis://[::1"}) {
    Result<RedisUrl> u = ParseRedisUrl(bad);
    EXPECT_FALSE(u.ok()) << bad;
    if (!u.ok()) {
      EXPECT_EQ(u.status().code(), StatusCode::kInvalidArgument) << bad;
      EXPECT_NE(u.status().message().find("url"), std::string::npos) << u.status().ToString();
    }
  }
  Result<RedisUrl> tls = ParseRedisUrl("rediss://h:1");
  ASSERT_FALSE(tls.ok());
  EXPECT_NE(tls.status().message().find("TLS"), std::string::npos);
}

// ---- hash slots and cluster replies ----

TEST(ClusterSlotsTest, Crc16AndSlotsMatchRedis) {
  EXPECT_EQ(Crc16("123456789"), 0x31C3);  // the check value from the Redis Cluster spec
  EXPECT_EQ(KeyHashSlot("foo"), 12182);   // CLUSTER KEYSLOT foo
  EXPECT_EQ(KeyHashSlot("bar"), 5061);
  EXPECT_EQ(KeyHashSlot("{user1000}.following"), KeyHashSlot("{user1000}.followers"));
  EXPECT_EQ(KeyHashSlot("{user1000}.following"), KeyHashSlot("user1000"));
  EXPECT_EQ(KeyHashSlot("foo{}{bar}"), Crc16("foo{}{bar}") & 16383);  // empty tag: whole key
  EXPECT_EQ(KeyHashSlot("foo{{bar}}zap"), KeyHashSlot("{bar"));
}

// Builds a redisReply tree from RESP text with hiredis's own reader.
struct ParsedReply {
  explicit ParsedReply(std::string_view resp) {
    redisReader* r = redisReaderCreate();
    redisReaderFeed(r, resp.data(), resp.size());
    void* out = nullptr;
    if (redisReaderGetReply(r, &out) == REDIS_OK) reply = static_cast<redisReply*>(out);
    redisReaderFree(r);
  }
  ~ParsedReply() {
    if (reply) freeReplyObject(reply);
  }
  redisReply* reply = nullptr;
};

TEST(ClusterSlotsTest, ParsesClusterSlotsReply) {
  ParsedReply p(
      "*2\r\n"
      "*3\r\n:0\r\n:8191\r\n*3\r\n$9\r\n127.0.0.1\r\n:7000\r\n$4\r\nid-a\r\n"
      "*4\r\n:8192\r\n:16383\r\n*2\r\n$0\r\n\r\n:7001\r\n*2\r\n$9\r\n127.0.0.1\r\n:7101\r\n");
  ASSERT_NE(p.reply, nullptr);
  Result<std::vector<SlotRange>> r = ParseClusterSlots(p.reply, "10.1.1.1");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->size(), 2u);
  EXPECT_EQ((*r)[0].first, 0);
  EXPECT_EQ((*r)[0].last, 8191);
  EXPECT_EQ((*r)[0].master, (NodeAddress{"127.0.0.1", 7000}));
  EXPECT_EQ((*r)[1].master, (NodeAddress{"10.1.1.1", 7001}));  // empty host: the one asked
}

TEST(ClusterSlotsTest, RejectsMalformedReplies) {
  for (const char* bad : {
           ":1\r\n", "*1\r\n:5\r\n",
           "*1\r\n*3\r\n:0\r\n:16384\r\n*2\r\n$1\r\nh\r\n:1\r\n",   // slot out of range
           "*1\r\n*3\r\n:9\r\n:3\r\n*2\r\n$1\r\nh\r\n:1\r\n",       // first > last
           "*1\r\n*3\r\n:0\r\n:3\r\n*2\r\n$1\r\nh\r\n:0\r\n",       // port 0
           "*1\r\n*3\r\n:0\r\n:3\r\n*1\r\n$1\r\nh\r\n",             // no port
           "*1\r\n*3\r\n$1\r\n0\r\n:3\r\n*2\r\n$1\r\nh\r\n:1\r\n",  // bound not an integer
       }) {
    ParsedReply p(bad);
    ASSERT_NE(p.reply, nullptr) << bad;
    EXPECT_FALSE(ParseClusterSlots(p.reply, "h").ok()) << bad;
  }
  ParsedReply err("-ERR This instance has cluster support disabled\r\n");
  EXPECT_EQ(ParseClusterSlots(err.reply, "h").status().code(), StatusCode::kUnavailable);
}

TEST(ClusterSlotsTest, ParsesRedirects) {
  std::optional<Redirect> moved = ParseRedirect("MOVED 3999 127.0.0.1:6381", "x");
  ASSERT_TRUE(moved.has_value());
  EXPECT_FALSE(moved->ask);
  EXPECT_EQ(moved->slot, 3999);
  EXPECT_EQ(moved->target, (NodeAddress{"127.0.0.1", 6381}));
  std::optional<Redirect> ask = ParseRedirect("ASK 12 :7002", "10.0.0.9");
  ASSERT_TRUE(ask.has_value());
  EXPECT_TRUE(ask->ask);
  EXPECT_EQ(ask->target, (NodeAddress{"10.0.0.9", 7002}));
  for (const char* bad : {"ERR wrong", "MOVED", "MOVED x h:1", "MOVED 16384 h:1", "MOVED 1 h",
                          "MOVED 1 h:0", "ASK 1"}) {
    EXPECT_FALSE(ParseRedirect(bad, "d").has_value()) << bad;
  }
}

// ---- RESP reader ----

// Feeds `text` in pieces of `chunk` bytes.
Status FeedChunked(RespReader& r, std::string_view text, size_t chunk) {
  std::vector<std::byte> bytes = Bytes(text);
  for (size_t off = 0; off < bytes.size(); off += chunk) {
    size_t n = std::min(chunk, bytes.size() - off);
    KVTIER_RETURN_IF_ERROR(r.Feed(std::span(bytes).subspan(off, n)));
  }
  return Status::Ok();
}

TEST(RespReaderTest, ParsesEachKindAtEveryChunking) {
  const std::string text = "+OK\r\n-OOM no room\r\n:42\r\n$-1\r\n$5\r\nhello\r\n$0\r\n\r\n:-7\r\n";
  for (size_t chunk : {1, 2, 3, 7, 64}) {
    RespReader r;
    for (int i = 0; i < 7; ++i) r.Expect();
    ASSERT_TRUE(FeedChunked(r, text, chunk).ok()) << chunk;
    RespReply x;
    ASSERT_TRUE(r.Next(&x));
    EXPECT_EQ(x.type, RespReply::Type::kStatus);
    EXPECT_EQ(x.text, "OK");
    ASSERT_TRUE(r.Next(&x));
    EXPECT_EQ(x.type, RespReply::Type::kError);
    EXPECT_EQ(x.text, "OOM no room");
    ASSERT_TRUE(r.Next(&x));
    EXPECT_EQ(x.type, RespReply::Type::kInteger);
    EXPECT_EQ(x.integer, 42);
    ASSERT_TRUE(r.Next(&x));
    EXPECT_EQ(x.type, RespReply::Type::kNil);
    ASSERT_TRUE(r.Next(&x));
    EXPECT_EQ(x.type, RespReply::Type::kBulk);
    EXPECT_EQ(x.text, "hello");
    ASSERT_TRUE(r.Next(&x));
    EXPECT_EQ(x.bulk_bytes, 0u);
    ASSERT_TRUE(r.Next(&x));
    EXPECT_EQ(x.integer, -7);
    EXPECT_FALSE(r.Next(&x));
    EXPECT_EQ(r.outstanding(), 0u);
  }
}

TEST(RespReaderTest, LandsFittingBulksInTheSinkAndOthersNot) {
  std::vector<std::byte> value = RandomBytes(48 + 100000, 3);
  std::string payload(reinterpret_cast<const char*>(value.data()), value.size());
  std::string text = "$" + std::to_string(value.size()) + "\r\n" + payload + "\r\n" +
                     "$3\r\nabc\r\n" + "$" + std::to_string(value.size()) + "\r\n" + payload +
                     "\r\n";
  for (size_t chunk : {1000, 4096, 65536, 1 << 20}) {
    std::array<std::byte, 48> head{};
    std::vector<std::byte> body(100000);
    std::array<std::byte, 48> head2{};
    std::vector<std::byte> body2(100000);
    RespReader r(4096, 16);
    r.Expect(BulkSink{head, body});
    r.Expect(BulkSink{head2, body2});  // "abc" does not fit: goes to text
    r.Expect();                        // too long for text: dropped
    ASSERT_TRUE(FeedChunked(r, text, chunk).ok());
    RespReply x;
    ASSERT_TRUE(r.Next(&x));
    EXPECT_TRUE(x.in_sink);
    EXPECT_EQ(std::memcmp(head.data(), value.data(), 48), 0);
    EXPECT_EQ(std::memcmp(body.data(), value.data() + 48, body.size()), 0);
    ASSERT_TRUE(r.Next(&x));
    EXPECT_FALSE(x.in_sink);
    EXPECT_EQ(x.text, "abc");
    ASSERT_TRUE(r.Next(&x));
    EXPECT_TRUE(x.dropped);
    EXPECT_EQ(x.bulk_bytes, value.size());
    EXPECT_EQ(body2, std::vector<std::byte>(100000));  // untouched
  }
}

TEST(RespReaderTest, ReadsLongBulksStraightIntoTheSink) {
  std::vector<std::byte> value = RandomBytes(48 + 50000, 4);
  std::array<std::byte, 48> head{};
  std::vector<std::byte> body(50000);
  RespReader r(1024);
  r.Expect(BulkSink{head, body});
  std::string hdr = "$" + std::to_string(value.size()) + "\r\n";
  ASSERT_TRUE(r.Feed(Bytes(hdr)).ok());
  ASSERT_TRUE(r.Feed(std::span(value).first(48)).ok());
  std::span<std::byte> target = r.ReadTarget();
  EXPECT_EQ(target.data(), body.data());  // zero-copy: the socket writes into the block
  EXPECT_EQ(target.size(), body.size());
  std::memcpy(target.data(), value.data() + 48, target.size());
  ASSERT_TRUE(r.Commit(target.size()).ok());
  ASSERT_TRUE(r.Feed(Bytes("\r\n")).ok());
  RespReply x;
  ASSERT_TRUE(r.Next(&x));
  EXPECT_TRUE(x.in_sink);
  EXPECT_EQ(std::memcmp(body.data(), value.data() + 48, body.size()), 0);
}

TEST(RespReaderTest, ReportsEveryBodyByteOnceInOrder) {
  std::vector<std::byte> value = RandomBytes(48 + 70000, 5);
  std::string text = "$" + std::to_string(value.size()) + "\r\n" +
                     std::string(reinterpret_cast<const char*>(value.data()), value.size()) +
                     "\r\n";
  for (size_t chunk : {1, 100, 4096, 5000, 1 << 20}) {
    std::array<std::byte, 48> head{};
    std::vector<std::byte> body(70000);
    std::vector<std::byte> seen;
    RespReader r(1024);
    BulkSink sink{head, body};
    sink.on_body = [](void* ctx, std::span<const std::byte> b) {
      auto* v = static_cast<std::vector<std::byte>*>(ctx);
      v->insert(v->end(), b.begin(), b.end());
    };
    sink.context = &seen;
    r.Expect(sink);
    // Feed through ReadTarget/Commit in pieces of `chunk`, as a socket would.
    std::vector<std::byte> bytes = Bytes(text);
    size_t off = 0;
    while (off < bytes.size()) {
      std::span<std::byte> t = r.ReadTarget();
      size_t n = std::min({t.size(), chunk, bytes.size() - off});
      std::memcpy(t.data(), bytes.data() + off, n);
      ASSERT_TRUE(r.Commit(n).ok());
      off += n;
    }
    RespReply x;
    ASSERT_TRUE(r.Next(&x));
    EXPECT_TRUE(x.in_sink);
    EXPECT_EQ(seen, body) << chunk;
    EXPECT_EQ(std::memcmp(body.data(), value.data() + 48, body.size()), 0) << chunk;
  }
}

TEST(RespReaderTest, ProtocolErrorsAreSticky) {
  for (const char* bad : {"*1\r\n:1\r\n", "?x\r\n", ":12a\r\n", "$-2\r\n", "+OK\n", "$1\r\nab\r\n",
                          "+OK\r\n+OK\r\n"}) {
    RespReader r;
    r.Expect();
    Status s = r.Feed(Bytes(bad));
    EXPECT_EQ(s.code(), StatusCode::kCorruption) << bad;
    EXPECT_TRUE(r.failed()) << bad;
    EXPECT_FALSE(r.Feed(Bytes("+OK\r\n")).ok()) << bad;
  }
  RespReader r(128);
  r.Expect();
  EXPECT_FALSE(r.Feed(Bytes("+" + std::string(200, 'x'))).ok());  // a line past the buffer
}

// ---- circuit breaker ----

TEST(CircuitBreakerTest, OpensAfterThresholdAndProbesWithBackoff) {
  CircuitBreakerOptions o;
  o.failure_threshold = 3;
  o.initial_backoff_ns = 100;
  o.max_backoff_ns = 400;
  ASSERT_TRUE(o.Validate().ok());
  CircuitBreaker b(o, 42);
  int64_t t = 1000;
  EXPECT_TRUE(b.Allow(t));
  b.RecordFailure(t);
  b.RecordFailure(t);
  EXPECT_EQ(b.state(), CircuitBreaker::State::kClosed);
  b.RecordSuccess();  // a success resets the count
  b.RecordFailure(t);
  b.RecordFailure(t);
  EXPECT_EQ(b.state(), CircuitBreaker::State::kClosed);
  b.RecordFailure(t);
  EXPECT_EQ(b.state(), CircuitBreaker::State::kOpen);
  EXPECT_FALSE(b.Allow(t + 99));
  int64_t first_retry = b.retry_at_ns();
  EXPECT_GE(first_retry, t + 100);
  EXPECT_LE(first_retry, t + 125);    // at most 25% jitter
  EXPECT_TRUE(b.Allow(first_retry));  // the probe
  EXPECT_EQ(b.state(), CircuitBreaker::State::kHalfOpen);
  EXPECT_FALSE(b.Allow(first_retry));  // one probe at a time
  b.RecordFailure(first_retry);        // the probe failed: backoff doubles
  EXPECT_EQ(b.state(), CircuitBreaker::State::kOpen);
  EXPECT_GE(b.retry_at_ns(), first_retry + 200);
  EXPECT_LE(b.retry_at_ns(), first_retry + 250);
  // Repeated failed probes cap at max_backoff.
  for (int i = 0; i < 5; ++i) {
    int64_t at = b.retry_at_ns();
    ASSERT_TRUE(b.Allow(at));
    b.RecordFailure(at);
    EXPECT_LE(b.retry_at_ns() - at, 400 + 100);
  }
  ASSERT_TRUE(b.Allow(b.retry_at_ns()));
  b.RecordSuccess();
  EXPECT_EQ(b.state(), CircuitBreaker::State::kClosed);
  EXPECT_TRUE(b.Allow(0));
  EXPECT_EQ(b.opens(), 7u);
}

TEST(CircuitBreakerTest, ValidateNamesTheField) {
  CircuitBreakerOptions o;
  o.failure_threshold = 0;
  EXPECT_NE(o.Validate().message().find("breaker_failures"), std::string::npos);
  o = {};
  o.max_backoff_ns = o.initial_backoff_ns - 1;
  EXPECT_NE(o.Validate().message().find("breaker_max_backoff_ms"), std::string::npos);
}

}  // namespace
}  // namespace kvtier::remote
