#include "kvtier/layout.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>

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

// The grouped layout of doc/config.md's example: 128-token blocks of a sliding window (32
// tokens in 32-token pages), a full group, an MLA latent group and a state group.
KvLayout HybridLayout() {
  KvLayout l;
  l.block_tokens = 128;
  KvLayoutGroup swa{KvGroupKind::kSlidingWindow, 2, 2, 64, DType::kFp32, 32, 32, 0};
  KvLayoutGroup full{KvGroupKind::kFull, 2, 2, 64, DType::kFp32, 0, 0, 0};
  KvLayoutGroup latent{KvGroupKind::kLatent, 4, 1, 576, DType::kBf16, 0, 0, 0};
  KvLayoutGroup state{KvGroupKind::kState, 3, 0, 0, DType::kFp32, 0, 0, 65536};
  l.groups = {swa, full, latent, state};
  return l;
}

TEST(LayoutTest, GroupedBytesPerBlockKeepWhatEachGroupNeeds) {
  const KvLayout l = HybridLayout();
  ASSERT_TRUE(l.Validate().ok()) << l.Validate().message();
  // 2 layers x 2 heads x 64 dims x fp32, K and V: 1 KiB per token per layer.
  EXPECT_EQ(l.groups[0].stored_tokens(128), 32u);  // window - 1 = 31 tokens: one 32-token page
  EXPECT_EQ(l.groups[0].bytes_per_block(128), 2u * 32 * 1024);
  KvLayoutGroup wide = l.groups[0];
  wide.window = 100;  // 99 tokens: four pages, 128 tokens, all of the block
  EXPECT_EQ(wide.stored_tokens(128), 128u);
  wide.window = 1000;  // capped at the block
  EXPECT_EQ(wide.stored_tokens(128), 128u);
  EXPECT_EQ(wide.bytes_per_block(128), 2u * 128 * 1024);
  EXPECT_EQ(l.groups[1].bytes_per_block(128), 2u * 128 * 1024);
  EXPECT_EQ(l.groups[2].bytes_per_block(128), 4u * 128 * 576 * 2);  // head_dim x es per token
  // A state group is not in the block: its states go to the state record.
  EXPECT_EQ(l.groups[3].bytes_per_block(128), 0u);
  EXPECT_EQ(l.groups[3].state_record_bytes(), 3u * 65536);  // state_bytes per layer
  EXPECT_EQ(l.bytes_per_block(), 65536u + 262144 + 589824);
  EXPECT_EQ(l.full_bytes_per_block(), 262144u + 262144 + 589824 + 196608);
  EXPECT_EQ(l.state_bytes(), 196608u);
  EXPECT_EQ(l.state_blocks(), 1u);  // fits one 896 KiB block
  EXPECT_EQ(l.bytes_per_token(), l.bytes_per_block() / 128);
  EXPECT_EQ(l.layer_bytes(), 0u);
  EXPECT_EQ(l.group_offset(0), 0u);
  EXPECT_EQ(l.group_offset(1), 65536u);
  EXPECT_EQ(l.group_offset(2), 65536u + 262144);
  EXPECT_EQ(l.group_offset(3), 0u);  // first in the state record
  EXPECT_EQ(l.group_offset(4), l.bytes_per_block());
}

TEST(LayoutTest, StateRecordsSpanBlocksAndNeedAGroupThatKeepsTokens) {
  KvLayout l = HybridLayout();
  KvLayoutGroup second = l.groups[3];
  second.num_layers = 12;
  l.groups.push_back(second);  // 3 + 12 layers of 64 KiB: 960 KiB, two 896 KiB blocks
  ASSERT_TRUE(l.Validate().ok()) << l.Validate().message();
  EXPECT_EQ(l.state_bytes(), 15u * 65536);
  EXPECT_EQ(l.state_blocks(), 2u);
  EXPECT_EQ(l.group_offset(4), 3u * 65536);
  EXPECT_NE(l.ToString().find("960 KiB state in 2 blocks"), std::string::npos) << l.ToString();
  KvLayout only;
  only.block_tokens = 128;
  only.groups = {l.groups[3]};
  EXPECT_NE(only.Validate().message().find("a state group is stored beside"), std::string::npos)
      << only.Validate().message();
  // Ungrouped and grouped layouts without state keep their encodings (and so their keys).
  KvLayout no_state = HybridLayout();
  no_state.groups.pop_back();
  EXPECT_EQ(no_state.state_blocks(), 0u);
  EXPECT_EQ(no_state.group_offset(3), no_state.bytes_per_block());
}

TEST(LayoutTest, GroupedFingerprintCoversEveryGroupField) {
  const KvLayout base = HybridLayout();
  const auto differs = [&](auto&& change) {
    KvLayout l = base;
    change(l);
    return l.fingerprint() != base.fingerprint();
  };
  EXPECT_TRUE(differs([](KvLayout& l) { l.block_tokens = 64; }));
  EXPECT_TRUE(differs([](KvLayout& l) { l.groups[1].kind = KvGroupKind::kSlidingWindow; }));
  EXPECT_TRUE(differs([](KvLayout& l) { l.groups[1].num_layers = 3; }));
  EXPECT_TRUE(differs([](KvLayout& l) { l.groups[1].num_kv_heads = 4; }));
  EXPECT_TRUE(differs([](KvLayout& l) { l.groups[1].head_dim = 128; }));
  EXPECT_TRUE(differs([](KvLayout& l) { l.groups[1].dtype = DType::kBf16; }));
  EXPECT_TRUE(differs([](KvLayout& l) { l.groups[0].window = 64; }));
  EXPECT_TRUE(differs([](KvLayout& l) { l.groups[0].page_tokens = 16; }));
  EXPECT_TRUE(differs([](KvLayout& l) { l.groups[3].state_bytes = 4096; }));
  EXPECT_TRUE(differs([](KvLayout& l) { std::swap(l.groups[0], l.groups[1]); }));
  EXPECT_TRUE(differs([](KvLayout& l) { l.groups.pop_back(); }));
  // The unused top-level fields do not count, as in operator==.
  EXPECT_FALSE(differs([](KvLayout& l) { l.num_layers = 7; }));
  // One full group is not the ungrouped layout of the same shape.
  const KvLayout flat{2, 2, 64, DType::kFp32, 128};
  KvLayout one;
  one.block_tokens = 128;
  one.groups = {base.groups[1]};
  EXPECT_EQ(one.bytes_per_block(), flat.bytes_per_block());
  EXPECT_NE(one.fingerprint(), flat.fingerprint());
  EXPECT_FALSE(one == flat);
}

TEST(LayoutTest, GroupedValidateNamesTheGroupAndField) {
  const auto error = [](auto&& change) {
    KvLayout l = HybridLayout();
    change(l);
    return std::string(l.Validate().message());
  };
  EXPECT_NE(
      error([](KvLayout& l) { l.groups[0].page_tokens = 48; }).find("layout.groups[0].page_tokens"),
      std::string::npos);
  EXPECT_NE(error([](KvLayout& l) { l.groups[0].window = 0; }).find("layout.groups[0].window"),
            std::string::npos);
  EXPECT_NE(error([](KvLayout& l) { l.groups[1].window = 8; }).find("layout.groups[1].window"),
            std::string::npos);
  EXPECT_NE(error([](KvLayout& l) {
              l.groups[2].num_kv_heads = 2;
            }).find("layout.groups[2].num_kv_heads"),
            std::string::npos);
  EXPECT_NE(
      error([](KvLayout& l) { l.groups[3].state_bytes = 0; }).find("layout.groups[3].state_bytes"),
      std::string::npos);
  EXPECT_NE(
      error([](KvLayout& l) { l.groups[1].num_layers = 0; }).find("layout.groups[1].num_layers"),
      std::string::npos);
}

TEST(LayoutTest, GroupedEqualityIgnoresTheTopLevelShape) {
  KvLayout a = HybridLayout();
  KvLayout b = a;
  b.num_layers = 32;
  b.num_kv_heads = 8;
  b.head_dim = 128;
  b.dtype = DType::kFp8;
  b.attention = AttentionKind::kMla;
  EXPECT_TRUE(a == b);
  b.block_tokens = 64;
  EXPECT_FALSE(a == b);
  b = a;
  b.groups[0].window = 64;
  EXPECT_FALSE(a == b);
  EXPECT_NE(a.ToString(), b.ToString());  // a refusal names the difference
  EXPECT_NE(a.ToString().find("window 32 in 32-token pages"), std::string::npos) << a.ToString();
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
