// CacheHooks: what `kvtier serve` needs of a Cache beyond the KvCache calls, when its first
// tier is a shared-arena HostTier (HostTierOptions::shared): slots that a client process fills
// itself and that become visible only when committed. Internal; not part of the public API.
//
// Thread-safety: as Cache. A reservation is owned by whoever took it and must end in exactly
// one Unreserve or Commit.
#ifndef KVTIER_SRC_CACHE_CACHE_HOOKS_H_
#define KVTIER_SRC_CACHE_CACHE_HOOKS_H_

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "kvtier/cache.h"

namespace kvtier {

class HostTier;

class CacheHooks {
 public:
  // True when tier 0 is a cache-managed HostTier on a memfd.
  static bool HasSharedHost(const Cache& cache);
  static HostTier& SharedHost(Cache& cache);

  // Takes up to n slots of tier 0's arena partition `partition` (HostTier::AddPartition),
  // evicting unpinned blocks by its policy to make room. Returns how many (appended to
  // *slots); they count as occupied until Unreserve or Commit.
  static size_t Reserve(Cache& cache, int partition, size_t n, std::vector<uint32_t>* slots);
  static void Unreserve(Cache& cache, std::span<const uint32_t> slots);
  // Refreshes tier 0's policy for the resident keys[i] (chain positions[i]), last to first, as
  // an in-process Store does for the blocks it finds present. Call before Reserve, which may
  // otherwise evict them for the new blocks of the same request.
  static void Touch(Cache& cache, std::span<const BlockKey> keys,
                    std::span<const uint32_t> positions, uint64_t session_id);

  // Makes the reserved slots[i] resident as keys[i] (positions first_block.. of a chain) with
  // checksums[i]: published in tier 0, its policy and the index, with events, then queued for
  // the lower tiers (write-through mode). Never waits on a lower tier: when the write queue is
  // full, the write-through is dropped and counted (CacheStats::write_through_dropped_blocks).
  // A cache without a write queue (write_queue_blocks 0) writes the lower tiers first, here; the
  // daemon's config refuses that. A key already resident in tier 0 keeps its copy
  // (present_blocks); its slot is freed. engine: the engine's hashes of keys[i] for its
  // events (RequestOptions::engine_hashes), one per key or none; moved from.
  static StoreResult Commit(Cache& cache, std::span<const BlockKey> keys,
                            std::span<const uint32_t> slots, std::span<const uint64_t> checksums,
                            uint32_t first_block, uint64_t session_id = 0,
                            std::span<EngineBlockHashes> engine = {});

  // Cache::Load, with the promotion of blocks from lower tiers into tier 0 done before it
  // returns (the client reads them from the arena), not in the background.
  static Result<LoadResult> LoadIntoHost(Cache& cache, const LookupResult& lookup,
                                         std::span<const MutableBlock> dst);

  // Cache::LookupKeys, with each hit block's indexed checksum (0: none) read in the same
  // pass over the index into *checksums.
  static Result<LookupResult> LookupKeys(Cache& cache, std::span<const BlockKey> keys,
                                         const RequestOptions& request,
                                         std::vector<uint64_t>* checksums);
  // out[i] = the checksum the index holds for keys[i] (0: none or not indexed).
  static void Checksums(const Cache& cache, std::span<const BlockKey> keys,
                        std::span<uint64_t> out);

  // Drops every unpinned block of the cache-managed tiers (host, emulated_device), with
  // removal events. Returns how many blocks.
  static uint64_t ClearManaged(Cache& cache);

  // Drops every indexed block whose key matches, from every tier holding it, with removal
  // events; a block pinned in a cache-managed tier stays there (a reader holds it) and is
  // counted in *pinned. Blocks of an unindexed lower tier (SSD blocks from before a restart,
  // a shared remote's blocks this cache never saw) are not found. Returns the blocks dropped
  // from at least one tier.
  static uint64_t DropMatching(Cache& cache, const std::function<bool(const BlockKey&)>& match,
                               uint64_t* pinned);
};

}  // namespace kvtier

#endif  // KVTIER_SRC_CACHE_CACHE_HOOKS_H_
