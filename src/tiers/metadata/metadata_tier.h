// MetadataTier: residency and sizes only, no bytes. The simulator and capacity planner run the
// library's index and policies over these, at the capacities of real tiers.
//
// Put accepts any buffer (even empty) and records the key; Get copies nothing and reports OK for
// resident keys (capabilities().stores_bytes is false, so the Cache never loads from it).
//
// Thread-safety: all methods are thread-safe.
#ifndef KVTIER_SRC_TIERS_METADATA_METADATA_TIER_H_
#define KVTIER_SRC_TIERS_METADATA_METADATA_TIER_H_

#include <memory>

#include "common/flat_map.h"
#include "common/mutex.h"
#include "kvtier/tier.h"

namespace kvtier {

class MetadataTier final : public Tier {
 public:
  static Result<std::unique_ptr<MetadataTier>> Open(const KvLayout& layout, std::string name,
                                                    uint64_t capacity_bytes);

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
  MetadataTier(const KvLayout& layout, std::string name, uint64_t capacity_bytes)
      : Tier(std::move(name), TierKind::kMetadata, layout, capacity_bytes) {}
  mutable Mutex mu_;
  FlatKeyMap<uint8_t> keys_ KVTIER_GUARDED_BY(mu_);
};

}  // namespace kvtier

#endif  // KVTIER_SRC_TIERS_METADATA_METADATA_TIER_H_
