#include "tiers/disk/disk_tier.h"

#include <charconv>

#include <fmt/format.h>

namespace kvtier::disk {

DiskTier::DiskTier(std::string name, const KvLayout& layout, uint64_t capacity_bytes)
    : Tier(std::move(name), TierKind::kDisk, layout, capacity_bytes) {}

DiskTier::~DiskTier() = default;

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

Status DiskTier::ExistsImpl(std::span<const BlockKey> keys, std::span<bool> out) {
  store_->Exists(keys, out);
  return Status::Ok();
}

Status DiskTier::EraseImpl(std::span<const BlockKey> keys) { return store_->Erase(keys); }

uint64_t DiskTier::UsedBytesImpl() const { return store_->used_bytes(); }

TierCapabilities DiskTier::CapabilitiesImpl() const {
  TierCapabilities c;
  c.stores_bytes = true;
  c.managed_by_cache = false;  // whole-segment eviction, reported through NotifyRemoved
  // Not authoritative: after a restart the Cache's index is empty while the files hold blocks a
  // previous process stored, so Lookup asks Exists (an in-memory lookup) beyond its own prefix.
  c.authoritative = false;
  c.persistent = true;
  c.shared = false;
  c.verify_on_load = true;
  c.verifies_reads = true;  // every record's header key and payload XXH3 are checked on read
  return c;
}

namespace {

Status ParseBool(const std::string& key, const std::string& v, bool* out) {
  if (v == "true" || v == "1" || v == "yes" || v == "on") {
    *out = true;
  } else if (v == "false" || v == "0" || v == "no" || v == "off") {
    *out = false;
  } else {
    return Status::InvalidArgument(fmt::format("params.{}: '{}' is not true or false", key, v));
  }
  return Status::Ok();
}

Status ParseU32(const std::string& key, const std::string& v, uint32_t* out) {
  uint32_t x = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (ec != std::errc() || p != v.data() + v.size()) {
    return Status::InvalidArgument(fmt::format("params.{}: '{}' is not a number", key, v));
  }
  *out = x;
  return Status::Ok();
}

Status ParseSize(const std::string& key, const std::string& v, uint64_t* out) {
  Result<uint64_t> r = ParseByteSize(v);
  if (!r.ok()) {
    return Status::InvalidArgument(fmt::format("params.{}: '{}' is not a byte size", key, v));
  }
  *out = *r;
  return Status::Ok();
}

}  // namespace

Result<DiskOptions> DiskOptionsFromParams(const std::map<std::string, std::string>& params) {
  DiskOptions o;
  for (const auto& [key, v] : params) {
    if (key == "path") {
      o.path = v;
    } else if (key == "segment_bytes") {
      KVTIER_RETURN_IF_ERROR(ParseSize(key, v, &o.segment_bytes));
    } else if (key == "buffer_bytes") {
      KVTIER_RETURN_IF_ERROR(ParseSize(key, v, &o.buffer_bytes));
    } else if (key == "queue_depth") {
      KVTIER_RETURN_IF_ERROR(ParseU32(key, v, &o.queue_depth));
    } else if (key == "sync_interval_ms") {
      KVTIER_RETURN_IF_ERROR(ParseU32(key, v, &o.sync_interval_ms));
    } else if (key == "sync") {
      auto p = ParseSyncPolicy(v);
      if (!p) {
        return Status::InvalidArgument(
            fmt::format("params.sync: '{}' is not none, batch or interval", v));
      }
      o.sync = *p;
    } else if (key == "io") {
      if (v == "auto") {
        o.io = IoBackend::kAuto;
      } else if (v == "uring" || v == "io_uring") {
        o.io = IoBackend::kUring;
      } else if (v == "sync" || v == "pread") {
        o.io = IoBackend::kSync;
      } else {
        return Status::InvalidArgument(
            fmt::format("params.io: '{}' is not auto, uring or sync", v));
      }
    } else if (key == "register_buffers") {
      KVTIER_RETURN_IF_ERROR(ParseBool(key, v, &o.register_buffers));
    } else if (key == "direct_io") {
      KVTIER_RETURN_IF_ERROR(ParseBool(key, v, &o.direct_io));
    } else if (key == "reinsert_hot") {
      KVTIER_RETURN_IF_ERROR(ParseBool(key, v, &o.reinsert_hot));
    } else {
      return Status::InvalidArgument(fmt::format(
          "params.{}: unknown disk tier param (known: path, segment_bytes, queue_depth, sync, "
          "sync_interval_ms, io, register_buffers, direct_io, reinsert_hot, buffer_bytes)",
          key));
    }
  }
  if (o.path.empty())
    return Status::InvalidArgument("params.path: the disk tier needs a directory");
  return o;
}

Result<std::unique_ptr<Tier>> MakeDiskTier(const TierSpec& spec, const KvLayout& layout) {
  KVTIER_ASSIGN_OR_RETURN(DiskOptions o, DiskOptionsFromParams(spec.params));
  KVTIER_ASSIGN_OR_RETURN(
      auto tier, DiskTier::Open(spec.name.empty() ? std::string("disk") : spec.name, layout,
                                spec.capacity_bytes, std::move(o)));
  return std::unique_ptr<Tier>(std::move(tier));
}

}  // namespace kvtier::disk
