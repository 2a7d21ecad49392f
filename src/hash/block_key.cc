#include "kvtier/block_key.h"

#include <cstring>

#include "hash/xxh.h"
#include "hash/xxh3_wide.h"

namespace kvtier {
namespace {

// Blocks of up to this many tokens are hashed from a stack buffer in one XXH3 call.
constexpr size_t kStackTokens = 512;

inline void PutLe64(unsigned char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}

inline BlockKey FromXxh(XXH128_hash_t h) { return BlockKey{h.high64, h.low64}; }

inline bool LittleEndianHost() {
  const uint16_t one = 1;
  unsigned char b;
  std::memcpy(&b, &one, 1);
  return b == 1;
}

}  // namespace

std::string BlockKey::ToHex() const {
  static const char* kDigits = "0123456789abcdef";
  std::string s(32, '0');
  for (int i = 0; i < 16; ++i) {
    s[15 - i] = kDigits[(hi >> (4 * i)) & 0xf];
    s[31 - i] = kDigits[(lo >> (4 * i)) & 0xf];
  }
  return s;
}

Result<BlockKey> BlockKey::FromHex(std::string_view hex) {
  if (hex.size() != 32)
    return Status::InvalidArgument("block key '" + std::string(hex) + "': want 32 hex digits");
  BlockKey k;
  for (size_t i = 0; i < 32; ++i) {
    char c = hex[i];
    uint64_t d;
    if (c >= '0' && c <= '9')
      d = c - '0';
    else if (c >= 'a' && c <= 'f')
      d = c - 'a' + 10;
    else if (c >= 'A' && c <= 'F')
      d = c - 'A' + 10;
    else
      return Status::InvalidArgument("block key '" + std::string(hex) + "': not hex");
    uint64_t& half = i < 16 ? k.hi : k.lo;
    half = (half << 4) | d;
  }
  return k;
}

BlockKey Namespace::Root() const {
  // Length-prefixed fields, so ("ab","c") and ("a","bc") differ.
  std::string buf = "kvtier-ns-v2";
  auto put_str = [&](const std::string& s) {
    unsigned char len[8];
    PutLe64(len, s.size());
    buf.append(reinterpret_cast<const char*>(len), 8);
    buf += s;
  };
  put_str(model_id);
  put_str(model_revision);
  unsigned char fp[8];
  PutLe64(fp, layout_fingerprint);
  buf.append(reinterpret_cast<const char*>(fp), 8);
  put_str(tenant);
  put_str(lora_id);
  return FromXxh(XXH3_128bits(buf.data(), buf.size()));
}

BlockKey ChainKey(const BlockKey& parent, std::span<const TokenId> tokens) {
  unsigned char stack_buf[16 + 4 * kStackTokens];
  std::vector<unsigned char> heap_buf;
  unsigned char* buf = stack_buf;
  const size_t bytes = 16 + 4 * tokens.size();
  if (tokens.size() > kStackTokens) {
    heap_buf.resize(bytes);
    buf = heap_buf.data();
  }
  PutLe64(buf, parent.hi);
  PutLe64(buf + 8, parent.lo);
  if (LittleEndianHost()) {
    std::memcpy(buf + 16, tokens.data(), 4 * tokens.size());
  } else {
    for (size_t i = 0; i < tokens.size(); ++i) {
      for (int b = 0; b < 4; ++b)
        buf[16 + 4 * i + b] = static_cast<unsigned char>(tokens[i] >> (8 * b));
    }
  }
  return FromXxh(XXH3_128bits(buf, bytes));
}

BlockKey ChainKeyFromId(const BlockKey& parent, uint64_t content_id) {
  unsigned char buf[25];
  buf[0] = 0xB1;  // domain tag: an id-keyed block never equals a token-keyed one
  PutLe64(buf + 1, parent.hi);
  PutLe64(buf + 9, parent.lo);
  PutLe64(buf + 17, content_id);
  return FromXxh(XXH3_128bits(buf, sizeof(buf)));
}

PrefixHasher::PrefixHasher(BlockKey root, uint32_t block_tokens)
    : root_(root), block_tokens_(block_tokens == 0 ? 1 : block_tokens) {
  pending_.reserve(block_tokens_);
}

void PrefixHasher::Extend(std::span<const TokenId> tokens) {
  size_t i = 0;
  // Complete a pending partial block first.
  if (!pending_.empty()) {
    size_t need = block_tokens_ - pending_.size();
    size_t take = std::min(need, tokens.size());
    pending_.insert(pending_.end(), tokens.begin(), tokens.begin() + take);
    i = take;
    if (pending_.size() < block_tokens_) return;
    keys_.push_back(ChainKey(keys_.empty() ? root_ : keys_.back(), pending_));
    pending_.clear();
  }
  keys_.reserve(keys_.size() + (tokens.size() - i) / block_tokens_);
  for (; i + block_tokens_ <= tokens.size(); i += block_tokens_) {
    keys_.push_back(
        ChainKey(keys_.empty() ? root_ : keys_.back(), tokens.subspan(i, block_tokens_)));
  }
  pending_.assign(tokens.begin() + i, tokens.end());
}

void HashPrefix(const BlockKey& root, uint32_t block_tokens, std::span<const TokenId> tokens,
                std::vector<BlockKey>* out) {
  out->clear();
  if (block_tokens == 0) return;
  const size_t n = tokens.size() / block_tokens;
  out->resize(n);
  BlockKey parent = root;
  for (size_t b = 0; b < n; ++b) {
    parent = ChainKey(parent, tokens.subspan(b * block_tokens, block_tokens));
    (*out)[b] = parent;
  }
}

std::vector<BlockKey> StateKeys(const BlockKey& block, uint32_t n) {
  std::vector<BlockKey> out(n);
  for (uint32_t p = 0; p < n; ++p) {
    const TokenId token[1] = {kStateToken - p};
    out[p] = ChainKey(block, token);
  }
  return out;
}

uint64_t Checksum64(std::span<const std::byte> bytes) {
  return WideXxh3(bytes.data(), bytes.size());
}

}  // namespace kvtier
