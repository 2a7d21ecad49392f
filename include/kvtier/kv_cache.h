// KvCache: what an inference engine calls, wherever the cache lives.
//
// Two implementations share this interface: Cache (in the engine's own process, see cache.h)
// and Client (a node's `kvtier serve` daemon, see client.h), so an engine switches between them
// with one option and no other change.
//
//   Lookup(tokens)         -> which leading blocks are cached and where (and pins them)
//   Load(lookup, buffers)  -> copies them into the engine's blocks; failures -> recompute
//   Store(tokens, blocks)  -> writes new full blocks into the cache
//
// Every failure is per block: Load reports how many leading blocks it delivered and the caller
// recomputes the rest; nothing serves a block that failed its checksum.
//
// Thread-safety: every method may be called concurrently. Ownership: a LookupResult's pins
// must be released (destroyed) before the KvCache that made them.
#ifndef KVTIER_KV_CACHE_H_
#define KVTIER_KV_CACHE_H_

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kvtier/block_key.h"
#include "kvtier/events.h"
#include "kvtier/layout.h"
#include "kvtier/metrics.h"
#include "kvtier/policy.h"
#include "kvtier/status.h"
#include "kvtier/tier.h"

namespace kvtier {

struct RequestOptions {
  std::string tenant;   // empty = the cache's default tenant
  std::string lora_id;  // empty = the cache's default LoRA (usually the base model)
  uint64_t session_id = 0;
  // Store only: the engine's own hashes of each stored block (engine_hashes[i] for blocks[i];
  // empty: none). Kept while the block is resident and announced in its KV events instead of
  // kvtier's key (doc/events.md); not kept when nothing listens (WantsEngineHashes).
  std::span<const EngineBlockHashes> engine_hashes;
};

// Move-only handle that keeps a lookup's hit blocks resident until it is released or destroyed.
// What it holds is the implementation's business (index pins in process, a lease in a daemon).
class PinHandle {
 public:
  // Whatever keeps the pins; destroying it releases them.
  class Holder {
   public:
    virtual ~Holder() = default;
  };
  PinHandle() = default;
  explicit PinHandle(std::unique_ptr<Holder> holder) : holder_(std::move(holder)) {}
  PinHandle(PinHandle&&) noexcept = default;
  PinHandle& operator=(PinHandle&&) noexcept = default;

  void Release() { holder_.reset(); }
  bool held() const { return holder_ != nullptr; }
  Holder* holder() const { return holder_.get(); }

 private:
  std::unique_ptr<Holder> holder_;
};

struct LookupResult {
  std::vector<BlockKey> keys;  // keys of every full block of the request
  uint32_t hit_blocks = 0;     // leading blocks that can be loaded
  std::vector<int8_t> source;  // source[i] (i < hit_blocks): tier to load block i from
  std::array<uint32_t, kMaxTiers> blocks_by_tier{};  // hit blocks per source tier
  PinHandle pins;                                    // keeps the hit blocks resident until released
  uint32_t block_tokens = 0;
  uint64_t hit_tokens() const { return uint64_t{hit_blocks} * block_tokens; }
};

struct LoadResult {
  uint32_t loaded_blocks = 0;        // leading blocks delivered; recompute from here on
  std::vector<Status> block_status;  // per requested block
  uint64_t bytes = 0;
};

struct StoreResult {
  uint32_t stored_blocks = 0;   // blocks newly written to at least one tier
  uint32_t present_blocks = 0;  // already resident (touched, not copied)
  uint32_t failed_blocks = 0;
  Status first_error;  // the first failure, for logs
};

struct CacheStats {
  struct PerTier {
    std::string name;
    TierKind kind = TierKind::kHost;
    TierStats tier;
    uint64_t resident_blocks = 0;
    uint64_t hit_blocks = 0;  // blocks served by Lookup+Load from this tier
    uint64_t evictions = 0;
    uint64_t writebacks = 0;      // victims moved down on eviction
    uint64_t rejected = 0;        // refused by admission: skipped_prefix + skipped_reuse
    uint64_t admitted = 0;        // offered to this tier (below the first) and admitted
    uint64_t skipped_prefix = 0;  // refused: the request was shorter than min_prefix_tokens
    uint64_t skipped_reuse = 0;   // refused (for now): fewer lookup hits than min_reuse
    uint64_t corruptions = 0;     // loads that failed verification
    uint64_t write_failures = 0;  // background writes into this tier that failed
    // Hit blocks the engine chose to recompute rather than load from this tier (its planner).
    uint64_t declined_blocks = 0;
  };
  std::vector<PerTier> tiers;
  uint64_t lookups = 0;
  uint64_t lookup_blocks = 0;
  uint64_t hit_blocks = 0;
  uint64_t loads = 0;
  uint64_t load_failed_blocks = 0;  // became recompute
  uint64_t stores = 0;
  uint64_t stored_blocks = 0;
  uint64_t write_queue_waits = 0;   // Stores that waited for room in the write queue
  uint64_t promotions_dropped = 0;  // promotions skipped because the write queue was full
  // Blocks kept in the first tier only, not written through: the write queue was full (the
  // lower tiers slower than the writes), and neither a daemon's commit nor a lookup's reuse
  // write (admission's min_reuse) waits for it.
  uint64_t write_through_dropped_blocks = 0;
  Histogram::Snapshot lookup_latency_ns;
  Histogram::Snapshot load_latency_ns;
  Histogram::Snapshot store_latency_ns;
};

class KvCache {
 public:
  virtual ~KvCache() = default;

  virtual const KvLayout& layout() const = 0;

  // The namespace root of a request (model, its revision, layout, tenant, LoRA).
  virtual BlockKey Root(const RequestOptions& request = {}) const = 0;

  // Hashes tokens' full blocks and finds the longest loadable prefix; pins it. One
  // implementation for every KvCache: the keys of Root(request), then LookupKeys.
  Result<LookupResult> Lookup(std::span<const TokenId> tokens, const RequestOptions& request = {});
  // Same, for a chain the caller hashed (e.g. incrementally with PrefixHasher).
  virtual Result<LookupResult> LookupKeys(std::span<const BlockKey> keys,
                                          const RequestOptions& request = {}) = 0;

  // Copies lookup's first dst.size() hit blocks (dst.size() <= hit_blocks) into dst.
  // InvalidArgument when dst is longer than hit_blocks or a buffer has the wrong size.
  Result<LoadResult> Load(const LookupResult& lookup, std::span<const MutableBlock> dst) {
    return Load(lookup, 0, dst);
  }
  // Copies lookup's hit blocks [first, first + dst.size()) into dst: a tail the planner chose
  // to load after recomputing the head, or a long hit in chunks through one bounded buffer; no
  // second Lookup. loaded_blocks counts from first. InvalidArgument when the range passes
  // hit_blocks or a buffer has the wrong size.
  virtual Result<LoadResult> Load(const LookupResult& lookup, uint32_t first,
                                  std::span<const MutableBlock> dst) = 0;

  // Hands lookup's hit blocks [first, first + n) to visit(i, bytes), in order (i counts from
  // first; bytes are valid during the call only), so an engine copies each block once, from
  // where it lies into its own pages: a block the cache can read in place (the in-process host
  // tier, kept by the lookup's pins) is lent with no copy, the others are loaded into scratch
  // (whole blocks, at least one; up to scratch.size() per Load) first. Stops at the first block
  // that does not load; loaded_blocks and block_status as Load's: only the first loaded_blocks
  // are good, though visit may have seen one more (a lender that checks a block after lending
  // it, as the daemon's Client). InvalidArgument as Load's, and when scratch holds no block.
  // This implementation lends nothing.
  using BlockVisitor = std::function<void(uint32_t i, ConstBlock bytes)>;
  virtual Result<LoadResult> LoadVisit(const LookupResult& lookup, uint32_t first, uint32_t n,
                                       std::span<const MutableBlock> scratch,
                                       const BlockVisitor& visit);

  // Stores blocks[i] as full block first_block + i of tokens. InvalidArgument when there are
  // more blocks than full blocks in tokens, or a buffer has the wrong size. One implementation
  // for every KvCache: the keys of Root(request), then StoreKeys.
  Result<StoreResult> Store(std::span<const TokenId> tokens, std::span<const ConstBlock> blocks,
                            uint32_t first_block = 0, const RequestOptions& request = {});
  // The keys Store gives full blocks first_block..first_block + num_blocks of tokens (for
  // StoreKeys or an AsyncStore). InvalidArgument when tokens hold fewer full blocks.
  Result<std::vector<BlockKey>> KeysOf(std::span<const TokenId> tokens, uint32_t first_block,
                                       size_t num_blocks, const RequestOptions& request = {}) const;
  // Same, for keys[i] <-> blocks[i], keys being chain positions first_block.. of a request.
  virtual Result<StoreResult> StoreKeys(std::span<const BlockKey> keys,
                                        std::span<const ConstBlock> blocks,
                                        uint32_t first_block = 0,
                                        const RequestOptions& request = {}) = 0;

  // Session lifecycle hints for session-aware policies.
  virtual void NotifySession(uint64_t session_id, SessionEvent event) = 0;

  // The engine chose to recompute blocks_by_tier[t] hit blocks of tier t rather than load them
  // (its planner): counted per tier (CacheStats::PerTier::declined_blocks). Tiers past the
  // cache's are ignored.
  virtual void NoteDeclined(std::span<const uint32_t> blocks_by_tier) = 0;

  virtual CacheStats stats() const = 0;

  // Whether Store's engine_hashes are used (the cache publishes KV events): an engine may skip
  // building them otherwise.
  virtual bool WantsEngineHashes() const { return false; }

  // A second way into the same cache for a background store thread (AsyncStore), so a lookup
  // never waits behind a store that a low-priority thread is holding up. nullptr (the default):
  // calls here do not queue behind each other, share this one.
  virtual std::unique_ptr<KvCache> OpenStoreLane() const { return nullptr; }

 protected:
  // LoadVisit's argument checks (InvalidArgument naming what is wrong), for every implementation.
  Status CheckVisit(const LookupResult& lookup, uint32_t first, uint32_t n,
                    std::span<const MutableBlock> scratch) const;
};

}  // namespace kvtier

#endif  // KVTIER_KV_CACHE_H_
