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
// Shared arena (options.shared, for `kvtier serve`): the arena is a memfd that other processes
// map and copy blocks in and out of by slot offset. A resident block's slot then never moves
// while it is resident (a second Put of a key keeps the first copy: a block's bytes are a
// function of its key), and a writer outside the process fills a slot taken with ReserveSlots
// that becomes visible only with PublishSlots.
#ifndef KVTIER_SRC_TIERS_HOST_HOST_TIER_H_
#define KVTIER_SRC_TIERS_HOST_HOST_TIER_H_

#include <memory>
#include <vector>

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
  bool huge_pages = true;  // MADV_HUGEPAGE on the arena
  bool pin = true;         // cudaHostRegister when built with CUDA
  bool shared = false;     // arena on a memfd that other processes map (see above)
  Status Validate(const KvLayout& layout) const;
};

class HostTier final : public Tier {
 public:
  static Result<std::unique_ptr<HostTier>> Open(const KvLayout& layout, HostTierOptions options);
  ~HostTier() override;

  uint64_t slots() const { return num_slots_; }
  bool pinned() const { return pinned_; }
  double prefault_seconds() const { return prefault_s_; }

  // Shared arena only (else -1 / nothing): the memfd (owned by the tier) and its size.
  int arena_fd() const { return arena_fd_; }
  size_t arena_bytes() const { return arena_bytes_; }
  std::byte* arena() const { return arena_; }
  static constexpr uint64_t kNoOffset = UINT64_MAX;
  // out[i] = byte offset of keys[i]'s slot in the arena, or kNoOffset when not resident.
  void Offsets(std::span<const BlockKey> keys, std::span<uint64_t> out) const;
  // Takes up to n free slots for writers outside the tier; returns how many (appended to *out).
  // The caller's room accounting (the Cache's policy) must already allow them.
  size_t ReserveSlots(size_t n, std::vector<uint32_t>* out);
  // Returns reserved slots unpublished.
  void ReleaseSlots(std::span<const uint32_t> slots);
  // Makes reserved slot[i] resident as keys[i]. published[i] = false when the key was already
  // resident (the slot went back to the free list and the old copy stays).
  void PublishSlots(std::span<const BlockKey> keys, std::span<const uint32_t> slots,
                    std::span<bool> published);
  uint64_t SlotOffset(uint32_t slot) const { return uint64_t{slot} * block_bytes(); }

 protected:
  void PutImpl(std::span<const BlockKey> keys, std::span<const ConstBlock> blocks,
               std::span<Status> results) override;
  void GetSliceImpl(std::span<const BlockKey> keys, uint64_t offset,
                    std::span<const MutableBlock> out, std::span<uint64_t> checksums,
                    std::span<Status> results) override;
  void GetImpl(std::span<const BlockKey> keys, std::span<const MutableBlock> out,
               std::span<Status> results) override;
  Status ExistsImpl(std::span<const BlockKey> keys, std::span<bool> out) override;
  Status EraseImpl(std::span<const BlockKey> keys) override;
  uint64_t UsedBytesImpl() const override;
  TierCapabilities CapabilitiesImpl() const override;

 private:
  HostTier(const KvLayout& layout, const HostTierOptions& options, std::byte* arena,
           size_t arena_bytes, uint64_t slots);
  std::byte* SlotPtr(uint32_t slot) const { return arena_ + uint64_t{slot} * block_bytes(); }
  void Prefault(bool huge_pages);

  std::byte* const arena_;
  const size_t arena_bytes_;
  int arena_fd_ = -1;
  bool shared_ = false;
  const uint64_t num_slots_;
  bool pinned_ = false;
  double prefault_s_ = 0;
  CopyPool pool_;

  mutable SharedMutex mu_;
  // key -> slot, the key kept once, in keys_[slot] (8 + 16 bytes a slot, not a 24-byte map
  // slot at 3/4 load: ~17 bytes a block less outside the arena).
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
  std::vector<uint32_t> free_ KVTIER_GUARDED_BY(mu_);  // free slot stack
};

}  // namespace kvtier

#endif  // KVTIER_SRC_TIERS_HOST_HOST_TIER_H_
