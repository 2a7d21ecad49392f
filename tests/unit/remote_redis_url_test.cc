// The remote tier's redis:// URL parser (redis_url.h). No server needed.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <string>
#include <vector>

#include "tiers/remote/redis_url.h"

namespace kvtier::remote {
namespace {

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

}  // namespace
}  // namespace kvtier::remote
