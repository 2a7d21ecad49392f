// Cache: the facade an inference engine calls.
//
//   Lookup(tokens)         -> which leading blocks are cached and where (and pins them)
//   Load(lookup, buffers)  -> copies them into the engine's blocks; failures -> recompute
//   Store(tokens, blocks)  -> writes new full blocks down the tiers (write-through), or into the
//                             first tier only with write-back of victims on eviction
//   WaitForWrites()        -> waits for the background writes
//
// Asynchronous writes (CacheOptions::write_queue_blocks > 0, the default): Store copies into
// the first tier and returns; a writer thread the Cache owns writes the lower tiers from that
// copy, which stays pinned until written, in batches (one Put per tier), and moves write-back
// victims down and promotes loaded blocks the same way. A block shows in a
// lower tier (Lookup, events) only once that tier holds it. Failed background writes are
// counted in CacheStats::PerTier::write_failures. on_event may be called from the writer.
//
// Every failure is per block: Load reports how many leading blocks it delivered and the caller
// recomputes the rest; nothing here crashes or serves a block that failed its checksum.
//
// Thread-safety: every method may be called concurrently. Ownership: the Cache owns its tiers
// (shared with the caller when TierSpec::instance was given); a LookupResult's pins must be
// released (destroyed) before the Cache is.
#ifndef KVTIER_CACHE_H_
#define KVTIER_CACHE_H_

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kvtier/block_key.h"
#include "kvtier/events.h"
#include "kvtier/kv_cache.h"
#include "kvtier/layout.h"
#include "kvtier/policy.h"
#include "kvtier/status.h"
#include "kvtier/tier.h"
#include "kvtier/tier_factory.h"

namespace kvtier {

enum class WriteMode : uint8_t {
  kWriteThrough,  // Store writes every tier (each tier's admission decides)
  kWriteBack,     // Store writes the first tier; a victim moves to the next tier on eviction
};
std::string_view WriteModeName(WriteMode mode);

struct CacheOptions {
  KvLayout layout;
  std::string model_id = "default";
  // What keeps two checkpoints served under one model_id apart: a hash of the weights, or a
  // revision string. Part of every key's namespace root.
  std::string model_revision;
  std::string tenant;  // the default namespace; a request may name another
  std::string lora_id;
  std::vector<TierSpec> tiers;  // fastest first; at most kMaxTiers
  WriteMode write_mode = WriteMode::kWriteThrough;
  bool promote_on_load = true;   // a block loaded from a lower tier is copied into the first
  bool verify_checksums = true;  // checksum on Store; verify loads from verify_on_load tiers
  KvEventCallback on_event;
  // The Cache's own KV-event publisher (vLLM's wire format, doc/events.md); off by default.
  // When on, blocks the disk tier recovered at open are indexed and announced at once.
  KvEventsOptions events;
  // Blocks queued for the background writer at most; a Store waits while the queue is full
  // (backpressure). 0: every tier is written in the caller's thread before Store returns, and
  // Load promotes in the caller's thread (the synchronous behaviour; deterministic). In
  // write-through mode at most half the first tier's blocks are used (queued blocks stay
  // pinned there until written).
  uint32_t write_queue_blocks = 256;

  // OK, or InvalidArgument naming the field ("tiers[1].capacity_bytes: must be > 0").
  Status Validate() const;
};

// A load of whole blocks that lands layer by layer (KvLayout: each block holds layer 0's K and
// V, then layer 1's, ...). Tiers that read slices (host, disk) deliver layer l of every block
// before layer l + 1 of any, so an engine computes layer l while layer l + 1 is read; blocks of
// other tiers (remote) arrive whole before layer 0 is reported. A block is checked whole, once
// every layer is in: until Finish() says which blocks are good, what was computed from them is
// provisional (a failed block is recomputed, and so is what attended to it).
//
// Thread-safety: one thread calls its methods; the load's own thread only fills the buffers.
class LayerwiseLoad {
 public:
  class State;
  explicit LayerwiseLoad(std::unique_ptr<State> state);
  // Cancel()s.
  ~LayerwiseLoad();
  LayerwiseLoad(const LayerwiseLoad&) = delete;
  LayerwiseLoad& operator=(const LayerwiseLoad&) = delete;

  uint32_t num_layers() const;
  uint32_t num_blocks() const;
  // OK once layer `layer` of every block is in place, or the load has stopped (cancelled, or
  // every block failed: Finish says which). Unavailable("... timed out ...") when the timeout
  // passes first (the load goes on); InvalidArgument for layer >= num_layers().
  Status WaitLayer(uint32_t layer, std::chrono::milliseconds timeout);
  // Waits for every layer, checks each block whole against its checksum and returns what Load
  // would have: loaded_blocks is the leading run of good blocks, block_status says why the others
  // failed (a corrupt block is dropped from its tier). Blocks read from below the first tier
  // are promoted into it as Load does. Unavailable when the timeout passes first;
  // InvalidArgument when called again after it returned a result.
  Result<LoadResult> Finish(std::chrono::milliseconds timeout);
  // Stops before the next layer and waits for the one being read; no buffer is touched after
  // it returns. Finish() then reports the blocks not fully loaded as failed.
  void Cancel();

 private:
  std::unique_ptr<State> state_;
};

class Cache final : public KvCache {
 public:
  // Builds the tiers and policies. InvalidArgument for bad options (naming the key); the
  // error of a tier that failed to open otherwise.
  static Result<std::unique_ptr<Cache>> Open(CacheOptions options);
  ~Cache();
  Cache(const Cache&) = delete;
  Cache& operator=(const Cache&) = delete;

  const KvLayout& layout() const override;
  int num_tiers() const;
  Tier& tier(int index);

  // The namespace root of a request.
  BlockKey Root(const RequestOptions& request = {}) const override;

  // KvCache::Lookup(tokens) hashes them and calls this: the chain's longest loadable prefix,
  // pinned.
  Result<LookupResult> LookupKeys(std::span<const BlockKey> keys,
                                  const RequestOptions& request = {}) override;

  using KvCache::Load;
  Result<LoadResult> Load(const LookupResult& lookup, uint32_t first,
                          std::span<const MutableBlock> dst) override;
  // Blocks the first tier holds in this process's memory (a host tier) are lent in place.
  Result<LoadResult> LoadVisit(const LookupResult& lookup, uint32_t first, uint32_t n,
                               std::span<const MutableBlock> scratch,
                               const BlockVisitor& visit) override;
  // The same blocks, landing one layer at a time (see LayerwiseLoad) from a thread of the
  // load's own: returns at once. The lookup's pins must be held, and dst kept, until the load
  // is finished or destroyed; the load must end before the Cache does. InvalidArgument as Load.
  Result<std::unique_ptr<LayerwiseLoad>> LoadLayerwise(const LookupResult& lookup, uint32_t first,
                                                       std::span<const MutableBlock> dst);

  // Stores keys[i] <-> blocks[i], keys being chain positions first_block.. of a request
  // (KvCache::Store(tokens, blocks) hashes the tokens and calls this). InvalidArgument when a
  // buffer has the wrong size. With asynchronous writes, stored_blocks counts blocks the first
  // tier took or the writer queued (their later failures count in write_failures); the buffers
  // may be reused on return.
  Result<StoreResult> StoreKeys(std::span<const BlockKey> keys, std::span<const ConstBlock> blocks,
                                uint32_t first_block = 0,
                                const RequestOptions& request = {}) override;

  // Session lifecycle hints for session-aware policies.
  void NotifySession(uint64_t session_id, SessionEvent event) override;
  void NoteDeclined(std::span<const uint32_t> blocks_by_tier) override;
  bool WantsEngineHashes() const override;

  // Waits until every background write queued before the call (and what it cascades into)
  // is done. Destroying the Cache also drains the queue first.
  void WaitForWrites();

  CacheStats stats() const override;
  // The KV-event publisher (CacheOptions::events); endpoint empty when it is off.
  KvEventsInfo events_info() const;
  // Prometheus text exposition format (version 0.0.4) of stats().
  std::string PrometheusText() const;

  class Impl;

 private:
  friend class CacheHooks;  // src/cache/cache_hooks.h: the daemon's internal hooks
  explicit Cache(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvtier

#endif  // KVTIER_CACHE_H_
