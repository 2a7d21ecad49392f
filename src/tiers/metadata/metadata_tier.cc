#include "tiers/metadata/metadata_tier.h"

namespace kvtier {

Result<std::unique_ptr<MetadataTier>> MetadataTier::Open(const KvLayout& layout, std::string name,
                                                         uint64_t capacity_bytes) {
  KVTIER_RETURN_IF_ERROR(layout.Validate());
  if (capacity_bytes < layout.bytes_per_block())
    return Status::InvalidArgument(name + ".capacity_bytes: " + FormatBytes(capacity_bytes) +
                                   " holds no block of " + FormatBytes(layout.bytes_per_block()));
  return std::unique_ptr<MetadataTier>(new MetadataTier(layout, std::move(name), capacity_bytes));
}

void MetadataTier::PutImpl(std::span<const BlockKey> keys, std::span<const ConstBlock>,
                           std::span<Status> results) {
  MutexLock lock(&mu_);
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!keys_.Contains(keys[i]) && (keys_.size() + 1) * block_bytes() > capacity_bytes()) {
      results[i] = Status::ResourceExhausted(name() + ": full");
      continue;
    }
    keys_.Insert(keys[i], 1);
    results[i] = Status::Ok();
  }
}

void MetadataTier::GetImpl(std::span<const BlockKey> keys, std::span<const MutableBlock>,
                           std::span<Status> results) {
  MutexLock lock(&mu_);
  for (size_t i = 0; i < keys.size(); ++i)
    results[i] = keys_.Contains(keys[i]) ? Status::Ok() : Status::NotFound(name() + ": miss");
}

Status MetadataTier::ExistsImpl(std::span<const BlockKey> keys, std::span<bool> out) {
  MutexLock lock(&mu_);
  for (size_t i = 0; i < keys.size(); ++i) out[i] = keys_.Contains(keys[i]);
  return Status::Ok();
}

Status MetadataTier::EraseImpl(std::span<const BlockKey> keys) {
  MutexLock lock(&mu_);
  for (const BlockKey& k : keys) keys_.Erase(k);
  return Status::Ok();
}

uint64_t MetadataTier::UsedBytesImpl() const {
  MutexLock lock(&mu_);
  return keys_.size() * block_bytes();
}

TierCapabilities MetadataTier::CapabilitiesImpl() const {
  TierCapabilities c;
  c.stores_bytes = false;
  return c;
}

}  // namespace kvtier
