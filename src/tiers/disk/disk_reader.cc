// DiskStore's reader side: Get, on a pooled I/O context, verifying every record it serves, and
// the read loop GetSlice shares (disk_slice_reader.cc).
#include <cstring>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "tiers/disk/disk_read_batch.h"
#include "tiers/disk/disk_segment.h"
#include "tiers/disk/disk_store.h"
#include "tiers/disk/format.h"

namespace kvtier::disk {

void DiskStore::Get(std::span<const BlockKey> keys, std::span<const std::span<std::byte>> out,
                    std::span<Status> results) {
  ReadBatch r(keys, out, results);
  RunReads(&r);
}

void DiskStore::RunReads(ReadBatch* r) {
  FindRecords(r);
  if (r->wants.empty()) return;
  r->ctx = AcquireReader();
  if (r->ctx == nullptr) {
    for (const ReadBatch::Want& w : r->wants)
      r->results[w.index] = Status::Unavailable("no I/O context");
    return;
  }
  const uint32_t nbuf = static_cast<uint32_t>(r->ctx->buffers.size());
  r->slot.resize(nbuf);
  r->pending.assign(nbuf, 0);
  for (uint32_t b = nbuf; b-- > 0;) r->free_bufs.push_back(b);
  QueueReads(r);
  while (r->ctx->engine->outstanding() > 0) {
    r->done.clear();
    Status st = r->ctx->engine->Wait(1, &r->done);
    if (!st.ok()) {
      spdlog::error("disk tier {}: {}; going on with pread/pwrite", options_.path, st.ToString());
      for (const ReadBatch::Want& w : r->wants) {
        if (r->results[w.index].code() == StatusCode::kInternal) {
          r->results[w.index] = Status::Unavailable(st.message());
          if (!r->checksums.empty()) r->checksums[w.index] = 0;
        }
      }
      // Not reused, and no new ring either (see Put).
      ring_failed_.store(true, std::memory_order_relaxed);
      RetireContext(std::move(r->ctx));
      return;
    }
    r->deferred.clear();
    for (const IoCompletion& c : r->done) {
      if (r->slice) {
        CheckSliceRead(r, c);
      } else {
        CheckRead(r, c);
      }
    }
    // The device works on the next reads while the landed ones are checked.
    QueueReads(r);
    r->ctx->engine->Submit();
    for (const ReadBatch::Deferred& d : r->deferred) {
      const ReadBatch::Want& w = r->wants[d.want];
      if (Xxh3(r->out[w.index]) != d.checksum) {
        ReportCorrupt(r, d.want, "payload checksum mismatch");
      } else {
        r->results[w.index] = Status::Ok();
      }
    }
  }
  ReleaseReader(std::move(r->ctx));
  DropCorrupt(r->corrupt);
}

void DiskStore::FindRecords(ReadBatch* r) {
  MutexLock l(&mu_);
  for (size_t i = 0; i < r->keys.size(); ++i) {
    // Get fills whole blocks; GetSlice a range that must lie inside one.
    const uint64_t bb = options_.block_bytes, n = r->out[i].size();
    if (r->slice ? (r->offset > bb || n > bb - r->offset) : n != bb) {
      r->results[i] = Status::InvalidArgument(
          r->slice ? fmt::format("slice [{}, +{}) passes the end of a block of {} bytes", r->offset,
                                 n, bb)
                   : fmt::format("buffer of {} bytes, the tier's blocks are {}", n, bb));
      continue;
    }
    auto it = index_.find(r->keys[i]);
    if (it == index_.end()) {
      r->results[i] = Status::NotFound("not on disk");
      continue;
    }
    std::shared_ptr<Segment> seg;
    for (const auto* table : {&segments_, &retiring_}) {
      auto s = table->find(it->second.segment_id);
      if (s != table->end()) {
        seg = s->second;
        break;
      }
    }
    if (seg == nullptr) {
      r->results[i] = Status::NotFound("segment evicted");
      continue;
    }
    it->second.accessed = true;
    r->wants.push_back({i, it->second, std::move(seg)});
    r->results[i] = Status::Internal("read not completed");
  }
}

void DiskStore::QueueReads(ReadBatch* r) {
  if (r->slice) {
    QueueSliceReads(r);
    return;
  }
  IoContext& ctx = *r->ctx;
  while (r->next < r->wants.size() && !r->free_bufs.empty()) {
    const uint32_t b = r->free_bufs.back();
    r->free_bufs.pop_back();
    r->slot[b] = r->next;
    const ReadBatch::Want& w = r->wants[r->next];
    IoRequest req{false,
                  w.seg->fd,
                  ctx.buffers[b].data(),
                  static_cast<uint32_t>(record_bytes_),
                  w.loc.offset,
                  static_cast<int>(b),
                  b};
    if (ZeroCopy(r->out[w.index].data())) {
      // Straight into the caller's page-aligned buffer; verified there before it counts.
      ctx.iov[b][0] = {ctx.buffers[b].data(), kPageBytes};
      ctx.iov[b][1] = {r->out[w.index].data(), options_.block_bytes};
      req.iov = ctx.iov[b].data();
      req.iovcnt = 2;
    }
    ctx.engine->Queue(req);
    ++r->next;
  }
}

void DiskStore::CheckRead(ReadBatch* r, const IoCompletion& c) {
  const uint32_t b = static_cast<uint32_t>(c.tag);
  const size_t wi = r->slot[b];
  const ReadBatch::Want& w = r->wants[wi];
  // Every path below is done with the bounce buffer (the payload is copied out first).
  r->free_bufs.push_back(b);
  if (c.result != static_cast<int64_t>(record_bytes_)) {
    r->results[w.index] = Status::Unavailable(
        fmt::format("segment {} offset {}: read: {}", w.loc.segment_id, w.loc.offset,
                    c.result < 0 ? Errno(static_cast<int>(-c.result)) : std::string("short read")));
    return;
  }
  const std::span<const std::byte> rec(r->ctx->buffers[b].data(), record_bytes_);
  uint64_t checksum = 0;
  if (!CheckHeader(r, wi, rec.first(kPageBytes), &checksum)) return;
  if (ZeroCopy(r->out[w.index].data())) {
    r->deferred.push_back({wi, checksum});
    return;
  }
  // Bounce path: verify and copy out before the buffer is reused.
  if (Xxh3(rec.subspan(kPageBytes, options_.block_bytes)) != checksum) {
    ReportCorrupt(r, wi, "payload checksum mismatch");
    return;
  }
  std::memcpy(r->out[w.index].data(), rec.data() + kPageBytes, options_.block_bytes);
  r->results[w.index] = Status::Ok();
}

bool DiskStore::CheckHeader(ReadBatch* r, size_t want, std::span<const std::byte> page,
                            uint64_t* payload_checksum) {
  const ReadBatch::Want& w = r->wants[want];
  ParseError err = ParseError::kNotAHeader;
  std::optional<RecordHeader> h = ParseRecordHeader(page, &err);
  std::string problem;
  if (!h) {
    problem = std::string(ParseErrorName(err));
  } else if (h->type != RecordType::kPut || h->key != r->keys[w.index] ||
             h->sequence != w.loc.seq) {
    problem = "header names another record";
  } else if (h->payload_bytes != options_.block_bytes ||
             h->layout_fingerprint != options_.layout_fingerprint) {
    problem = "header of another layout";
  }
  if (!problem.empty()) {
    ReportCorrupt(r, want, problem);
    return false;
  }
  *payload_checksum = h->payload_checksum;
  return true;
}

void DiskStore::ReportCorrupt(ReadBatch* r, size_t want, const std::string& problem) {
  const ReadBatch::Want& w = r->wants[want];
  const std::string where = fmt::format("segment {} offset {}", w.loc.segment_id, w.loc.offset);
  r->results[w.index] = Status::Corruption(fmt::format("{}: {}", where, problem));
  spdlog::warn("disk tier {}: Corruption: {}: key {}: {}; dropped", options_.path, where,
               r->keys[w.index].ToHex(), problem);
  r->corrupt.emplace_back(r->keys[w.index], w.loc.seq);
}

void DiskStore::DropCorrupt(const std::vector<std::pair<BlockKey, uint64_t>>& corrupt) {
  if (corrupt.empty()) return;
  corruptions_.fetch_add(corrupt.size(), std::memory_order_relaxed);
  MutexLock w(&write_mu_);
  std::vector<BlockKey> gone;
  {
    MutexLock l(&mu_);
    for (const auto& [key, seq] : corrupt) {
      auto it = index_.find(key);
      if (it == index_.end() || it->second.seq != seq) continue;  // rewritten meanwhile
      Unaccount(it->second);
      index_.erase(it);
      gone.push_back(key);
    }
  }
  Status st = WriteTombstones(gone);
  if (!st.ok())
    spdlog::warn("disk tier {}: {}; a restart may find the corrupt records again", options_.path,
                 st.ToString());
}

}  // namespace kvtier::disk
