// Tier: one storage level for KV blocks (host DRAM, an emulated device tier, disk, remote).
//
// Public methods are non-virtual: they check arguments, time the call and keep stats, then call
// the protected ...Impl virtuals that implementations provide. All calls are batched; each block
// gets its own Status in `results` (a failure of one block never fails the batch).
//
// Residency: for a tier whose capabilities().managed_by_cache is true, the Cache decides what is
// evicted (by policy, respecting pins) and calls Erase; Put into a full tier fails with
// ResourceExhausted. A self-managed tier (disk segments, Redis maxmemory) evicts on its own and
// reports removals through the removal listener.
//
// Thread-safety: every public method may be called concurrently from any thread.
// Ownership: the tier never keeps a caller's buffers past the call.
#ifndef KVTIER_TIER_H_
#define KVTIER_TIER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/block_key.h"
#include "kvtier/layout.h"
#include "kvtier/metrics.h"
#include "kvtier/status.h"

namespace kvtier {

class HostTier;  // src/tiers/host: the tier behind shared_arena()

// Tiers one cache stacks at most (tier masks and per-tier arrays are this wide).
inline constexpr int kMaxTiers = 8;

// kEmulatedDevice: a host-DRAM arena standing in for a device (HBM) tier, until a CUDA tier
// exists; it never holds device memory.
enum class TierKind : uint8_t { kEmulatedDevice, kHost, kDisk, kRemote };
// TierKind values are 0..kNumTierKinds - 1 (the daemon's stats reply carries them as a u8).
inline constexpr int kNumTierKinds = 4;
std::string_view TierKindName(TierKind kind);

using ConstBlock = std::span<const std::byte>;
using MutableBlock = std::span<std::byte>;

struct TierCapabilities {
  bool managed_by_cache = true;  // false: the tier evicts by itself and notifies.
  bool authoritative = true;     // false: others may add or drop blocks (shared remote);
                                 // the index is a hint and Lookup asks Exists.
  bool persistent = false;       // survives a process restart.
  bool shared = false;           // other processes see the same blocks.
  bool verify_on_load = false;   // bytes come from outside this process: verify checksums.
  // The tier checks every read against a checksum stored with the bytes (and the key) and
  // reports Corruption itself, so the Cache neither checksums its Stores nor re-verifies its
  // loads (one pass over each block saved). Disk and remote tiers do.
  bool verifies_reads = false;
  // GetSlice reads part of a block (one layer of it, for a layer-wise load) without the rest.
  bool reads_slices = false;
};

struct TierStats {
  uint64_t puts = 0;  // blocks stored
  uint64_t put_bytes = 0;
  uint64_t put_failures = 0;
  uint64_t gets = 0;          // blocks asked for
  uint64_t hits = 0;          // blocks returned
  uint64_t misses = 0;        // NotFound
  uint64_t get_failures = 0;  // other errors (Corruption, Unavailable, ...)
  uint64_t get_bytes = 0;
  uint64_t erases = 0;
  uint64_t used_bytes = 0;
  uint64_t capacity_bytes = 0;
  // Blocks held: counted by the tier, not derived from used_bytes where those include more
  // than blocks (a disk tier's headers and dead records, a Redis server's own memory).
  uint64_t resident_blocks = 0;
  Histogram::Snapshot put_latency_ns;  // per batch
  Histogram::Snapshot get_latency_ns;  // per batch
  // What only some kinds count (the remote tier: breaker opens, deadline hits, corrupt values
  // dropped, ...), exported as kvtier_tier_<name>_total in /metrics; a gauge (a level, such as
  // "degraded": 1 while the tier is in trouble) as kvtier_tier_<name>.
  // Strings, not static pointers: a daemon's client decodes them off the wire by name.
  struct Counter {
    std::string name;  // [a-z_]+
    std::string help;
    uint64_t value = 0;
    bool gauge = false;
  };
  std::vector<Counter> counters;
};

class Tier {
 public:
  using RemovalListener = std::function<void(std::span<const BlockKey>)>;

  virtual ~Tier();
  Tier(const Tier&) = delete;
  Tier& operator=(const Tier&) = delete;

  const std::string& name() const { return name_; }
  TierKind kind() const { return kind_; }
  const KvLayout& layout() const { return layout_; }
  uint64_t block_bytes() const { return block_bytes_; }
  uint64_t capacity_bytes() const { return capacity_bytes_; }
  uint64_t capacity_blocks() const { return capacity_bytes_ / block_bytes_; }
  uint64_t used_bytes() const { return UsedBytesImpl(); }
  TierCapabilities capabilities() const { return CapabilitiesImpl(); }

  // Stores blocks[i] under keys[i] (overwriting an existing key). Each block must be exactly
  // block_bytes() long. Returns InvalidArgument (and touches nothing) when the spans' sizes
  // differ; otherwise OK, with results[i] per block: OK, InvalidArgument (wrong size),
  // ResourceExhausted (no room), Unavailable (tier down).
  Status Put(std::span<const BlockKey> keys, std::span<const ConstBlock> blocks,
             std::span<Status> results);

  // Copies the block of keys[i] into out[i] (exactly block_bytes() long). results[i]: OK,
  // NotFound (a miss), Corruption (bytes failed verification; the tier dropped them),
  // Unavailable, InvalidArgument (wrong size). Same whole-call contract as Put.
  Status Get(std::span<const BlockKey> keys, std::span<const MutableBlock> out,
             std::span<Status> results);

  // Copies bytes [offset, offset + out[i].size()) of the block of keys[i] into out[i]: a slice,
  // e.g. one layer of every block of a layer-wise load. A slice is not verified on its own:
  // when checksums is not empty, checksums[i] receives the checksum the tier keeps for the
  // whole block (0 when none), for the caller to check the block once every slice is in.
  // results[i] as for Get (InvalidArgument when the slice passes the block's end). The whole
  // call fails with InvalidArgument when the spans' sizes differ or the tier does not read
  // slices (capabilities().reads_slices is false).
  Status GetSlice(std::span<const BlockKey> keys, uint64_t offset,
                  std::span<const MutableBlock> out, std::span<uint64_t> checksums,
                  std::span<Status> results);
  // Reads blocks in place, with no copy, where the tier holds them in this process's memory:
  // use(at) runs once, at[i] the bytes of keys[i] (block_bytes() long) or null when it is not
  // resident; they stay valid and unchanged during the call only (the tier's writers wait).
  // Counted as a Get of the blocks. False, and use is not called: the tier cannot lend.
  using LendFn = std::function<void(std::span<const std::byte* const> at)>;
  bool Lend(std::span<const BlockKey> keys, const LendFn& use);
  // out[i] = whether keys[i] is resident. Non-OK (Unavailable) when the tier cannot answer.
  Status Exists(std::span<const BlockKey> keys, std::span<bool> out);

  // Removes keys; absent keys are ignored.
  Status Erase(std::span<const BlockKey> keys);

  TierStats stats() const;

  // Called (from any thread) with keys the tier dropped on its own. Set before use.
  void SetRemovalListener(RemovalListener listener);

  // What only some tiers have, asked through the interface (the Cache core casts to no tier):
  // the shared arena a daemon lends its clients (a host tier on a memfd), else null;
  virtual HostTier* shared_arena() { return nullptr; }
  // the keys of blocks the tier found at open (a disk tier's recovered records).
  virtual std::vector<BlockKey> RecoveredKeys() const { return {}; }

 protected:
  Tier(std::string name, TierKind kind, const KvLayout& layout, uint64_t capacity_bytes);

  virtual void PutImpl(std::span<const BlockKey> keys, std::span<const ConstBlock> blocks,
                       std::span<Status> results) = 0;
  virtual void GetImpl(std::span<const BlockKey> keys, std::span<const MutableBlock> out,
                       std::span<Status> results) = 0;
  // Only called when capabilities().reads_slices; arguments already checked (sizes agree, each
  // slice inside a block; checksums empty or as long as keys).
  virtual void GetSliceImpl(std::span<const BlockKey> keys, uint64_t offset,
                            std::span<const MutableBlock> out, std::span<uint64_t> checksums,
                            std::span<Status> results);
  virtual Status ExistsImpl(std::span<const BlockKey> keys, std::span<bool> out) = 0;
  // Lend's: false for a tier whose blocks are not in this process's memory.
  virtual bool LendImpl(std::span<const BlockKey> /*keys*/, const LendFn& /*use*/) { return false; }
  virtual Status EraseImpl(std::span<const BlockKey> keys) = 0;
  virtual uint64_t UsedBytesImpl() const = 0;
  virtual TierCapabilities CapabilitiesImpl() const = 0;
  // Blocks held, given the used_bytes() just read; by default used_bytes / block_bytes() (exact
  // for tiers whose bytes are their blocks).
  virtual uint64_t ResidentBlocksImpl(uint64_t used_bytes) const;
  // Appends the kind's own counters to stats(); none by default.
  virtual void CountersImpl(std::vector<TierStats::Counter>* out) const;

  // For self-managed tiers: report keys dropped without an Erase call.
  void NotifyRemoved(std::span<const BlockKey> keys);

 private:
  const std::string name_;
  const TierKind kind_;
  const KvLayout layout_;
  const uint64_t block_bytes_;
  const uint64_t capacity_bytes_;

  // The removal listener behind its own (annotated) mutex, in tier.cc: src/common/mutex.h is
  // private, and every mutex of the library is one clang's -Wthread-safety checks.
  struct ListenerSlot;
  const std::unique_ptr<ListenerSlot> listener_;

  std::atomic<uint64_t> puts_{0}, put_bytes_{0}, put_failures_{0};
  std::atomic<uint64_t> gets_{0}, hits_{0}, misses_{0}, get_failures_{0}, get_bytes_{0};
  std::atomic<uint64_t> erases_{0};
  Histogram put_latency_;
  Histogram get_latency_;
};

}  // namespace kvtier

#endif  // KVTIER_TIER_H_
