// HostTier: KV blocks in a DRAM arena of fixed-size slots, one slot per block.
//
// The arena is mapped once at open, pre-faulted by all copy threads in parallel (a fresh page
// fault costs ~17x a copy into a faulted page) and never remapped; with CUDA it is registered
// as pinned memory for DMA. A batch of 1 MiB or more is split over the configured copy
// threads; copies of 64 KiB or more use streaming stores (common/copy.h). A successful
// operation allocates nothing once the per-thread scratch has grown (a failed block's Status
// carries a message).
//
// The same class, with kind kEmulatedDevice, stands in for a device (HBM) tier: host memory
// labelled as the fastest tier, until a CUDA tier exists.
//
// Thread-safety: all methods are thread-safe. Get copies under a shared lock, so an Erase or an
// overwrite waits for copies of that tier in flight; Put copies into a fresh unpublished slot
// outside the lock and publishes it under the exclusive lock.
//
// Shared arena (options.shared, for `kvtier serve`): the arena is split into partitions, one
// sealed memfd each (no shrink, no grow: a process holding one cannot make another fault), that
// other processes map and copy blocks in and out of by slot offset. Every partition spans the
// whole slot range, sparsely: a slot's bytes live in the memfd of the partition that owns it,
// and when a slot changes owner its pages are punched out of the old owner's memfd. So a
// process that maps one partition sees only blocks written into that partition, never
// another's (the daemon gives each tenant its own). A key's partition is named by the tenant
// tag in its upper 32 low bits (AddPartition); untagged keys use partition 0. A resident
// block's slot never moves while it is resident (a second Put of a key keeps the first copy: a
// block's bytes are a function of its key), and a writer outside the process fills a slot taken
// with ReserveSlots that becomes visible only with PublishSlots.
#ifndef KVTIER_SRC_TIERS_HOST_HOST_TIER_H_
#define KVTIER_SRC_TIERS_HOST_HOST_TIER_H_

#include <atomic>
#include <map>
#include <memory>
#include <string_view>
#include <thread>
#include <vector>

#include "common/arena.h"
#include "common/copy.h"
#include "common/flat_id_map.h"
#include "common/mutex.h"
#include "kvtier/tier.h"

namespace kvtier {

struct HostTierOptions {
  std::string name = "host";
  TierKind kind = TierKind::kHost;  // kHost or kEmulatedDevice
  uint64_t capacity_bytes = 0;      // rounded down to whole blocks; >= one block
  int threads = 1;                  // copy threads, 1..64
  bool prefault = true;
  bool prefault_background = true;  // on a thread of its own where the kernel can (see .cc)
  // Without prefault, not shared: bytes past the highest slot handed out so far kept faulted
  // in on an idle thread (ArenaWarmer), so a store rarely pays a first touch; 0: none.
  uint64_t warm_ahead = 0;
  bool huge_pages = true;   // MADV_HUGEPAGE on the arena
  bool pin = true;          // cudaHostRegister when built with CUDA
  bool shared = false;      // arena on memfds that other processes map (see above)
  int max_partitions = 64;  // shared only: partitions besides partition 0, 1..4096
  Status Validate(const KvLayout& layout) const;
};

class HostTier final : public Tier {
 public:
  static Result<std::unique_ptr<HostTier>> Open(const KvLayout& layout, HostTierOptions options);
  ~HostTier() override;

  uint64_t slots() const { return num_slots_; }
  // Bytes warm_ahead faulted in so far.
  uint64_t warmed_bytes() const { return warmer_ ? warmer_->warmed_bytes() : 0; }
  bool pinned() const { return pinned_; }
  // Seconds the prefault took; 0 until it is done (a background one) or when there was none.
  double prefault_seconds() const {
    return static_cast<double>(prefault_ns_.load(std::memory_order_acquire)) * 1e-9;
  }

  // Shared arena only (else -1): partition 0's memfd (owned by the tier). arena_bytes() is the
  // size of every partition's memfd.
  int arena_fd() const { return arena_fd_; }
  HostTier* shared_arena() override { return arena_fd_ >= 0 ? this : nullptr; }
  size_t arena_bytes() const { return arena_bytes_; }
  static constexpr uint64_t kNoOffset = UINT64_MAX;

  // Shared arena only. The partition of tenant tag `tag`, created on first use (`name` is for
  // logs). ResourceExhausted when max_partitions exist; InvalidArgument when the tag belongs to
  // a partition created under another name (two tenants whose tags collide never share one).
  Result<int> AddPartition(uint32_t tag, std::string_view name);
  // The memfd of partition p (owned by the tier), or -1.
  int partition_fd(int p) const;
  // The partition that holds key (by its tag), 0 when its tag has none.
  int PartitionOf(const BlockKey& key) const {
    ReaderLock lock(&mu_);
    return PartOf(key);
  }
  // A partition's share of the slots: it holds at most max_slots (its own blocks are evicted
  // for it beyond), and others' reservations do not evict it below reserved_slots. Enforced by
  // the Cache's reservations (CacheHooks::Reserve), not by Put.
  struct Bounds {
    uint64_t max_slots = UINT64_MAX;
    uint64_t reserved_slots = 0;
  };
  void SetBounds(int p, Bounds b);
  // A partition, the slots it holds now (resident or reserved) and its bounds, read at once.
  struct Usage {
    int partition = 0;
    uint64_t held = 0;
    Bounds bounds;
  };
  Usage usage(int p) const;
  Usage UsageOf(const BlockKey& key) const;  // of the partition that holds key
  bool bounded() const { return bounded_.load(std::memory_order_acquire); }

  // out[i] = byte offset of keys[i]'s slot (in its partition's memfd), or kNoOffset when not
  // resident.
  void Offsets(std::span<const BlockKey> keys, std::span<uint64_t> out) const;
  // out[i] = keys[i]'s bytes in this process, or nullptr when not resident. The pointer stays
  // valid while the block stays resident (pin it).
  void Pointers(std::span<const BlockKey> keys, std::span<const std::byte*> out) const;
  // Takes up to n free slots of partition p for writers outside the tier; returns how many
  // (appended to *out). The caller's room accounting (the Cache's policy) must allow them.
  size_t ReserveSlots(int p, size_t n, std::vector<uint32_t>* out);
  // Returns reserved slots unpublished.
  void ReleaseSlots(std::span<const uint32_t> slots);
  // Shared arena only. Moves free slots nobody was handed yet (partition 0's) to partition p,
  // to be handed to p after the slots it freed itself, so that p's writer can fault their
  // pages in before it needs them; appends their offsets in the order p gets them. Claims only
  // when p has fewer than want / 2 free slots, then up to want (within p's max_slots); returns
  // how many. Claimed slots stay free: another partition may still take them.
  size_t ClaimAhead(int p, size_t want, std::vector<uint64_t>* offsets);
  // Makes reserved slot[i] resident as keys[i]. published[i] = false when the key was already
  // resident (the slot went back to the free list and the old copy stays).
  void PublishSlots(std::span<const BlockKey> keys, std::span<const uint32_t> slots,
                    std::span<bool> published);
  uint64_t SlotOffset(uint32_t slot) const { return uint64_t{slot} * stride_; }
  // A reserved or resident slot's bytes in this process.
  std::byte* SlotPtr(uint32_t slot) const;

 protected:
  void CountersImpl(std::vector<TierStats::Counter>* out) const override;
  void PutImpl(std::span<const BlockKey> keys, std::span<const ConstBlock> blocks,
               std::span<Status> results) override;
  void GetSliceImpl(std::span<const BlockKey> keys, uint64_t offset,
                    std::span<const MutableBlock> out, std::span<uint64_t> checksums,
                    std::span<Status> results) override;
  void GetImpl(std::span<const BlockKey> keys, std::span<const MutableBlock> out,
               std::span<Status> results) override;
  Status ExistsImpl(std::span<const BlockKey> keys, std::span<bool> out) override;
  bool LendImpl(std::span<const BlockKey> keys, const LendFn& use) override;
  Status EraseImpl(std::span<const BlockKey> keys) override;
  uint64_t UsedBytesImpl() const override;
  TierCapabilities CapabilitiesImpl() const override;

 private:
  struct Partition {
    int fd = -1;
    std::byte* base = nullptr;
    uint32_t tag = 0;
    std::string name;
  };
  HostTier(const KvLayout& layout, const HostTierOptions& options, std::byte* arena,
           size_t arena_bytes, uint64_t slots, uint64_t stride);
  // Faults the arena in: on prefault_thread_ where MADV_POPULATE_WRITE works and `background`,
  // else here, touching every page.
  void Prefault(bool background);
  // Takes a free slot for partition p (its own freed slots first, else another's, whose
  // pages are punched out of the old owner); kNoSlot when none.
  uint32_t TakeSlot(int p) KVTIER_REQUIRES(mu_);
  // Free slot `slot` to partition p: punched out of its old owner's memfd.
  void GiveSlot(uint32_t slot, int p) KVTIER_REQUIRES(mu_);
  // How many slots ClaimAhead(p, want) takes now.
  size_t ClaimCount(int p, size_t want) const KVTIER_REQUIRES_SHARED(mu_);
  void FreeSlot(uint32_t slot) KVTIER_REQUIRES(mu_);
  Usage UsageLocked(int p) const KVTIER_REQUIRES_SHARED(mu_);
  int PartOf(const BlockKey& key) const KVTIER_REQUIRES_SHARED(mu_) {
    if (!shared_ || by_tag_.empty()) return 0;
    auto it = by_tag_.find(static_cast<uint32_t>(key.lo >> 32));
    return it == by_tag_.end() ? 0 : it->second;
  }

  std::byte* const arena_;
  const size_t arena_bytes_;
  int arena_fd_ = -1;
  bool shared_ = false;
  const uint64_t num_slots_;
  const uint64_t stride_;  // bytes between slots: a whole number of pages when shared
  HostTierOptions options_;
  // Partitions: fixed storage, so a published entry never moves; count_ grows under mu_ and
  // is read with acquire (an entry is complete before count_ covers it).
  std::unique_ptr<Partition[]> parts_;
  std::atomic<int> num_parts_{0};
  std::vector<uint16_t> owner_;       // slot -> partition (shared only); changed only while free
  std::atomic<bool> bounded_{false};  // some partition has bounds
  bool pinned_ = false;
  // warm_ahead: the arena as the warmer sees it (not unmapped by it), and how far it was asked
  // to warm. Stopped before the arena is unmapped.
  void WarmPast(uint64_t end) KVTIER_REQUIRES(mu_);
  std::unique_ptr<ArenaWarmer> warmer_;
  std::shared_ptr<Arena> warm_arena_;
  uint64_t warm_queued_ KVTIER_GUARDED_BY(mu_) = 0;
  std::atomic<uint64_t> prefault_ns_{0};
  std::atomic<bool> prefault_stop_{false};
  std::thread prefault_thread_;  // joined before the arena is unmapped
  CopyPool pool_;

  mutable SharedMutex mu_;
  // key -> slot, the key kept once, in keys_[slot] (8 + 16 bytes a slot, not a 24-byte map
  // slot at 3/4 load: ~17 bytes a block less outside the arena).
  void PointersLocked(std::span<const BlockKey> keys, std::span<const std::byte*> out) const
      KVTIER_REQUIRES_SHARED(mu_);
  uint32_t FindSlot(const BlockKey& key) const KVTIER_REQUIRES_SHARED(mu_) {
    const BlockKey* keys = keys_.data();  // read under mu_ here; the lambda runs within
    return map_.Find(key, [keys](uint32_t s) -> const BlockKey& { return keys[s]; });
  }
  // Maps key to slot unless key is resident; returns the resident slot or FlatIdMap::kNone.
  uint32_t InsertSlot(const BlockKey& key, uint32_t slot) KVTIER_REQUIRES(mu_);
  // Maps key (known absent) to slot.
  void MapSlot(const BlockKey& key, uint32_t slot) KVTIER_REQUIRES(mu_) {
    keys_[slot] = key;
    map_.Insert(key, slot);
  }
  std::vector<BlockKey> keys_ KVTIER_GUARDED_BY(mu_);  // slot -> key while mapped
  FlatIdMap map_ KVTIER_GUARDED_BY(mu_);
  std::vector<std::vector<uint32_t>> free_ KVTIER_GUARDED_BY(mu_);  // per partition, stacks
  std::vector<uint64_t> held_ KVTIER_GUARDED_BY(mu_);               // per partition
  std::vector<Bounds> bounds_ KVTIER_GUARDED_BY(mu_);               // per partition
  std::map<uint32_t, int> by_tag_ KVTIER_GUARDED_BY(mu_);
  // Partition 0's memfd holds no pages (not prefaulted, pinned or handed a slot, as in a
  // daemon, where it serves no client): its slots move to others without a punch.
  bool part0_empty_ KVTIER_GUARDED_BY(mu_) = true;
  size_t free_count_ KVTIER_GUARDED_BY(mu_) = 0;
  int free_cursor_ KVTIER_GUARDED_BY(mu_) = 0;  // where TakeSlot looks for others' slots
};

}  // namespace kvtier

#endif  // KVTIER_SRC_TIERS_HOST_HOST_TIER_H_
