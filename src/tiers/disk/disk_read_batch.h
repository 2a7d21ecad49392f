// DiskStore::ReadBatch: one Get or GetSlice in flight, shared by disk_reader.cc (whole blocks and
// the read loop) and disk_slice_reader.cc (slices). Internal to src/tiers/disk/.
//
// Thread-safety: owned by the one thread running the call.
#ifndef KVTIER_TIERS_DISK_DISK_READ_BATCH_H_
#define KVTIER_TIERS_DISK_DISK_READ_BATCH_H_

#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "tiers/disk/disk_segment.h"
#include "tiers/disk/disk_store.h"

namespace kvtier::disk {

// The records to read, the reader context's buffers they occupy, and the records found corrupt
// (dropped from the index at the end).
struct DiskStore::ReadBatch {
  struct Want {
    size_t index;
    Location loc;
    std::shared_ptr<Segment> seg;
  };
  // Reads that landed in the caller's buffer: their header is checked at once (freeing the
  // bounce page for the next read), their payload after the next reads are submitted.
  struct Deferred {
    size_t want;
    uint64_t checksum;
  };
  ReadBatch(std::span<const BlockKey> k, std::span<const std::span<std::byte>> o,
            std::span<Status> r)
      : keys(k), out(o), results(r) {}

  std::span<const BlockKey> keys;
  std::span<const std::span<std::byte>> out;
  std::span<Status> results;
  // GetSlice: out[i] receives bytes [offset, offset + out[i].size()) of the block, and, when
  // checksums is not empty, checksums[i] the whole block's checksum from its header.
  bool slice = false;
  uint64_t offset = 0;
  std::span<uint64_t> checksums;

  std::vector<Want> wants;
  std::unique_ptr<IoContext> ctx;
  std::vector<size_t> slot;      // buffer -> index into wants
  std::vector<uint8_t> pending;  // GetSlice: buffer -> reads of its want not yet completed
  std::vector<uint32_t> free_bufs;
  std::vector<IoCompletion> done;
  std::vector<std::pair<BlockKey, uint64_t>> corrupt;  // key, seq
  std::vector<Deferred> deferred;
  size_t next = 0;  // the next want to queue
  // GetSlice: the buffer of wants[next] when its header read is queued and its slice not yet
  // (the queue was full); kNoBuffer otherwise.
  static constexpr uint32_t kNoBuffer = ~uint32_t{0};
  uint32_t split_buf = kNoBuffer;
};

}  // namespace kvtier::disk

#endif  // KVTIER_TIERS_DISK_DISK_READ_BATCH_H_
