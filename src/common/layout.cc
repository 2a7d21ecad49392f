#include "kvtier/layout.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstring>

#include "hash/xxh.h"

namespace kvtier {

size_t DTypeBytes(DType dtype) {
  switch (dtype) {
    case DType::kBf16:
      return 2;
    case DType::kFp16:
      return 2;
    case DType::kFp8:
      return 1;
    case DType::kFp32:
      return 4;
  }
  return 0;
}

std::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kBf16:
      return "bf16";
    case DType::kFp16:
      return "fp16";
    case DType::kFp8:
      return "fp8";
    case DType::kFp32:
      return "fp32";
  }
  return "?";
}

std::optional<DType> ParseDType(std::string_view name) {
  if (name == "bf16") return DType::kBf16;
  if (name == "fp16" || name == "f16") return DType::kFp16;
  if (name == "fp8" || name == "f8") return DType::kFp8;
  if (name == "fp32" || name == "f32") return DType::kFp32;
  return std::nullopt;
}

std::string_view AttentionKindName(AttentionKind kind) {
  return kind == AttentionKind::kMla ? "mla" : "mha";
}

std::optional<AttentionKind> ParseAttentionKind(std::string_view name) {
  if (name == "mha" || name == "gqa" || name == "mqa") return AttentionKind::kMha;
  if (name == "mla") return AttentionKind::kMla;
  return std::nullopt;
}

std::string_view KvGroupKindName(KvGroupKind kind) {
  switch (kind) {
    case KvGroupKind::kFull:
      return "full";
    case KvGroupKind::kLatent:
      return "latent";
    case KvGroupKind::kSlidingWindow:
      return "sliding_window";
    case KvGroupKind::kState:
      return "state";
  }
  return "?";
}

std::optional<KvGroupKind> ParseKvGroupKind(std::string_view name) {
  for (KvGroupKind k :
       {KvGroupKind::kFull, KvGroupKind::kLatent, KvGroupKind::kSlidingWindow, KvGroupKind::kState})
    if (name == KvGroupKindName(k)) return k;
  return std::nullopt;
}

uint64_t KvLayoutGroup::bytes_per_token_layer() const {
  const uint64_t es = DTypeBytes(dtype);
  switch (kind) {
    case KvGroupKind::kFull:
    case KvGroupKind::kSlidingWindow:
      return 2 * uint64_t{num_kv_heads} * head_dim * es;
    case KvGroupKind::kLatent:
      return uint64_t{head_dim} * es;
    case KvGroupKind::kState:
      return 0;
  }
  return 0;
}

uint32_t KvLayoutGroup::stored_tokens(uint32_t block_tokens) const {
  if (kind == KvGroupKind::kState) return 0;
  if (kind != KvGroupKind::kSlidingWindow || page_tokens == 0) return block_tokens;
  // A resume at a block's end reads the window - 1 tokens before it, in whole engine pages.
  const uint64_t pages = (uint64_t{window > 0 ? window - 1 : 0} + page_tokens - 1) / page_tokens;
  return static_cast<uint32_t>(std::min<uint64_t>(block_tokens, pages * page_tokens));
}

uint64_t KvLayoutGroup::bytes_per_block(uint32_t block_tokens) const {
  return uint64_t{num_layers} * stored_tokens(block_tokens) * bytes_per_token_layer();
}

uint64_t KvLayoutGroup::full_bytes_per_block(uint32_t block_tokens) const {
  return uint64_t{num_layers} * (uint64_t{block_tokens} * bytes_per_token_layer() + state_bytes);
}

Status KvLayoutGroup::Validate(uint32_t block_tokens, const std::string& where) const {
  auto bad = [&](const std::string& field, const std::string& why) {
    return Status::InvalidArgument(where + "." + field + ": " + why);
  };
  if (num_layers == 0 || num_layers > 4096)
    return bad("num_layers", "must be in 1..4096, got " + std::to_string(num_layers));
  if (DTypeBytes(dtype) == 0) return bad("dtype", "unknown dtype");
  if (kind == KvGroupKind::kState) {
    if (state_bytes == 0 || state_bytes > (uint64_t{1} << 30))
      return bad("state_bytes", "must be in 1..1 GiB, got " + std::to_string(state_bytes));
    return Status::Ok();
  }
  if (state_bytes != 0) return bad("state_bytes", "only a state group has one");
  if (kind == KvGroupKind::kLatent && num_kv_heads != 1)
    return bad("num_kv_heads", "a latent group keeps one latent per token: must be 1, got " +
                                   std::to_string(num_kv_heads));
  if (num_kv_heads == 0 || num_kv_heads > 1024)
    return bad("num_kv_heads", "must be in 1..1024, got " + std::to_string(num_kv_heads));
  if (head_dim == 0 || head_dim > 65536)
    return bad("head_dim", "must be in 1..65536, got " + std::to_string(head_dim));
  if (kind == KvGroupKind::kSlidingWindow) {
    if (window == 0) return bad("window", "a sliding-window group needs its window (tokens)");
    if (page_tokens == 0 || block_tokens % page_tokens != 0)
      return bad("page_tokens", "must divide block_tokens " + std::to_string(block_tokens) +
                                    ", got " + std::to_string(page_tokens));
  } else if (window != 0) {
    return bad("window", "only a sliding_window group has one");
  }
  return Status::Ok();
}

std::string KvLayoutGroup::ToString() const {
  std::string s = std::string(KvGroupKindName(kind)) + " " + std::to_string(num_layers) + "L";
  if (kind == KvGroupKind::kState) return s + " x " + FormatBytes(state_bytes);
  s += " x " + std::to_string(num_kv_heads) + "H x " + std::to_string(head_dim) + "D " +
       std::string(DTypeName(dtype));
  if (kind == KvGroupKind::kSlidingWindow)
    s +=
        " window " + std::to_string(window) + " in " + std::to_string(page_tokens) + "-token pages";
  return s;
}

bool operator==(const KvLayout& a, const KvLayout& b) {
  if (a.grouped() || b.grouped()) return a.block_tokens == b.block_tokens && a.groups == b.groups;
  return a.num_layers == b.num_layers && a.num_kv_heads == b.num_kv_heads &&
         a.head_dim == b.head_dim && a.dtype == b.dtype && a.block_tokens == b.block_tokens &&
         a.attention == b.attention;
}

uint64_t KvLayout::bytes_per_block() const {
  if (!grouped()) return bytes_per_token() * block_tokens;
  uint64_t sum = 0;
  for (const KvLayoutGroup& g : groups) sum += g.bytes_per_block(block_tokens);
  return sum;
}

uint64_t KvLayout::full_bytes_per_block() const {
  if (!grouped()) return bytes_per_block();
  uint64_t sum = 0;
  for (const KvLayoutGroup& g : groups) sum += g.full_bytes_per_block(block_tokens);
  return sum;
}

std::vector<KvLayoutGroup> KvLayout::AsGroups() const {
  if (grouped()) return groups;
  KvLayoutGroup g;
  g.kind = attention == AttentionKind::kMla ? KvGroupKind::kLatent : KvGroupKind::kFull;
  g.num_layers = num_layers;
  g.num_kv_heads = num_kv_heads;
  g.head_dim = head_dim;
  g.dtype = dtype;
  return {g};
}

uint64_t KvLayout::state_bytes() const {
  uint64_t sum = 0;
  for (const KvLayoutGroup& g : groups) sum += g.state_record_bytes();
  return sum;
}

uint32_t KvLayout::state_blocks() const {
  const uint64_t bb = bytes_per_block();
  return bb ? static_cast<uint32_t>((state_bytes() + bb - 1) / bb) : 0;
}

uint64_t KvLayout::group_offset(size_t g) const {
  const bool state = g < groups.size() && groups[g].kind == KvGroupKind::kState;
  uint64_t off = 0;
  for (size_t i = 0; i < g && i < groups.size(); ++i)
    off += state ? groups[i].state_record_bytes() : groups[i].bytes_per_block(block_tokens);
  return off;
}

Status KvLayout::Validate() const {
  if (grouped()) {
    if (block_tokens == 0 || block_tokens > 4096)
      return Status::InvalidArgument("layout.block_tokens: must be in 1..4096, got " +
                                     std::to_string(block_tokens));
    if (groups.size() > 64)
      return Status::InvalidArgument("layout.groups: at most 64, got " +
                                     std::to_string(groups.size()));
    for (size_t i = 0; i < groups.size(); ++i)
      KVTIER_RETURN_IF_ERROR(
          groups[i].Validate(block_tokens, "layout.groups[" + std::to_string(i) + "]"));
    if (bytes_per_block() == 0)
      return Status::InvalidArgument(
          "layout.groups: a block would store nothing (a state group is stored beside a group "
          "that keeps tokens)");
    if (bytes_per_block() > (uint64_t{4} << 30))
      return Status::InvalidArgument("layout: a block of " + FormatBytes(bytes_per_block()) +
                                     " exceeds the 4 GiB limit");
    return Status::Ok();
  }
  if (num_layers == 0 || num_layers > 4096)
    return Status::InvalidArgument("layout.num_layers: must be in 1..4096, got " +
                                   std::to_string(num_layers));
  if (num_kv_heads == 0 || num_kv_heads > 1024)
    return Status::InvalidArgument("layout.num_kv_heads: must be in 1..1024, got " +
                                   std::to_string(num_kv_heads));
  if (head_dim == 0 || head_dim > 65536)
    return Status::InvalidArgument("layout.head_dim: must be in 1..65536, got " +
                                   std::to_string(head_dim));
  if (block_tokens == 0 || block_tokens > 4096)
    return Status::InvalidArgument("layout.block_tokens: must be in 1..4096, got " +
                                   std::to_string(block_tokens));
  if (DTypeBytes(dtype) == 0) return Status::InvalidArgument("layout.dtype: unknown dtype");
  if (attention == AttentionKind::kMla && num_kv_heads != 1)
    return Status::InvalidArgument(
        "layout.num_kv_heads: MLA stores one latent per token, so num_kv_heads must be 1, got " +
        std::to_string(num_kv_heads));
  if (bytes_per_block() > (uint64_t{4} << 30))
    return Status::InvalidArgument("layout: a block of " + FormatBytes(bytes_per_block()) +
                                   " exceeds the 4 GiB limit");
  return Status::Ok();
}

uint64_t KvLayout::bytes_per_token() const {
  if (grouped()) return block_tokens ? bytes_per_block() / block_tokens : 0;
  uint64_t per_layer = uint64_t{num_kv_heads} * head_dim * DTypeBytes(dtype);
  if (attention == AttentionKind::kMha) per_layer *= 2;  // K and V
  return per_layer * num_layers;
}

uint64_t KvLayout::fingerprint() const {
  if (grouped()) {
    // Its own encoding version: a grouped layout never shares keys with an ungrouped one.
    std::vector<unsigned char> b;
    auto put = [&](uint64_t v, int bytes) {
      for (int i = 0; i < bytes; ++i) b.push_back(static_cast<unsigned char>(v >> (8 * i)));
    };
    // 3: state groups kept apart from the block, in state records (2 had them in it).
    put(state_bytes() ? 3 : 2, 1);
    put(block_tokens, 4);
    put(groups.size(), 4);
    for (const KvLayoutGroup& g : groups) {
      put(static_cast<uint8_t>(g.kind), 1);
      put(g.num_layers, 4);
      put(g.num_kv_heads, 4);
      put(g.head_dim, 4);
      put(static_cast<uint8_t>(g.dtype), 1);
      put(g.window, 4);
      put(g.page_tokens, 4);
      put(g.state_bytes, 8);
    }
    return XXH3_64bits(b.data(), b.size());
  }
  // Fixed little-endian encoding with a version byte: stable across builds and machines.
  unsigned char buf[32] = {};
  size_t n = 0;
  auto put32 = [&](uint32_t v) {
    for (int i = 0; i < 4; ++i) buf[n++] = static_cast<unsigned char>(v >> (8 * i));
  };
  buf[n++] = 1;  // encoding version
  put32(num_layers);
  put32(num_kv_heads);
  put32(head_dim);
  put32(block_tokens);
  buf[n++] = static_cast<unsigned char>(dtype);
  buf[n++] = static_cast<unsigned char>(attention);
  return XXH3_64bits(buf, n);
}

std::string KvLayout::ToString() const {
  if (grouped()) {
    std::string s = "groups [";
    for (size_t i = 0; i < groups.size(); ++i) s += (i ? "; " : "") + groups[i].ToString();
    s += "], " + std::to_string(block_tokens) + " tok/block, " + FormatBytes(bytes_per_block()) +
         "/block";
    if (state_bytes())
      s += ", " + FormatBytes(state_bytes()) + " state in " + std::to_string(state_blocks()) +
           " block" + (state_blocks() == 1 ? "" : "s");
    return s;
  }
  return std::to_string(num_layers) + "L x " + std::to_string(num_kv_heads) + "H x " +
         std::to_string(head_dim) + "D " + std::string(DTypeName(dtype)) + " " +
         std::string(AttentionKindName(attention)) + ", " + std::to_string(block_tokens) +
         " tok/block, " + FormatBytes(bytes_per_block()) + "/block";
}

namespace {
struct Preset {
  const char* name;
  uint32_t layers, kv_heads, head_dim;
  AttentionKind attention;
};
// Public model configs; bf16 KV.
constexpr Preset kPresets[] = {
    {"llama-3.1-8b", 32, 8, 128, AttentionKind::kMha},
    {"llama-3.1-70b", 80, 8, 128, AttentionKind::kMha},
    {"qwen3-235b-a22b", 94, 4, 128, AttentionKind::kMha},
    {"deepseek-v3", 61, 1, 576, AttentionKind::kMla},  // 512 latent + 64 rope dims
};
}  // namespace

Result<KvLayout> LayoutPreset(std::string_view name, uint32_t block_tokens) {
  for (const Preset& p : kPresets) {
    if (name == p.name) {
      KvLayout l;
      l.num_layers = p.layers;
      l.num_kv_heads = p.kv_heads;
      l.head_dim = p.head_dim;
      l.dtype = DType::kBf16;
      l.block_tokens = block_tokens;
      l.attention = p.attention;
      KVTIER_RETURN_IF_ERROR(l.Validate());
      return l;
    }
  }
  std::string known;
  for (const Preset& p : kPresets) known += std::string(known.empty() ? "" : ", ") + p.name;
  return Status::NotFound("unknown layout preset '" + std::string(name) + "' (known: " + known +
                          ")");
}

std::vector<std::string> LayoutPresetNames() {
  std::vector<std::string> out;
  for (const Preset& p : kPresets) out.emplace_back(p.name);
  return out;
}

Result<uint64_t> ParseByteSize(std::string_view text) {
  std::string_view s = text;
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  double value = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || ptr == s.data() || value < 0 || !std::isfinite(value))
    return Status::InvalidArgument("cannot parse '" + std::string(text) + "' as a size");
  std::string_view unit(ptr, s.data() + s.size() - ptr);
  while (!unit.empty() && unit.front() == ' ') unit.remove_prefix(1);
  std::string u;
  for (char c : unit) u += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  double mult;
  if (u.empty() || u == "b")
    mult = 1;
  else if (u == "k" || u == "kb")
    mult = 1e3;
  else if (u == "kib")
    mult = 1024.0;
  else if (u == "m" || u == "mb")
    mult = 1e6;
  else if (u == "mib")
    mult = 1024.0 * 1024;
  else if (u == "g" || u == "gb")
    mult = 1e9;
  else if (u == "gib")
    mult = 1024.0 * 1024 * 1024;
  else if (u == "t" || u == "tb")
    mult = 1e12;
  else if (u == "tib")
    mult = 1024.0 * 1024 * 1024 * 1024;
  else
    return Status::InvalidArgument("cannot parse '" + std::string(text) +
                                   "' as a size: unknown unit '" + std::string(unit) +
                                   "' (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)");
  double bytes = value * mult;
  if (bytes > 1.8e19) return Status::InvalidArgument("size '" + std::string(text) + "' too large");
  return static_cast<uint64_t>(std::llround(bytes));
}

std::string FormatBytes(uint64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  double v = static_cast<double>(bytes);
  while (v >= 1024 && u < 5) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  if (u == 0 || v == std::floor(v))
    std::snprintf(buf, sizeof(buf), "%.0f %s", v, kUnits[u]);
  else
    std::snprintf(buf, sizeof(buf), "%.2f %s", v, kUnits[u]);
  return buf;
}

}  // namespace kvtier
