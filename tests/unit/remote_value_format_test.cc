// The remote tier's value format (value_format.h): header round trip and verification, its
// byte layout, and the Redis key of a block. No server needed.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <string>
#include <vector>

#include "testing/test_util.h"
#include "tiers/remote/value_format.h"

namespace kvtier::remote {
namespace {

TEST(RemoteValueTest, RoundTripsAndVerifies) {
  BlockKey key{0x0123456789abcdef, 0xfedcba9876543210};
  std::vector<std::byte> payload = testing::MakeBlock(1000, 7);
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
  std::vector<std::byte> payload = testing::MakeBlock(256, 9);
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

}  // namespace
}  // namespace kvtier::remote
