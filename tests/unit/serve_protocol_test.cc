// The daemon's wire protocol (src/serve/protocol.cc): what a hello and a stats reply decode to.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "serve/protocol.h"

namespace kvtier::serve {
namespace {

// A hello payload with the layout's fields as given (six fields and no groups, as on the wire).
std::vector<std::byte> HelloPayload(uint32_t layers, uint32_t heads, uint32_t dim, uint8_t dtype,
                                    uint32_t block_tokens, uint8_t attention) {
  Writer w;
  w.U32(kProtocolVersion);
  w.U32(layers);
  w.U32(heads);
  w.U32(dim);
  w.U8(dtype);
  w.U32(block_tokens);
  w.U8(attention);
  w.U32(0);                               // groups (protocol 5)
  for (int i = 0; i < 5; ++i) w.Str("");  // model id, revision, tenant, LoRA, token
  return w.buffer();
}

// Protocol 5: a hello carries a grouped layout's groups, every field of each.
Hello GroupedHello() {
  Hello h;
  h.layout.block_tokens = 128;
  h.layout.groups = {
      {KvGroupKind::kSlidingWindow, 2, 2, 64, DType::kFp32, 32, 32, 0},
      {KvGroupKind::kFull, 2, 2, 64, DType::kFp16, 0, 0, 0},
      {KvGroupKind::kLatent, 4, 1, 576, DType::kBf16, 0, 0, 0},
      {KvGroupKind::kState, 3, 0, 0, DType::kFp8, 0, 0, (uint64_t{1} << 32) + 5},  // all 8 bytes
  };
  h.model_id = "hybrid";
  h.tenant = "t";
  return h;
}

TEST(ServeProtocolTest, HelloRoundTripsAGroupedLayout) {
  const Hello h = GroupedHello();
  Writer w;
  EncodeHello(h, &w);
  Hello out;
  ASSERT_TRUE(DecodeHello(w.buffer(), &out).ok());
  EXPECT_EQ(out.version, kProtocolVersion);
  EXPECT_EQ(out.layout.groups, h.layout.groups);
  EXPECT_EQ(out.layout, h.layout);
  EXPECT_EQ(out.layout.fingerprint(), h.layout.fingerprint());
  EXPECT_EQ(out.model_id, "hybrid");
  EXPECT_EQ(out.tenant, "t");
  // A grouped layout has no top-level shape but is no operator hello.
  EXPECT_FALSE(out.layout == KvLayout{});
}

TEST(ServeProtocolTest, HelloWithTooManyGroupsOrABadKindIsADecodeError) {
  // The group count sits after the six layout fields: version, 3 x u32, u8, u32, u8.
  constexpr size_t kCountAt = 4 + 12 + 1 + 4 + 1;
  constexpr size_t kFirstKindAt = kCountAt + 4;
  Writer w;
  EncodeHello(GroupedHello(), &w);
  std::vector<std::byte> bytes = w.buffer();
  ASSERT_EQ(bytes.at(kCountAt), std::byte{4});
  ASSERT_EQ(bytes.at(kFirstKindAt), std::byte{static_cast<uint8_t>(KvGroupKind::kSlidingWindow)});
  {
    std::vector<std::byte> b = bytes;
    b[kCountAt] = std::byte{65};
    Hello out;
    EXPECT_EQ(DecodeHello(b, &out).code(), StatusCode::kInvalidArgument);
  }
  {
    // 65 well-formed groups: refused by count, not by running short.
    Hello h = GroupedHello();
    h.layout.groups.assign(65, h.layout.groups[1]);
    Writer many;
    EncodeHello(h, &many);
    Hello out;
    const Status st = DecodeHello(many.buffer(), &out);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("64 groups"), std::string::npos) << st.message();
    h.layout.groups.resize(64);
    Writer most;
    EncodeHello(h, &most);
    EXPECT_TRUE(DecodeHello(most.buffer(), &out).ok());
  }
  {
    std::vector<std::byte> b = bytes;
    b[kFirstKindAt] = std::byte{4};  // one past kState
    Hello out;
    const Status st = DecodeHello(b, &out);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("group kind"), std::string::npos) << st.message();
  }
  {
    std::vector<std::byte> b = bytes;
    b[kFirstKindAt + 13] = std::byte{9};  // the first group's dtype: kind, 3 x u32, then dtype
    Hello out;
    EXPECT_EQ(DecodeHello(b, &out).code(), StatusCode::kInvalidArgument);
  }
}

// Issue 27 item 6: doc/protocol.md says a hello whose layout is all zero is an operator
// connection, but only KvLayout{} (block_tokens 64) was taken as one: an all-zero layout was
// refused as a layout mismatch. Both now decode to the operator's KvLayout{}.
TEST(ServeProtocolTest, AllZeroLayoutHelloIsAnOperatorHello) {
  Hello h;
  ASSERT_TRUE(DecodeHello(HelloPayload(0, 0, 0, 0, 0, 0), &h).ok());
  EXPECT_EQ(h.layout, KvLayout{});
  Hello c;
  ASSERT_TRUE(DecodeHello(HelloPayload(0, 0, 0, 0, 64, 0), &c).ok());  // what the client sends
  EXPECT_EQ(c.layout, KvLayout{});
}

TEST(ServeProtocolTest, HelloWithAShapeKeepsItsLayout) {
  Hello h;
  ASSERT_TRUE(DecodeHello(HelloPayload(2, 2, 8, 0, 0, 0), &h).ok());
  EXPECT_EQ(h.layout.num_layers, 2u);
  EXPECT_EQ(h.layout.block_tokens, 0u);  // refused later by the daemon as a mismatch, not here
}

ReserveReq ReserveWithEngineHashes() {
  ReserveReq m;
  m.first_block = 3;
  m.keys = {BlockKey{1, 2}, BlockKey{3, 4}};
  for (int i = 0; i < 2; ++i) {
    EngineBlockHashes e;
    e.hashes = {std::string(32, char('a' + i)), std::string(32, char('c' + i))};
    e.parent_hash = i ? m.engine.back().hashes.back() : "";
    e.token_ids = {7u + i, 8u, 9u};
    e.lora_name = i ? "adapter" : "";
    m.engine.push_back(e);
  }
  return m;
}

// Protocol 4: a reserve carries the engine's hashes of each block, for the daemon's KV events.
TEST(ServeProtocolTest, ReserveCarriesEngineHashesPerKey) {
  const ReserveReq m = ReserveWithEngineHashes();
  Writer w;
  EncodeReserve(m, &w);
  ReserveReq got;
  ASSERT_TRUE(DecodeReserve(w.buffer(), &got).ok());
  ASSERT_EQ(got.engine.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(got.engine[i].hashes, m.engine[i].hashes);
    EXPECT_EQ(got.engine[i].parent_hash, m.engine[i].parent_hash);
    EXPECT_EQ(got.engine[i].token_ids, m.engine[i].token_ids);
    EXPECT_EQ(got.engine[i].lora_name, m.engine[i].lora_name);
  }
  EXPECT_EQ(got.keys, m.keys);
}

TEST(ServeProtocolTest, ReserveWithEngineHashesNotOnePerKeyOrTooLongIsRefused) {
  ReserveReq m = ReserveWithEngineHashes();
  m.engine.pop_back();
  Writer w;
  EncodeReserve(m, &w);
  ReserveReq got;
  const Status s = DecodeReserve(w.buffer(), &got);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("1 engine hash entries for 2 keys"), std::string::npos) << s.message();
  m = ReserveWithEngineHashes();
  m.engine[1].hashes[0] = std::string(65, 'x');  // longer than any engine's hash
  Writer w2;
  EncodeReserve(m, &w2);
  EXPECT_EQ(DecodeReserve(w2.buffer(), &got).code(), StatusCode::kInvalidArgument);
  // Cut anywhere, the payload is one clear error, never a partial read.
  m = ReserveWithEngineHashes();
  Writer w3;
  EncodeReserve(m, &w3);
  for (size_t cut = 1; cut < 40; ++cut) {
    std::vector<std::byte> b = w3.buffer();
    b.resize(b.size() - cut);
    EXPECT_EQ(DecodeReserve(b, &got).code(), StatusCode::kInvalidArgument) << cut;
  }
}

// The stats reply carries fields by name: a reader skips names it does not know (a newer
// daemon's field) and keeps the rest, instead of misreading every field after a new one.
TEST(ServeProtocolTest, StatsReplySkipsFieldsItDoesNotKnow) {
  Writer w;
  w.buffer().reserve(256);  // GCC 12 misreads the growth of many small writes as an overflow
  w.U32(2);                 // the daemon's fields
  w.Str("clients");
  w.U64(3);
  w.Str("a_field_from_the_future");
  w.U64(99);
  w.U32(1);  // the cache's
  w.Str("hit_blocks");
  w.U64(5);
  w.U32(0);  // the cache's histograms
  w.U32(0);  // tiers
  Reader r(w.buffer());
  CacheStats s;
  ServeCounters c;
  ASSERT_TRUE(DecodeStatsReply(&r, &s, &c).ok());
  EXPECT_EQ(c.clients, 3u);
  EXPECT_EQ(s.hit_blocks, 5u);
}

// Every truncation of a valid reply is one clear error, never a crash or a partial success.
TEST(ServeProtocolTest, TruncatedStatsReplyIsOneClearError) {
  CacheStats s;
  s.tiers.resize(1);
  s.tiers[0].name = "ssd";
  s.tiers[0].tier.counters = {{"degraded", "help", 1, true}};
  s.hit_blocks = 7;
  Writer w;
  EncodeStatsReply(s, ServeCounters{}, &w);
  const std::vector<std::byte> full = w.buffer();
  for (size_t n = 0; n < full.size(); ++n) {
    Reader r(std::span<const std::byte>(full).first(n));
    CacheStats out;
    ServeCounters c;
    const Status st = DecodeStatsReply(&r, &out, &c);
    ASSERT_EQ(st.code(), StatusCode::kInvalidArgument) << n;
    EXPECT_NE(st.message().find("stats reply"), std::string::npos) << st.message();
  }
}

TEST(ServeProtocolTest, StatsReplyWithABadTierCounterNameIsRefusedNamingIt) {
  CacheStats s;
  s.tiers.resize(1);
  s.tiers[0].name = "ssd";
  s.tiers[0].tier.counters = {{"Bad Name", "help", 1, false}};
  Writer w;
  EncodeStatsReply(s, ServeCounters{}, &w);
  Reader r(w.buffer());
  CacheStats out;
  ServeCounters c;
  const Status st = DecodeStatsReply(&r, &out, &c);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("'Bad Name'"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace kvtier::serve
