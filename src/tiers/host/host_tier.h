// HostTier: KV blocks in a DRAM arena of fixed-size slots, one slot per block.
//
// The arena is mapped once at open, pre-faulted by all copy threads in parallel (a fresh page
// fault costs ~17x a copy into a faulted page) and never remapped; with CUDA it is registered
// as pinned memory for DMA. A batch is copied by all configured threads with streaming stores.
// No heap allocation per operation once the per-thread scratch has grown.
//
// The same class, with kind kDevice, is the host emulation of the device tier ("HBM" of the
// reference engine) when no GPU is present.
//
// Thread-safety: all methods are thread-safe. Get copies under a shared lock, so an Erase or an
// overwrite waits for copies of that tier in flight; Put copies into a fresh unpublished slot
// outside the lock and publishes it under the exclusive lock.
#ifndef KVTIER_SRC_TIERS_HOST_HOST_TIER_H_
#define KVTIER_SRC_TIERS_HOST_HOST_TIER_H_

#include <memory>
#include <vector>

#include "common/copy.h"
#include "common/flat_map.h"
#include "common/mutex.h"
#include "kvtier/tier.h"

namespace kvtier {

struct HostTierOptions {
  std::string name = "host";
  TierKind kind = TierKind::kHost;  // kHost or kDevice (emulation)
  uint64_t capacity_bytes = 0;      // rounded down to whole blocks; >= one block
  int threads = 1;                  // copy threads, 1..64
  bool prefault = true;
  bool huge_pages = true;  // MADV_HUGEPAGE on the arena
  bool pin = true;         // cudaHostRegister when built with CUDA
  Status Validate(const KvLayout& layout) const;
};

class HostTier final : public Tier {
 public:
  static Result<std::unique_ptr<HostTier>> Open(const KvLayout& layout, HostTierOptions options);
  ~HostTier() override;

  uint64_t slots() const { return num_slots_; }
  bool pinned() const { return pinned_; }
  double prefault_seconds() const { return prefault_s_; }

 protected:
  void PutImpl(std::span<const BlockKey> keys, std::span<const ConstBlock> blocks,
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
  const uint64_t num_slots_;
  bool pinned_ = false;
  double prefault_s_ = 0;
  CopyPool pool_;

  mutable SharedMutex mu_;
  FlatKeyMap<uint32_t> map_ KVTIER_GUARDED_BY(mu_);    // key -> slot
  std::vector<uint32_t> free_ KVTIER_GUARDED_BY(mu_);  // free slot stack
};

}  // namespace kvtier

#endif  // KVTIER_SRC_TIERS_HOST_HOST_TIER_H_
