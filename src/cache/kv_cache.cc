// KvCache's token forms, once for every implementation (Cache in process, Client of a daemon).
#include "kvtier/kv_cache.h"

#include <string>
#include <vector>

namespace kvtier {

Result<LookupResult> KvCache::Lookup(std::span<const TokenId> tokens,
                                     const RequestOptions& request) {
  std::vector<BlockKey> keys;
  HashPrefix(Root(request), layout().block_tokens, tokens, &keys);
  return LookupKeys(keys, request);
}

Result<std::vector<BlockKey>> KvCache::KeysOf(std::span<const TokenId> tokens, uint32_t first_block,
                                              size_t num_blocks,
                                              const RequestOptions& request) const {
  const uint32_t bt = layout().block_tokens;
  const size_t full = bt ? tokens.size() / bt : 0;
  if (uint64_t{first_block} + num_blocks > full)
    return Status::InvalidArgument("Store: blocks " + std::to_string(first_block) + ".." +
                                   std::to_string(first_block + num_blocks) + " asked, but " +
                                   std::to_string(tokens.size()) + " tokens make only " +
                                   std::to_string(full) + " full blocks of " + std::to_string(bt));
  std::vector<BlockKey> keys;
  HashPrefix(Root(request), bt, tokens.subspan(0, (uint64_t{first_block} + num_blocks) * bt),
             &keys);
  keys.erase(keys.begin(), keys.begin() + first_block);
  return keys;
}

Result<StoreResult> KvCache::Store(std::span<const TokenId> tokens,
                                   std::span<const ConstBlock> blocks, uint32_t first_block,
                                   const RequestOptions& request) {
  auto keys = KeysOf(tokens, first_block, blocks.size(), request);
  if (!keys.ok()) return keys.status();
  return StoreKeys(*keys, blocks, first_block, request);
}

}  // namespace kvtier
