// DiskTier: the local-SSD Tier (TierKind::kDisk) over a DiskStore.
//
// Self-managed: it evicts whole segments (oldest first) on its own and reports the keys it
// dropped through the removal listener; it survives restarts (the index is rebuilt from the
// segment files, and the tier is not authoritative, so a new Cache finds those blocks through
// Exists). Every read is checked against the record's key and checksum here (verifies_reads),
// so the Cache does not checksum its blocks again. GetSlice reads one layer of a record alone
// (reads_slices), handing back the header's whole-block checksum for the caller to verify.
//
// Thread-safety: every method may be called concurrently (see DiskStore). Ownership: the tier
// owns its store; it never keeps a caller's buffers past a call.
#ifndef KVTIER_TIERS_DISK_DISK_TIER_H_
#define KVTIER_TIERS_DISK_DISK_TIER_H_

#include <memory>
#include <string>

#include "kvtier/tier.h"
#include "kvtier/tier_factory.h"
#include "kvtier/tier_options.h"
#include "tiers/disk/disk_store.h"

namespace kvtier::disk {

class DiskTier final : public Tier {
 public:
  // options.block_bytes, layout_fingerprint and capacity_bytes are taken from layout and
  // capacity_bytes. Errors as DiskStore::Open.
  static Result<std::unique_ptr<DiskTier>> Open(std::string name, const KvLayout& layout,
                                                uint64_t capacity_bytes, DiskOptions options);
  ~DiskTier() override;

  // Whether key is resident and on stable storage.
  bool IsDurable(const BlockKey& key) const { return store_->IsDurable(key); }
  // Makes every block written so far durable.
  Status Sync() { return store_->Sync(); }
  DiskStats disk_stats() const { return store_->stats(); }
  DiskStore& store() { return *store_; }
  std::vector<BlockKey> RecoveredKeys() const override;

 protected:
  void PutImpl(std::span<const BlockKey> keys, std::span<const ConstBlock> blocks,
               std::span<Status> results) override;
  void GetImpl(std::span<const BlockKey> keys, std::span<const MutableBlock> out,
               std::span<Status> results) override;
  void GetSliceImpl(std::span<const BlockKey> keys, uint64_t offset,
                    std::span<const MutableBlock> out, std::span<uint64_t> checksums,
                    std::span<Status> results) override;
  Status ExistsImpl(std::span<const BlockKey> keys, std::span<bool> out) override;
  Status EraseImpl(std::span<const BlockKey> keys) override;
  uint64_t UsedBytesImpl() const override;
  // The records the index points at (used bytes also count headers and dead records).
  uint64_t ResidentBlocksImpl(uint64_t used_bytes) const override;
  TierCapabilities CapabilitiesImpl() const override;
  // Gauges "degraded" (1 while the filesystem holds less than the configured capacity or
  // writes fail for want of a segment) and "disk_capacity_bytes" (what the tier holds now),
  // and the counter "disk_space_evictions".
  void CountersImpl(std::vector<TierStats::Counter>* out) const override;

 private:
  DiskTier(std::string name, const KvLayout& layout, uint64_t capacity_bytes);
  std::unique_ptr<DiskStore> store_;
};

// DiskOptions from checked typed params (the tier's capacity and layout are set by Open).
DiskOptions DiskOptionsFrom(const DiskTierParams& params);
// DiskOptions from TierSpec::params, read by the one tier params reader (keys and vocabulary in
// doc/config.md). InvalidArgument "params.KEY: why".
Result<DiskOptions> DiskOptionsFromParams(const std::map<std::string, std::string>& params);

// The "disk" kind of MakeTier.
Result<std::unique_ptr<Tier>> MakeDiskTier(const TierSpec& spec, const KvLayout& layout);

}  // namespace kvtier::disk

#endif  // KVTIER_TIERS_DISK_DISK_TIER_H_
