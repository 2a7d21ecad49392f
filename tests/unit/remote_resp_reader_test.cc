// The streaming RESP reader (resp_reader.h): every reply kind at every chunking, bulks landed
// in the caller's sink, and sticky protocol errors. No server needed.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <string>
#include <vector>

#include "testing/test_util.h"
#include "tiers/remote/resp_reader.h"

namespace kvtier::remote {
namespace {

std::vector<std::byte> Bytes(std::string_view s) {
  std::vector<std::byte> v(s.size());
  std::memcpy(v.data(), s.data(), s.size());
  return v;
}

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
  std::vector<std::byte> value = testing::MakeBlock(48 + 100000, 3);
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
  std::vector<std::byte> value = testing::MakeBlock(48 + 50000, 4);
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
  std::vector<std::byte> value = testing::MakeBlock(48 + 70000, 5);
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

}  // namespace
}  // namespace kvtier::remote
