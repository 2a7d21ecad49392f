// DiskOptions and SyncPolicy: the disk tier's settings, their defaults, their checks, and their
// conversion from the typed params (DiskOptionsFrom, declared in disk_tier.h).
#include <algorithm>

#include <fmt/format.h>

#include "config/tier_params.h"
#include "tiers/disk/disk_store.h"
#include "tiers/disk/disk_tier.h"
#include "tiers/disk/format.h"

namespace kvtier::disk {

namespace {

constexpr uint64_t kDefaultSegmentBytes = 256ull << 20;

}  // namespace

std::string_view SyncPolicyName(SyncPolicy policy) {
  switch (policy) {
    case SyncPolicy::kNone:
      return "none";
    case SyncPolicy::kBatch:
      return "batch";
    case SyncPolicy::kInterval:
      return "interval";
  }
  return "unknown";
}

std::optional<SyncPolicy> ParseSyncPolicy(std::string_view name) {
  if (name == "none") return SyncPolicy::kNone;
  if (name == "batch") return SyncPolicy::kBatch;
  if (name == "interval") return SyncPolicy::kInterval;
  return std::nullopt;
}

uint64_t DiskOptions::record_bytes() const { return kPageBytes + AlignUp(block_bytes); }

uint64_t DiskOptions::effective_segment_bytes() const {
  if (segment_bytes != 0) return segment_bytes;
  const uint64_t quarter = capacity_bytes / 4 / kPageBytes * kPageBytes;
  return std::max(std::min(kDefaultSegmentBytes, quarter), kPageBytes + record_bytes());
}

Status DiskOptions::Validate() const {
  if (path.empty()) return Status::InvalidArgument("path: must name a directory");
  if (block_bytes == 0) return Status::InvalidArgument("block_bytes: must be > 0");
  if (capacity_bytes == 0) return Status::InvalidArgument("capacity_bytes: must be > 0");
  if (queue_depth == 0 || queue_depth > 4096) {
    return Status::InvalidArgument(
        fmt::format("queue_depth: {} is out of range [1, 4096]", queue_depth));
  }
  if (sync == SyncPolicy::kInterval && sync_interval_ms == 0) {
    return Status::InvalidArgument("sync_interval_ms: must be > 0 with sync=interval");
  }
  const uint64_t seg = effective_segment_bytes();
  if (seg % kPageBytes != 0) {
    return Status::InvalidArgument(
        fmt::format("segment_bytes: {} is not a multiple of {}", seg, kPageBytes));
  }
  if (seg < kPageBytes + record_bytes()) {
    return Status::InvalidArgument(fmt::format(
        "segment_bytes: {} cannot hold one {}-byte record after the {}-byte segment header", seg,
        record_bytes(), kPageBytes));
  }
  if (capacity_bytes < 2 * seg) {
    return Status::InvalidArgument(fmt::format(
        "capacity_bytes: {} holds fewer than two segments of {} bytes (lower segment_bytes)",
        capacity_bytes, seg));
  }
  if (buffer_bytes < record_bytes()) {
    return Status::InvalidArgument(fmt::format(
        "buffer_bytes: {} is smaller than one {}-byte record", buffer_bytes, record_bytes()));
  }
  return Status::Ok();
}

DiskOptions DiskOptionsFrom(const DiskTierParams& p) {
  DiskOptions o;
  o.path = p.path;
  o.segment_bytes = p.segment_bytes;
  o.buffer_bytes = p.buffer_bytes;
  o.queue_depth = p.queue_depth;
  o.sync = ParseSyncPolicy(p.sync).value_or(SyncPolicy::kBatch);
  o.sync_interval_ms = p.sync_interval_ms;
  // The reader makes a params alias canonical; a typed struct may still hold one.
  if (p.io == "uring" || p.io == "io_uring") o.io = IoBackend::kUring;
  if (p.io == "sync" || p.io == "pread") o.io = IoBackend::kSync;
  o.register_buffers = p.register_buffers;
  o.direct_io = p.direct_io;
  o.reinsert_hot = p.reinsert_hot;
  return o;
}

Result<DiskOptions> DiskOptionsFromParams(const std::map<std::string, std::string>& params) {
  KVTIER_ASSIGN_OR_RETURN(DiskTierParams p, ReadDiskTierParams(params));
  return DiskOptionsFrom(p);
}

}  // namespace kvtier::disk
