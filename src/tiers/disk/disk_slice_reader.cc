// DiskStore's slice reads: part of a block (one layer of a layer-wise load) without the rest of
// its record, plus the record's header page when the caller wants the block's checksum. The
// read loop, record lookup and header check are Get's (disk_reader.cc).
#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "tiers/disk/disk_read_batch.h"
#include "tiers/disk/disk_segment.h"
#include "tiers/disk/disk_store.h"
#include "tiers/disk/format.h"

namespace kvtier::disk {
namespace {

// A completion's tag is its want's buffer times two plus which of the want's reads it is.
constexpr uint64_t kSliceRead = 0;
constexpr uint64_t kHeaderRead = 1;

// Where a slice is read from and to.
struct SlicePlan {
  uint64_t file_offset;
  uint32_t len;
  bool in_place;  // straight into the caller's buffer
  uint64_t skip;  // else: bytes before the slice in the page-aligned range read into the bounce
};

// O_DIRECT needs page-aligned offsets, lengths and buffers; any other slice is read as the
// enclosing pages into the bounce buffer (which holds a whole padded payload, so it fits).
SlicePlan PlanSlice(uint64_t record_offset, uint64_t offset, std::span<std::byte> out,
                    bool direct) {
  const uint64_t start = record_offset + kPageBytes + offset;
  if (!direct || (start % kPageBytes == 0 && out.size() % kPageBytes == 0 &&
                  reinterpret_cast<uintptr_t>(out.data()) % kPageBytes == 0)) {
    return {start, static_cast<uint32_t>(out.size()), true, 0};
  }
  const uint64_t first = start / kPageBytes * kPageBytes;
  return {first, static_cast<uint32_t>(AlignUp(start + out.size()) - first), false, start - first};
}

}  // namespace

void DiskStore::GetSlice(std::span<const BlockKey> keys, uint64_t offset,
                         std::span<const std::span<std::byte>> out, std::span<uint64_t> checksums,
                         std::span<Status> results) {
  std::fill(checksums.begin(), checksums.end(), uint64_t{0});
  ReadBatch r(keys, out, results);
  r.slice = true;
  r.offset = offset;
  r.checksums = checksums;
  RunReads(&r);
}

void DiskStore::QueueSliceReads(ReadBatch* r) {
  IoContext& ctx = *r->ctx;
  IoEngine& engine = *ctx.engine;
  // A want holds one buffer for both its reads (header in the first page, bounced slice after
  // it); each read takes a queue slot, so the two may be queued in different rounds.
  while (r->next < r->wants.size() && engine.outstanding() < engine.queue_depth()) {
    const ReadBatch::Want& w = r->wants[r->next];
    uint32_t b = r->split_buf;
    if (b == ReadBatch::kNoBuffer) {
      if (r->free_bufs.empty()) break;
      b = r->free_bufs.back();
      r->free_bufs.pop_back();
      r->slot[b] = r->next;
      r->pending[b] = r->checksums.empty() ? 1 : 2;
      if (!r->checksums.empty()) {
        engine.Queue({false, w.seg->fd, ctx.buffers[b].data(), static_cast<uint32_t>(kPageBytes),
                      w.loc.offset, static_cast<int>(b), b * 2 + kHeaderRead});
        r->split_buf = b;
        continue;
      }
    }
    const std::span<std::byte> out = r->out[w.index];
    const SlicePlan p = PlanSlice(w.loc.offset, r->offset, out, direct_);
    engine.Queue({false, w.seg->fd, p.in_place ? out.data() : ctx.buffers[b].data() + kPageBytes,
                  p.len, p.file_offset, p.in_place ? -1 : static_cast<int>(b), b * 2 + kSliceRead});
    r->split_buf = ReadBatch::kNoBuffer;
    ++r->next;
  }
}

void DiskStore::CheckSliceRead(ReadBatch* r, const IoCompletion& c) {
  const uint32_t b = static_cast<uint32_t>(c.tag / 2);
  const bool header = c.tag % 2 == kHeaderRead;
  const size_t wi = r->slot[b];
  const ReadBatch::Want& w = r->wants[wi];
  const std::span<std::byte> out = r->out[w.index];
  Status& result = r->results[w.index];
  const SlicePlan p = PlanSlice(w.loc.offset, r->offset, out, direct_);
  const int64_t want_bytes = header ? static_cast<int64_t>(kPageBytes) : p.len;
  if (c.result != want_bytes) {
    // The first failure names the cause; a corrupt header found meanwhile stays Corruption.
    if (result.code() == StatusCode::kInternal) {
      result = Status::Unavailable(fmt::format(
          "segment {} offset {}: read of {}: {}", w.loc.segment_id, w.loc.offset,
          header ? std::string("the header")
                 : fmt::format("slice [{}, +{})", r->offset, out.size()),
          c.result < 0 ? Errno(static_cast<int>(-c.result)) : std::string("short read")));
    }
  } else if (header) {
    uint64_t checksum = 0;
    if (CheckHeader(r, wi, r->ctx->buffers[b].span().first(kPageBytes), &checksum)) {
      r->checksums[w.index] = checksum;
    }
  } else if (!p.in_place) {
    std::memcpy(out.data(), r->ctx->buffers[b].data() + kPageBytes + p.skip, out.size());
  }
  if (--r->pending[b] > 0) return;
  // Every read of the want landed: its buffer is free and its result final.
  r->free_bufs.push_back(b);
  if (result.code() == StatusCode::kInternal) result = Status::Ok();
  if (!result.ok() && !r->checksums.empty()) r->checksums[w.index] = 0;
}

}  // namespace kvtier::disk
