// KvLayout: the shape of one KV block. A block is one contiguous unit spanning all layers
// (K and V of block_tokens tokens); per-layer views are offsets into it. See doc/layout.md.
//
// Byte order inside a block, for MHA/GQA:
//   for layer in [0, num_layers): K[block_tokens][num_kv_heads][head_dim], then V (same shape)
// and for MLA (one latent per token, num_kv_heads == 1, head_dim = latent width):
//   for layer in [0, num_layers): C[block_tokens][head_dim]
//
// Thread-safety: a value type.
#ifndef KVTIER_LAYOUT_H_
#define KVTIER_LAYOUT_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/status.h"

namespace kvtier {

enum class DType : uint8_t { kBf16 = 0, kFp16 = 1, kFp8 = 2, kFp32 = 3 };
enum class AttentionKind : uint8_t { kMha = 0, kMla = 1 };  // kMha covers GQA and MQA.

size_t DTypeBytes(DType dtype);
std::string_view DTypeName(DType dtype);
// Accepts "bf16", "fp16"/"f16", "fp8", "fp32"/"f32"; nullopt otherwise.
std::optional<DType> ParseDType(std::string_view name);
std::string_view AttentionKindName(AttentionKind kind);
std::optional<AttentionKind> ParseAttentionKind(std::string_view name);  // "mha", "gqa", "mla"

struct KvLayout {
  uint32_t num_layers = 0;
  uint32_t num_kv_heads = 0;
  uint32_t head_dim = 0;
  DType dtype = DType::kBf16;
  uint32_t block_tokens = 64;
  AttentionKind attention = AttentionKind::kMha;

  // OK, or InvalidArgument naming the field that is wrong.
  Status Validate() const;

  // K and V per token across all layers (one latent for MLA).
  uint64_t bytes_per_token() const;
  uint64_t bytes_per_block() const { return bytes_per_token() * block_tokens; }
  // Bytes of one layer's slice of a block; the slice starts at layer * layer_bytes().
  uint64_t layer_bytes() const { return bytes_per_block() / num_layers; }
  // Offset of V inside a layer's slice (MHA/GQA only: half of layer_bytes()).
  uint64_t v_offset_in_layer() const { return layer_bytes() / 2; }

  // Stable 64-bit fingerprint of every field: blocks of different layouts never share keys.
  uint64_t fingerprint() const;

  // "32L x 8H x 128D bf16 mha, 64 tok/block, 8 MiB/block"
  std::string ToString() const;

  friend bool operator==(const KvLayout&, const KvLayout&) = default;
};

// Presets from public model configs: "llama-3.1-8b", "llama-3.1-70b", "qwen3-235b-a22b",
// "deepseek-v3". NotFound for an unknown name.
Result<KvLayout> LayoutPreset(std::string_view name, uint32_t block_tokens = 64);
std::vector<std::string> LayoutPresetNames();

// "256KiB", "2 MiB", "8GB", "1048576" -> bytes. InvalidArgument on anything else.
Result<uint64_t> ParseByteSize(std::string_view text);
// 8388608 -> "8 MiB".
std::string FormatBytes(uint64_t bytes);

}  // namespace kvtier

#endif  // KVTIER_LAYOUT_H_
