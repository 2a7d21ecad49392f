// KvCache's token forms, once for every implementation (Cache in process, Client of a daemon).
#include "kvtier/kv_cache.h"

#include <algorithm>
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

Status KvCache::CheckVisit(const LookupResult& lookup, uint32_t first, uint32_t n,
                           std::span<const MutableBlock> scratch) const {
  if (scratch.empty()) return Status::InvalidArgument("LoadVisit: no scratch block");
  if (uint64_t{first} + n > lookup.hit_blocks)
    return Status::InvalidArgument("LoadVisit: blocks " + std::to_string(first) + ".." +
                                   std::to_string(uint64_t{first} + n) + " asked of a lookup of " +
                                   std::to_string(lookup.hit_blocks) + " hit blocks");
  const uint64_t bb = layout().bytes_per_block();
  for (size_t i = 0; i < scratch.size(); ++i)
    if (scratch[i].size() != bb)
      return Status::InvalidArgument("LoadVisit: scratch block " + std::to_string(i) + " has " +
                                     std::to_string(scratch[i].size()) + " bytes, a block has " +
                                     std::to_string(bb));
  return Status::Ok();
}

Result<LoadResult> KvCache::LoadVisit(const LookupResult& lookup, uint32_t first, uint32_t n,
                                      std::span<const MutableBlock> scratch,
                                      const BlockVisitor& visit) {
  KVTIER_RETURN_IF_ERROR(CheckVisit(lookup, first, n, scratch));
  LoadResult r;
  r.block_status.assign(n, Status::Ok());
  while (r.loaded_blocks < n) {
    const uint32_t i = r.loaded_blocks;
    const uint32_t k = static_cast<uint32_t>(std::min<uint64_t>(scratch.size(), n - i));
    KVTIER_ASSIGN_OR_RETURN(LoadResult part, Load(lookup, first + i, scratch.first(k)));
    for (uint32_t j = 0; j < k; ++j) r.block_status[i + j] = part.block_status[j];
    for (uint32_t j = 0; j < part.loaded_blocks; ++j) visit(i + j, scratch[j]);
    r.loaded_blocks += part.loaded_blocks;
    r.bytes += part.bytes;
    if (part.loaded_blocks < k) break;
  }
  return r;
}

}  // namespace kvtier
