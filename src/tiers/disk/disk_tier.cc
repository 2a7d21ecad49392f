#include "tiers/disk/disk_tier.h"

#include "config/tier_params.h"

namespace kvtier::disk {

DiskTier::DiskTier(std::string name, const KvLayout& layout, uint64_t capacity_bytes)
    : Tier(std::move(name), TierKind::kDisk, layout, capacity_bytes) {}

DiskTier::~DiskTier() = default;

std::vector<BlockKey> DiskTier::RecoveredKeys() const { return store_->Keys(); }

Result<std::unique_ptr<DiskTier>> DiskTier::Open(std::string name, const KvLayout& layout,
                                                 uint64_t capacity_bytes, DiskOptions options) {
  KVTIER_RETURN_IF_ERROR(layout.Validate());
  options.block_bytes = layout.bytes_per_block();
  options.layout_fingerprint = layout.fingerprint();
  options.capacity_bytes = capacity_bytes;
  std::unique_ptr<DiskTier> tier(new DiskTier(std::move(name), layout, capacity_bytes));
  DiskTier* self = tier.get();
  KVTIER_ASSIGN_OR_RETURN(tier->store_,
                          DiskStore::Open(options, [self](std::span<const BlockKey> keys) {
                            self->NotifyRemoved(keys);
                          }));
  return tier;
}

void DiskTier::PutImpl(std::span<const BlockKey> keys, std::span<const ConstBlock> blocks,
                       std::span<Status> results) {
  store_->Put(keys, blocks, results);
}

void DiskTier::GetImpl(std::span<const BlockKey> keys, std::span<const MutableBlock> out,
                       std::span<Status> results) {
  store_->Get(keys, out, results);
}

void DiskTier::GetSliceImpl(std::span<const BlockKey> keys, uint64_t offset,
                            std::span<const MutableBlock> out, std::span<uint64_t> checksums,
                            std::span<Status> results) {
  store_->GetSlice(keys, offset, out, checksums, results);
}

Status DiskTier::ExistsImpl(std::span<const BlockKey> keys, std::span<bool> out) {
  store_->Exists(keys, out);
  return Status::Ok();
}

Status DiskTier::EraseImpl(std::span<const BlockKey> keys) { return store_->Erase(keys); }

uint64_t DiskTier::UsedBytesImpl() const { return store_->used_bytes(); }

uint64_t DiskTier::ResidentBlocksImpl(uint64_t) const { return store_->live_blocks(); }

TierCapabilities DiskTier::CapabilitiesImpl() const {
  TierCapabilities c;
  c.managed_by_cache = false;  // whole-segment eviction, reported through NotifyRemoved
  // Not authoritative: after a restart the Cache's index is empty while the files hold blocks a
  // previous process stored, so Lookup asks Exists (an in-memory lookup) beyond its own prefix.
  c.authoritative = false;
  c.persistent = true;
  c.shared = false;
  c.verify_on_load = true;
  c.verifies_reads = true;  // every record's header key and payload XXH3 are checked on read
  // A slice is read alone; its block's checksum comes from the record header (GetSlice).
  c.reads_slices = true;
  return c;
}

void DiskTier::CountersImpl(std::vector<TierStats::Counter>* out) const {
  const DiskStats s = store_->stats();
  out->push_back({"degraded",
                  "1 while the tier is in trouble (disk: the filesystem holds less than the "
                  "configured capacity, or no segment can be started)",
                  s.degraded ? 1u : 0u, /*gauge=*/true});
  out->push_back({"disk_capacity_bytes",
                  "What the disk tier holds now (the filesystem may hold less)", s.capacity_bytes,
                  /*gauge=*/true});
  out->push_back({"disk_space_evictions", "Segments evicted early because the filesystem was full",
                  s.space_evictions});
}

Result<std::unique_ptr<Tier>> MakeDiskTier(const TierSpec& spec, const KvLayout& layout) {
  KVTIER_ASSIGN_OR_RETURN(DiskTierParams p, DiskParamsOf(spec));
  DiskOptions o = DiskOptionsFrom(p);
  KVTIER_ASSIGN_OR_RETURN(
      auto tier, DiskTier::Open(spec.name.empty() ? std::string("disk") : spec.name, layout,
                                spec.capacity_bytes, std::move(o)));
  return std::unique_ptr<Tier>(std::move(tier));
}

}  // namespace kvtier::disk
