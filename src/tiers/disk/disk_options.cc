// DiskOptions and SyncPolicy: the disk tier's settings, their defaults, their checks, and their
// parsing from a config's params (DiskOptionsFromParams, declared in disk_tier.h).
#include <algorithm>
#include <charconv>

#include <fmt/format.h>

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

}  // namespace kvtier::disk
