// The daemon's wire protocol (src/serve/protocol.cc): what a hello decodes to.
#include <gtest/gtest.h>

#include "serve/protocol.h"

namespace kvtier::serve {
namespace {

// A hello payload with the layout's fields as given (six fields, as on the wire).
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
  for (int i = 0; i < 5; ++i) w.Str("");  // model id, revision, tenant, LoRA, token
  return w.buffer();
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

}  // namespace
}  // namespace kvtier::serve
