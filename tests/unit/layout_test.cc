#include "kvtier/layout.h"

#include <gtest/gtest.h>

namespace kvtier {
namespace {

TEST(LayoutTest, PresetsMatchPublishedKvSizes) {
  // ANCHORS.md: bf16 KV bytes per token.
  EXPECT_EQ(LayoutPreset("llama-3.1-8b")->bytes_per_token(), 128u * 1024);
  EXPECT_EQ(LayoutPreset("llama-3.1-70b")->bytes_per_token(), 320u * 1024);
  EXPECT_EQ(LayoutPreset("qwen3-235b-a22b")->bytes_per_token(), 188u * 1024);
  EXPECT_EQ(LayoutPreset("deepseek-v3")->bytes_per_token(), 61u * 576 * 2);
  EXPECT_EQ(LayoutPreset("llama-3.1-8b")->bytes_per_block(), 8u << 20);  // 64 tokens
  EXPECT_EQ(LayoutPreset("llama-3.1-8b", 16)->bytes_per_block(), 2u << 20);
  auto unknown = LayoutPreset("gpt-9");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("llama-3.1-8b"), std::string::npos);
}

TEST(LayoutTest, ValidateNamesTheField) {
  KvLayout l = *LayoutPreset("llama-3.1-8b");
  EXPECT_TRUE(l.Validate().ok());
  l.num_layers = 0;
  EXPECT_EQ(l.Validate().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(l.Validate().message().find("num_layers"), std::string::npos);
  l = *LayoutPreset("llama-3.1-8b");
  l.block_tokens = 0;
  EXPECT_NE(l.Validate().message().find("block_tokens"), std::string::npos);
  l = *LayoutPreset("deepseek-v3");
  l.num_kv_heads = 8;
  EXPECT_NE(l.Validate().message().find("MLA"), std::string::npos);
}

TEST(LayoutTest, FingerprintSeparatesLayoutsAndIsStable) {
  KvLayout a = *LayoutPreset("llama-3.1-8b");
  KvLayout b = a;
  EXPECT_EQ(a.fingerprint(), b.fingerprint());
  b.dtype = DType::kFp8;
  EXPECT_NE(a.fingerprint(), b.fingerprint());
  b = a;
  b.block_tokens = 16;
  EXPECT_NE(a.fingerprint(), b.fingerprint());
  // Golden: the encoding is part of the key format (doc/layout.md); it must never drift.
  EXPECT_EQ(a.fingerprint(), 0x735fe4b7e27e0e22ull) << std::hex << a.fingerprint();
}

TEST(LayoutTest, LayerOffsets) {
  KvLayout l = *LayoutPreset("llama-3.1-8b");
  EXPECT_EQ(l.layer_bytes() * l.num_layers, l.bytes_per_block());
  EXPECT_EQ(l.v_offset_in_layer(), 64u * 8 * 128 * 2);
}

TEST(LayoutTest, ParseByteSize) {
  EXPECT_EQ(*ParseByteSize("256KiB"), 256u * 1024);
  EXPECT_EQ(*ParseByteSize("2 MiB"), 2u << 20);
  EXPECT_EQ(*ParseByteSize("8GB"), 8000000000u);
  EXPECT_EQ(*ParseByteSize("1.5GiB"), 3u << 29);
  EXPECT_EQ(*ParseByteSize("1048576"), 1u << 20);
  EXPECT_FALSE(ParseByteSize("8XB").ok());
  EXPECT_FALSE(ParseByteSize("-1").ok());
  EXPECT_FALSE(ParseByteSize("").ok());
  EXPECT_EQ(FormatBytes(8u << 20), "8 MiB");
  EXPECT_EQ(FormatBytes(1536), "1.50 KiB");
}

TEST(LayoutTest, DTypeNames) {
  for (DType d : {DType::kBf16, DType::kFp16, DType::kFp8, DType::kFp32})
    EXPECT_EQ(ParseDType(DTypeName(d)), d);
  EXPECT_FALSE(ParseDType("int4").has_value());
  EXPECT_EQ(ParseAttentionKind("gqa"), AttentionKind::kMha);
}

}  // namespace
}  // namespace kvtier
