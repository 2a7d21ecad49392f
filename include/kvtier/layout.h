// KvLayout: the shape of one KV block. A block is one contiguous unit spanning all layers
// (K and V of block_tokens tokens); per-layer views are offsets into it. See doc/layout.md.
//
// A grouped layout (`groups` not empty: hybrid models, sliding windows, MLA beside other
// attention) stores in one block what every group needs to resume at the block's end, group
// after group: full and latent groups every token, a sliding-window group the engine pages that
// hold the window before the block's end. A hit is then a whole prefix for every group at once;
// no group can be restored partly. State groups (Mamba / linear attention) are not in the block:
// an engine keeps a state at some boundaries only, so the states at a boundary form a state
// record of state_blocks() blocks, stored under the block's state keys (doc/layout.md) where
// there is one.
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

// What a group of layers keeps; the names are the simulator's (sim/kv_layout.h).
enum class KvGroupKind : uint8_t { kFull = 0, kLatent = 1, kSlidingWindow = 2, kState = 3 };
std::string_view KvGroupKindName(KvGroupKind kind);  // "full", "latent", "sliding_window", "state"
std::optional<KvGroupKind> ParseKvGroupKind(std::string_view name);

struct KvLayoutGroup {
  KvGroupKind kind = KvGroupKind::kFull;
  uint32_t num_layers = 0;
  uint32_t num_kv_heads = 0;  // full, sliding window: K/V heads; latent: 1
  uint32_t head_dim = 0;      // full, sliding window: per head; latent: the latent width
  DType dtype = DType::kBf16;
  uint32_t window = 0;       // sliding window: tokens a token attends to, itself included
  uint32_t page_tokens = 0;  // sliding window: the engine's page; the window is kept in pages
  uint64_t state_bytes = 0;  // state: one layer's state at a block's end

  // Tokens of a block_tokens block this group keeps: every one, or for a sliding window the
  // last pages covering window - 1 tokens (all a resume at the block's end reads); 0 for state.
  uint32_t stored_tokens(uint32_t block_tokens) const;
  uint64_t bytes_per_block(uint32_t block_tokens) const;  // 0 for state (in the state record)
  // A state group's share of a state record: every layer's state (0 for other kinds).
  uint64_t state_record_bytes() const { return uint64_t{num_layers} * state_bytes; }
  // What storing every token would take (a sliding window's full KV; a state group's state at
  // every block's end), for reports.
  uint64_t full_bytes_per_block(uint32_t block_tokens) const;
  uint64_t bytes_per_token_layer() const;  // one layer, one token (0 for state)
  Status Validate(uint32_t block_tokens, const std::string& where) const;
  std::string ToString() const;

  friend bool operator==(const KvLayoutGroup&, const KvLayoutGroup&) = default;
};

struct KvLayout {
  uint32_t num_layers = 0;
  uint32_t num_kv_heads = 0;
  uint32_t head_dim = 0;
  DType dtype = DType::kBf16;
  uint32_t block_tokens = 64;
  AttentionKind attention = AttentionKind::kMha;
  // Not empty: a grouped layout; the shape fields above are then unused (block_tokens is).
  std::vector<KvLayoutGroup> groups;

  bool grouped() const { return !groups.empty(); }

  // OK, or InvalidArgument naming the field that is wrong.
  Status Validate() const;

  // K and V per token across all layers (one latent for MLA); a grouped layout's block bytes
  // over its tokens, rounded down.
  uint64_t bytes_per_token() const;
  uint64_t bytes_per_block() const;
  // What the block would take storing every group's every token and every state (==
  // bytes_per_block() but for sliding windows and state groups).
  uint64_t full_bytes_per_block() const;
  // The states at one boundary, every state group's, one after the other (0: no state group),
  // and the blocks they are stored in (the last one zero-padded).
  uint64_t state_bytes() const;
  uint32_t state_blocks() const;
  // Where group g starts inside a block, or for a state group inside the state record.
  uint64_t group_offset(size_t g) const;
  // The groups; an ungrouped layout as its one full (MLA: latent) group.
  std::vector<KvLayoutGroup> AsGroups() const;
  // Bytes of one layer's slice of a block; the slice starts at layer * layer_bytes(). Ungrouped
  // layouts only (0 for a grouped one: its layers differ in size).
  uint64_t layer_bytes() const { return grouped() ? 0 : bytes_per_block() / num_layers; }
  // Offset of V inside a layer's slice (MHA/GQA only: half of layer_bytes()).
  uint64_t v_offset_in_layer() const { return layer_bytes() / 2; }

  // Stable 64-bit fingerprint of every field: blocks of different layouts never share keys.
  uint64_t fingerprint() const;

  // "32L x 8H x 128D bf16 mha, 64 tok/block, 8 MiB/block"
  std::string ToString() const;

  // Grouped layouts compare block_tokens and groups; the unused shape fields do not count.
  friend bool operator==(const KvLayout& a, const KvLayout& b);
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
