// Redis Cluster hash slots, CLUSTER SLOTS replies and MOVED/ASK redirects (cluster_slots.h).
// No server needed.
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <string>
#include <vector>

#include "tiers/remote/cluster_slots.h"

namespace kvtier::remote {
namespace {

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

}  // namespace
}  // namespace kvtier::remote
