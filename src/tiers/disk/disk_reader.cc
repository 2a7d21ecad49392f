// DiskStore's reader side: Get, on a pooled I/O context, verifying every record it serves.
#include <cstring>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "tiers/disk/disk_segment.h"
#include "tiers/disk/disk_store.h"
#include "tiers/disk/format.h"

namespace kvtier::disk {

void DiskStore::Get(std::span<const BlockKey> keys, std::span<const std::span<std::byte>> out,
                    std::span<Status> results) {
  struct Want {
    size_t index;
    Location loc;
    std::shared_ptr<Segment> seg;
  };
  std::vector<Want> wants;
  {
    MutexLock l(&mu_);
    for (size_t i = 0; i < keys.size(); ++i) {
      if (out[i].size() != options_.block_bytes) {
        results[i] = Status::InvalidArgument(fmt::format(
            "buffer of {} bytes, the tier's blocks are {}", out[i].size(), options_.block_bytes));
        continue;
      }
      auto it = index_.find(keys[i]);
      if (it == index_.end()) {
        results[i] = Status::NotFound("not on disk");
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
        results[i] = Status::NotFound("segment evicted");
        continue;
      }
      it->second.accessed = true;
      wants.push_back({i, it->second, std::move(seg)});
      results[i] = Status::Internal("read not completed");
    }
  }
  if (wants.empty()) return;
  std::unique_ptr<IoContext> ctx = AcquireReader();
  if (ctx == nullptr) {
    for (const Want& w : wants) results[w.index] = Status::Unavailable("no I/O context");
    return;
  }
  const uint32_t nbuf = static_cast<uint32_t>(ctx->buffers.size());
  std::vector<size_t> slot(nbuf);  // buffer -> index into wants
  std::vector<uint32_t> free_bufs;
  for (uint32_t b = nbuf; b-- > 0;) free_bufs.push_back(b);
  std::vector<IoCompletion> done;
  std::vector<std::pair<BlockKey, uint64_t>> corrupt;  // key, seq
  // Reads that landed in the caller's buffer: their header is checked at once (freeing the
  // bounce page for the next read), their payload after the next reads are submitted.
  struct Deferred {
    size_t want;
    uint64_t checksum;
  };
  std::vector<Deferred> deferred;
  auto fail = [&](const Want& w, const std::string& problem) {
    const std::string where = fmt::format("segment {} offset {}", w.loc.segment_id, w.loc.offset);
    results[w.index] = Status::Corruption(fmt::format("{}: {}", where, problem));
    spdlog::warn("disk tier {}: Corruption: {}: key {}: {}; dropped", options_.path, where,
                 keys[w.index].ToHex(), problem);
    corrupt.emplace_back(keys[w.index], w.loc.seq);
  };
  size_t next = 0;
  auto refill = [&] {
    while (next < wants.size() && !free_bufs.empty()) {
      const uint32_t b = free_bufs.back();
      free_bufs.pop_back();
      slot[b] = next;
      const Want& w = wants[next];
      IoRequest req{false,
                    w.seg->fd,
                    ctx->buffers[b].data(),
                    static_cast<uint32_t>(record_bytes_),
                    w.loc.offset,
                    static_cast<int>(b),
                    b};
      if (ZeroCopy(out[w.index].data())) {
        // Straight into the caller's page-aligned buffer; verified there before it counts.
        ctx->iov[b][0] = {ctx->buffers[b].data(), kPageBytes};
        ctx->iov[b][1] = {out[w.index].data(), options_.block_bytes};
        req.iov = ctx->iov[b].data();
        req.iovcnt = 2;
      }
      ctx->engine->Queue(req);
      ++next;
    }
  };
  refill();
  while (ctx->engine->outstanding() > 0) {
    done.clear();
    Status st = ctx->engine->Wait(1, &done);
    if (!st.ok()) {
      spdlog::error("disk tier {}: {}; going on with pread/pwrite", options_.path, st.ToString());
      for (size_t k = 0; k < wants.size(); ++k) {
        if (results[wants[k].index].code() == StatusCode::kInternal) {
          results[wants[k].index] = Status::Unavailable(st.message());
        }
      }
      // Not reused, and no new ring either (see Put).
      ring_failed_.store(true, std::memory_order_relaxed);
      RetireContext(std::move(ctx));
      return;
    }
    deferred.clear();
    for (const IoCompletion& c : done) {
      const uint32_t b = static_cast<uint32_t>(c.tag);
      const size_t wi = slot[b];
      const Want& w = wants[wi];
      if (c.result != static_cast<int64_t>(record_bytes_)) {
        free_bufs.push_back(b);
        results[w.index] = Status::Unavailable(fmt::format(
            "segment {} offset {}: read: {}", w.loc.segment_id, w.loc.offset,
            c.result < 0 ? Errno(static_cast<int>(-c.result)) : std::string("short read")));
        continue;
      }
      const std::span<const std::byte> rec(ctx->buffers[b].data(), record_bytes_);
      ParseError err = ParseError::kNotAHeader;
      std::optional<RecordHeader> h = ParseRecordHeader(rec, &err);
      std::string problem;
      if (!h) {
        problem = std::string(ParseErrorName(err));
      } else if (h->type != RecordType::kPut || h->key != keys[w.index] ||
                 h->sequence != w.loc.seq) {
        problem = "header names another record";
      } else if (h->payload_bytes != options_.block_bytes ||
                 h->layout_fingerprint != options_.layout_fingerprint) {
        problem = "header of another layout";
      }
      if (!problem.empty()) {
        free_bufs.push_back(b);
        fail(w, problem);
        continue;
      }
      if (ZeroCopy(out[w.index].data())) {
        free_bufs.push_back(b);
        deferred.push_back({wi, h->payload_checksum});
        continue;
      }
      // Bounce path: verify and copy out before the buffer is reused.
      if (Xxh3(rec.subspan(kPageBytes, options_.block_bytes)) != h->payload_checksum) {
        free_bufs.push_back(b);
        fail(w, "payload checksum mismatch");
        continue;
      }
      std::memcpy(out[w.index].data(), rec.data() + kPageBytes, options_.block_bytes);
      free_bufs.push_back(b);
      results[w.index] = Status::Ok();
    }
    // The device works on the next reads while the landed ones are checked.
    refill();
    ctx->engine->Submit();
    for (const Deferred& d : deferred) {
      const Want& w = wants[d.want];
      if (Xxh3(out[w.index]) != d.checksum) {
        fail(w, "payload checksum mismatch");
      } else {
        results[w.index] = Status::Ok();
      }
    }
  }
  ReleaseReader(std::move(ctx));
  if (!corrupt.empty()) {
    corruptions_.fetch_add(corrupt.size(), std::memory_order_relaxed);
    MutexLock l(&mu_);
    for (const auto& [key, seq] : corrupt) {
      auto it = index_.find(key);
      if (it == index_.end() || it->second.seq != seq) continue;
      Unaccount(it->second);
      index_.erase(it);
    }
  }
}
}  // namespace kvtier::disk
