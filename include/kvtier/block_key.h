// BlockKey and the prefix hasher.
//
// key_i = XXH3_128(key_{i-1} || tokens of block i), with key_{-1} the namespace root
// H(model id, layout fingerprint, tenant salt, LoRA id). Equal prefixes in one namespace give
// equal key chains; different namespaces never share a root. A partial last block has no key.
// The byte encoding is fixed (little-endian, see doc/layout.md), so keys are stable across
// processes and machines.
//
// Thread-safety: BlockKey is a value. A PrefixHasher is not thread-safe; use one per request.
#ifndef KVTIER_BLOCK_KEY_H_
#define KVTIER_BLOCK_KEY_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "kvtier/layout.h"
#include "kvtier/status.h"

namespace kvtier {

using TokenId = uint32_t;

struct BlockKey {
  uint64_t hi = 0;
  uint64_t lo = 0;

  friend bool operator==(const BlockKey&, const BlockKey&) = default;
  friend auto operator<=>(const BlockKey&, const BlockKey&) = default;
  // 32 hex digits, hi first.
  std::string ToHex() const;
  // Parses ToHex() output; InvalidArgument otherwise.
  static Result<BlockKey> FromHex(std::string_view hex);
};

struct BlockKeyHash {
  size_t operator()(const BlockKey& k) const { return static_cast<size_t>(k.lo ^ (k.hi >> 7)); }
};

// What separates one cache namespace from another.
struct Namespace {
  std::string model_id;
  std::string model_revision;  // weights fingerprint or revision string; empty = unversioned
  uint64_t layout_fingerprint = 0;
  std::string tenant;   // tenant / cache salt; empty = the default tenant
  std::string lora_id;  // empty = base model

  BlockKey Root() const;
};

// One block's key from its parent's key and its tokens (exactly block_tokens of them).
BlockKey ChainKey(const BlockKey& parent, std::span<const TokenId> block_tokens);

// One block's key from its parent's key and an opaque 64-bit content id (a trace's hash id).
// Used by replay and simulation, where traces carry block ids instead of tokens.
BlockKey ChainKeyFromId(const BlockKey& parent, uint64_t content_id);

// Incremental hasher over one token sequence: Extend() hashes only the new full blocks.
class PrefixHasher {
 public:
  PrefixHasher(BlockKey root, uint32_t block_tokens);

  // Appends tokens; every completed block adds one key. Leftover tokens wait for more.
  void Extend(std::span<const TokenId> tokens);

  const std::vector<BlockKey>& keys() const { return keys_; }
  size_t full_blocks() const { return keys_.size(); }
  size_t pending_tokens() const { return pending_.size(); }
  uint32_t block_tokens() const { return block_tokens_; }

 private:
  BlockKey root_;
  uint32_t block_tokens_;
  std::vector<BlockKey> keys_;
  std::vector<TokenId> pending_;
};

// The key chain of the full blocks of `tokens`, appended to *out (cleared first).
void HashPrefix(const BlockKey& root, uint32_t block_tokens, std::span<const TokenId> tokens,
                std::vector<BlockKey>* out);

// The keys block `block`'s state record is stored under, n of them (KvLayout::state_blocks()):
// key p is the key of a one-token block of token kStateToken - p chained on `block`, apart
// from every chain key (doc/layout.md, "State records").
inline constexpr TokenId kStateToken = 0xFFFFFFFFu;
std::vector<BlockKey> StateKeys(const BlockKey& block, uint32_t n);

// XXH3-64 of bytes: the block checksum used by the index and the lower tiers.
uint64_t Checksum64(std::span<const std::byte> bytes);

}  // namespace kvtier

template <>
struct std::hash<kvtier::BlockKey> {
  size_t operator()(const kvtier::BlockKey& k) const { return kvtier::BlockKeyHash{}(k); }
};

#endif  // KVTIER_BLOCK_KEY_H_
