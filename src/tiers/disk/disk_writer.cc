// DiskStore's writer side: Put, Erase's tombstones, and the segment roll with its eviction and
// the reinsertion of hot blocks. Callers hold write_mu_ (one append point).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "tiers/disk/disk_segment.h"
#include "tiers/disk/disk_store.h"
#include "tiers/disk/format.h"

namespace kvtier::disk {

namespace {

// Wall-clock time, not the monotonic clock (common/clock.h): the stamp is read back by other
// processes and after reboots.
uint64_t NowUnixNs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

}  // namespace

Status DiskStore::RollSegment(std::vector<BlockKey>* removed, bool evict_for_space) {
  std::shared_ptr<Segment> old;
  {
    MutexLock l(&mu_);
    old = active_;
  }
  if (old != nullptr) {
    // Sealing: the preallocated tail goes, so sealed files count only what they hold.
    if (::ftruncate(old->fd, static_cast<off_t>(old->bytes.load(std::memory_order_relaxed))) == 0) {
      old->synced = false;  // the size changed: metadata to sync
    }
    // With a sync policy, the durable watermark stays contiguous across segments.
    if (options_.sync != SyncPolicy::kNone && !old->synced) {
      if (::fdatasync(old->fd) != 0) {
        write_failing_.store(true, std::memory_order_relaxed);
        return Status::Unavailable(fmt::format("{}: fdatasync: {}", old->path, Errno(errno)));
      }
      old->synced = true;
      syncs_.fetch_add(1, std::memory_order_relaxed);
      durable_seq_.store(next_seq_ - 1);
    }
  }

  // The new file is made whole before anything is evicted: a roll that fails (EMFILE, ENOSPC,
  // a read-only directory) then loses nothing, and the sealed old segment stays active (full,
  // so the next write tries the roll again). The capacity follows what the filesystem holds
  // (other files grow and shrink), and a filesystem fuller than that still (a race) gives up the
  // oldest segments for the room, the one just sealed last: a tier that stores nothing new
  // forever is worse than one that drops old blocks.
  if (evict_for_space) ClampCapacityToFilesystem(/*at_open=*/false);
  std::shared_ptr<Segment> seg;
  for (;;) {
    int err = 0;
    Result<std::shared_ptr<Segment>> made = StartSegment(&err);
    if (made.ok()) {
      seg = std::move(made).value();
      break;
    }
    if (!evict_for_space || (err != ENOSPC && err != EDQUOT) ||
        !EvictOldestForSpace(&old, removed)) {
      write_failing_.store(true, std::memory_order_relaxed);
      return made.status();
    }
  }
  write_failing_.store(false, std::memory_order_relaxed);

  // Evict oldest segments until the new one fits under the capacity.
  std::vector<std::pair<BlockKey, Location>> hot;
  std::vector<std::shared_ptr<Segment>> evicted;
  for (;;) {
    uint64_t victim = 0;
    {
      MutexLock l(&mu_);
      const uint64_t old_bytes = old ? old->bytes.load(std::memory_order_relaxed) : 0;
      if (sealed_bytes_ + old_bytes + segment_bytes_ <= capacity_bytes_.load() ||
          segments_.empty()) {
        break;
      }
      victim = segments_.begin()->first;
      if (old && victim == old->id) break;  // unreachable: the capacity holds two segments
      evicted.push_back(segments_.begin()->second);
    }
    EvictSegment(victim, removed, &hot);
  }
  {
    MutexLock l(&mu_);
    if (old) sealed_bytes_ += old->bytes.load(std::memory_order_relaxed);
    segments_[seg->id] = seg;
    active_ = seg;
  }
  if (!hot.empty()) Reinsert(hot, seg, removed);
  {
    MutexLock l(&mu_);
    for (const auto& s : evicted) retiring_.erase(s->id);
  }
  // Evicted files are unlinked only now: the hot blocks were read from them above. Readers
  // holding a segment keep its descriptor open until they finish.
  for (const auto& s : evicted) ::unlink(s->path.c_str());
  return Status::Ok();
}

Result<std::shared_ptr<DiskStore::Segment>> DiskStore::StartSegment(int* err) {
  auto seg = std::make_shared<Segment>();
  seg->id = next_segment_id_++;
  seg->path = options_.path + "/" + SegmentFileName(seg->id);
  int flags = O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | (direct_ ? O_DIRECT : 0);
  seg->fd = ::open(seg->path.c_str(), flags, 0644);
  if (seg->fd < 0 && errno == EINVAL && direct_) {
    direct_ = false;
    seg->fd = ::open(seg->path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  }
  if (seg->fd < 0) {
    *err = errno;
    return Status::Unavailable(
        fmt::format("{}: cannot start a new segment: create: {}", seg->path, Errno(errno)));
  }
  auto fail = [&](std::string_view what, ssize_t rc) {
    *err = rc < 0 ? errno : 0;
    const std::string why = rc < 0 ? Errno(*err) : std::string("short write");
    ::unlink(seg->path.c_str());
    return Status::Unavailable(
        fmt::format("{}: cannot start a new segment: {}: {}", seg->path, what, why));
  };
  SegmentHeader sh;
  sh.segment_id = seg->id;
  sh.layout_fingerprint = options_.layout_fingerprint;
  sh.block_bytes = options_.block_bytes;
  sh.segment_bytes = segment_bytes_;
  sh.created_unix_ns = NowUnixNs();
  AlignedBuffer& page = writer_->buffers[0];
  EncodeSegmentHeader(sh, page.span().first(kPageBytes));
  const ssize_t wrote = ::pwrite(seg->fd, page.data(), kPageBytes, 0);
  if (wrote != static_cast<ssize_t>(kPageBytes)) return fail("writing the segment header", wrote);
  seg->bytes.store(kPageBytes, std::memory_order_relaxed);
  seg->synced = false;
  // Preallocated: O_DIRECT writes inside the file's size neither allocate nor extend it, which
  // on ext4 is the difference between queued and serialised appends. A filesystem without
  // fallocate is fine; one without the room is not.
  if (::fallocate(seg->fd, 0, 0, static_cast<off_t>(segment_bytes_)) != 0 &&
      (errno == ENOSPC || errno == EDQUOT || errno == EFBIG || errno == EIO)) {
    return fail("fallocate", -1);
  }
  if (options_.sync != SyncPolicy::kNone) {
    // The new file's name must survive a crash before any record in it counts as durable.
    if (::fdatasync(seg->fd) == 0 && ::fsync(dir_fd_) == 0) seg->synced = true;
  }
  return seg;
}

bool DiskStore::EvictOldestForSpace(std::shared_ptr<Segment>* just_sealed,
                                    std::vector<BlockKey>* removed) {
  uint64_t victim = 0;
  std::string path;
  bool last = false;  // the segment just sealed: the newest, so the oldest only when alone
  {
    MutexLock l(&mu_);
    if (segments_.empty()) return false;
    auto it = segments_.begin();
    victim = it->first;
    path = it->second->path;
    last = *just_sealed != nullptr && victim == (*just_sealed)->id;
    // Not in sealed_bytes_ yet; EvictSegment takes its bytes out of it.
    if (last) sealed_bytes_ += (*just_sealed)->bytes.load(std::memory_order_relaxed);
  }
  std::vector<std::pair<BlockKey, Location>> hot;  // no room to copy them forward: dropped
  EvictSegment(victim, removed, &hot);
  {
    MutexLock l(&mu_);
    for (const auto& [key, loc] : hot) {
      auto e = index_.find(key);
      if (e != index_.end() && e->second.seq == loc.seq) {
        index_.erase(e);
        removed->push_back(key);
        evicted_blocks_.fetch_add(1, std::memory_order_relaxed);
      }
    }
    retiring_.erase(victim);
    if (last && active_ == *just_sealed) active_ = nullptr;  // the roll must not seal it again
  }
  if (last) just_sealed->reset();
  // Emptied before the unlink: an unlinked file keeps its blocks while a descriptor is open (the
  // Put that rolls holds the segment just sealed), and the room is needed now. A read still in
  // flight on it ends short: Unavailable, recomputed.
  (void)::truncate(path.c_str(), 0);
  ::unlink(path.c_str());
  space_evictions_.fetch_add(1, std::memory_order_relaxed);
  if (evict_log_.Allow()) {
    spdlog::warn(
        "disk tier {}: the filesystem is full below the capacity: evicted {}{} early for room "
        "(said at most every {} s)",
        options_.path, path, last ? ", the last segment," : "", LogLimiter::kIntervalS);
  }
  return true;
}

bool DiskStore::RollEvicts(uint64_t first_id) const {
  uint64_t newer = 0;
  for (auto it = segments_.lower_bound(first_id); it != segments_.end(); ++it) {
    newer += it->second->bytes.load(std::memory_order_relaxed);
  }
  return newer + segment_bytes_ > capacity_bytes_.load();
}

void DiskStore::EvictSegment(uint64_t id, std::vector<BlockKey>* removed,
                             std::vector<std::pair<BlockKey, Location>>* hot) {
  MutexLock l(&mu_);
  auto it = segments_.find(id);
  if (it == segments_.end()) return;
  std::shared_ptr<Segment> seg = it->second;
  const uint64_t hot_budget = options_.reinsert_hot ? segment_bytes_ / 4 : 0;
  uint64_t hot_bytes = 0;
  for (const auto& [key, offset] : seg->records) {
    auto e = index_.find(key);
    if (e == index_.end() || e->second.segment_id != id || e->second.offset != offset) {
      continue;  // overwritten or erased since
    }
    if (e->second.accessed && hot_bytes + record_bytes_ <= hot_budget) {
      hot_bytes += record_bytes_;
      hot->emplace_back(key, e->second);  // stays indexed (and readable) until reinserted
      continue;
    }
    index_.erase(e);
    removed->push_back(key);
    evicted_blocks_.fetch_add(1, std::memory_order_relaxed);
  }
  sealed_bytes_ -= seg->bytes.load(std::memory_order_relaxed);
  if (hot_bytes > 0) retiring_[id] = seg;
  segments_.erase(it);
  evicted_segments_.fetch_add(1, std::memory_order_relaxed);
}

void DiskStore::Reinsert(const std::vector<std::pair<BlockKey, Location>>& hot,
                         const std::shared_ptr<Segment>& dst, std::vector<BlockKey>* removed) {
  // Runs right after a roll: the budget (a quarter segment) fits in the new segment, dst.
  AlignedBuffer& buf = writer_->buffers[0];
  for (const auto& [key, loc] : hot) {
    std::shared_ptr<Segment> src;
    {
      MutexLock l(&mu_);
      auto e = index_.find(key);
      if (e == index_.end() || e->second.seq != loc.seq) continue;  // changed meanwhile
      auto r = retiring_.find(loc.segment_id);  // the evicted segment, still open
      if (r != retiring_.end()) src = r->second;
    }
    bool ok = src != nullptr && ::pread(src->fd, buf.data(), record_bytes_, loc.offset) ==
                                    static_cast<ssize_t>(record_bytes_);
    ParseError err;
    std::optional<RecordHeader> h;
    if (ok) h = ParseRecordHeader(buf.span(), &err);
    ok = ok && h && h->key == key && h->payload_bytes == options_.block_bytes &&
         Xxh3(buf.span().subspan(kPageBytes, options_.block_bytes)) == h->payload_checksum;
    const uint64_t off = dst->bytes.load(std::memory_order_relaxed);
    if (ok && off + record_bytes_ <= segment_bytes_) {
      h->sequence = next_seq_++;
      EncodeRecordHeader(*h, buf.span().first(kPageBytes));
      ok = ::pwrite(dst->fd, buf.data(), record_bytes_, off) == static_cast<ssize_t>(record_bytes_);
      if (ok) {
        dst->bytes.store(off + record_bytes_, std::memory_order_relaxed);
        dst->synced = false;
        MutexLock l(&mu_);
        auto e = index_.find(key);
        if (e != index_.end() && e->second.seq == loc.seq) {
          Publish(key, Location{dst->id, off, h->sequence, false});
          reinserted_.fetch_add(1, std::memory_order_relaxed);
          continue;
        }
      }
    }
    MutexLock l(&mu_);
    auto e = index_.find(key);
    if (e != index_.end() && e->second.seq == loc.seq) {
      index_.erase(e);
      removed->push_back(key);
      evicted_blocks_.fetch_add(1, std::memory_order_relaxed);
    }
  }
  written_seq_.store(next_seq_ - 1);
}

// One Put in flight: the blocks, the writer's buffers they occupy, and how far the batch got.
// Put runs it as a loop of two steps: queue writes (rolling the segment when it is full), then
// wait for some to complete (publishing them).
struct DiskStore::PutBatch {
  struct Pending {
    size_t index;
    Location loc;
  };
  PutBatch(std::span<const BlockKey> k, std::span<const std::span<const std::byte>> b,
           std::span<Status> r, uint32_t nbuf)
      : keys(k), blocks(b), results(r), pending(nbuf) {
    for (uint32_t i = nbuf; i-- > 0;) free_bufs.push_back(i);
  }

  std::span<const BlockKey> keys;
  std::span<const std::span<const std::byte>> blocks;
  std::span<Status> results;
  std::vector<BlockKey> removed;  // evicted by rolls, reported after the lock is released
  std::vector<Pending> pending;   // per writer buffer
  std::vector<uint32_t> free_bufs;
  std::vector<IoCompletion> done;
  std::shared_ptr<Segment> seg;
  // Segments from this id on hold this batch's blocks (0: none yet); it never evicts them.
  uint64_t first_segment = 0;
  bool wrote = false;
  size_t next = 0;
  // sums[i - sums_base] is the payload checksum of block i, for next <= i < summed.
  std::vector<uint64_t> sums;
  size_t summed = 0, sums_base = 0;
  Status stop;  // why the blocks from `next` on are not written
};

void DiskStore::Put(std::span<const BlockKey> keys,
                    std::span<const std::span<const std::byte>> blocks, std::span<Status> results) {
  std::vector<BlockKey> removed;
  {
    MutexLock w(&write_mu_);
    PutBatch batch(keys, blocks, results, static_cast<uint32_t>(writer_->buffers.size()));
    {
      MutexLock l(&mu_);
      batch.seg = active_;
    }
    for (Status& r : results) r = Status::Unavailable("write not completed");
    while (batch.next < keys.size() || writer_->engine->outstanding() > 0) {
      QueueWrites(&batch);
      if (!batch.stop.ok()) {
        for (; batch.next < keys.size(); ++batch.next) results[batch.next] = batch.stop;
      }
      if (writer_->engine->outstanding() == 0) continue;
      if (!AwaitWrites(&batch)) break;
    }
    written_seq_.store(next_seq_ - 1);
    if (batch.wrote && options_.sync == SyncPolicy::kBatch) {
      Status st = SyncLocked();
      if (!st.ok()) spdlog::error("disk tier {}: {}", options_.path, st.ToString());
    }
    removed = std::move(batch.removed);
  }
  if (!removed.empty() && on_removed_) on_removed_(removed);
}

void DiskStore::QueueWrites(PutBatch* b) {
  while (b->next < b->keys.size() && !b->free_bufs.empty() && b->stop.ok()) {
    const std::span<const std::byte> block = b->blocks[b->next];
    if (block.size() != options_.block_bytes) {
      b->results[b->next] = Status::InvalidArgument(fmt::format(
          "block of {} bytes, the tier's blocks are {}", block.size(), options_.block_bytes));
      ++b->next;
      continue;
    }
    uint64_t off =
        b->seg != nullptr ? b->seg->bytes.load(std::memory_order_relaxed) : segment_bytes_;
    if (off + record_bytes_ > segment_bytes_) {
      if (writer_->engine->outstanding() > 0) break;  // drain before sealing
      if (!RollForBatch(b)) break;
      off = b->seg->bytes.load(std::memory_order_relaxed);
    }
    QueueWrite(b, off);
  }
}

bool DiskStore::RollForBatch(PutBatch* b) {
  bool self_evicting = false;
  if (b->first_segment != 0) {
    MutexLock l(&mu_);
    self_evicting = RollEvicts(b->first_segment);
  }
  if (self_evicting) {
    // Writing on would evict this batch's own head, and a prefix is useless without its
    // head: the head stays (as the Cache does for a full tier) and the tail is refused.
    const size_t n = b->keys.size();
    b->stop = Status::ResourceExhausted(
        fmt::format("batch of {} blocks ({} bytes on disk) is more than the tier holds at once ({} "
                    "bytes of capacity in {}-byte segments): blocks {} to {} not stored, the head "
                    "before them kept",
                    n, n * record_bytes_, capacity_bytes_.load(), segment_bytes_, b->next, n - 1));
    return false;
  }
  b->stop = RollSegment(&b->removed);
  if (!b->stop.ok()) {
    if (log_limit_.Allow()) {
      spdlog::error("disk tier {}: {} (such errors are logged at most every {} s)", options_.path,
                    b->stop.ToString(), LogLimiter::kIntervalS);
    }
    return false;
  }
  MutexLock l(&mu_);
  b->seg = active_;
  return true;
}

void DiskStore::QueueWrite(PutBatch* b, uint64_t off) {
  IoContext& ctx = *writer_;
  const size_t next = b->next;
  const std::span<const std::byte> block = b->blocks[next];
  Segment& seg = *b->seg;
  const uint32_t buf_index = b->free_bufs.back();
  b->free_bufs.pop_back();
  std::byte* buf = ctx.buffers[buf_index].data();
  RecordHeader h;
  h.key = b->keys[next];
  h.payload_bytes = options_.block_bytes;
  h.layout_fingerprint = options_.layout_fingerprint;
  h.sequence = next_seq_++;
  h.payload_checksum = next < b->summed ? b->sums[next - b->sums_base] : Xxh3(block);
  EncodeRecordHeader(h, {buf, kPageBytes});
  IoRequest req{
      true,     seg.fd, buf, static_cast<uint32_t>(record_bytes_), off, static_cast<int>(buf_index),
      buf_index};
  if (ZeroCopy(block.data())) {
    // The caller's page-aligned block goes to the device as it is: no bounce copy.
    ctx.iov[buf_index][0] = {buf, kPageBytes};
    ctx.iov[buf_index][1] = {const_cast<std::byte*>(block.data()), options_.block_bytes};
    req.iov = ctx.iov[buf_index].data();
    req.iovcnt = 2;
  } else {
    std::memcpy(buf + kPageBytes, block.data(), options_.block_bytes);
    std::memset(buf + kPageBytes + options_.block_bytes, 0,
                record_bytes_ - kPageBytes - options_.block_bytes);
  }
  seg.bytes.store(off + record_bytes_, std::memory_order_relaxed);
  seg.synced = false;
  b->pending[buf_index] = {next, Location{seg.id, off, h.sequence, false}};
  if (b->first_segment == 0) b->first_segment = seg.id;
  ctx.engine->Queue(req);
  ++b->next;
}

bool DiskStore::AwaitWrites(PutBatch* b) {
  // While the device writes, the next block's checksum is computed (one ahead per wait).
  writer_->engine->Submit();
  if (b->summed < b->next) {
    b->summed = b->next;
    b->sums_base = b->next;
    b->sums.clear();
  }
  if (b->summed < b->keys.size() && b->blocks[b->summed].size() == options_.block_bytes) {
    b->sums.push_back(Xxh3(b->blocks[b->summed]));
    ++b->summed;
  }
  b->done.clear();
  Status st = writer_->engine->Wait(1, &b->done);
  if (!st.ok()) {
    FailWriterRing(b, st);
    return false;
  }
  MutexLock l(&mu_);
  for (const IoCompletion& c : b->done) {
    const PutBatch::Pending& p = b->pending[c.tag];
    if (c.result == static_cast<int64_t>(record_bytes_)) {
      Publish(b->keys[p.index], p.loc);
      b->results[p.index] = Status::Ok();
      b->wrote = true;
    } else {
      b->results[p.index] = Status::Unavailable(fmt::format(
          "segment {} offset {}: write: {}", p.loc.segment_id, p.loc.offset,
          c.result < 0 ? Errno(static_cast<int>(-c.result)) : std::string("short write")));
    }
    b->free_bufs.push_back(static_cast<uint32_t>(c.tag));
  }
  return true;
}

void DiskStore::FailWriterRing(PutBatch* b, const Status& st) {
  // The ring itself failed: what it holds never completes, so those blocks and the rest
  // are not stored. A ring that failed once is not trusted again (its kernel or device
  // is likely to fail the next one the same way, and a retry could hang): this context
  // and every one made from now on use pread/pwrite.
  spdlog::error("disk tier {}: {}; going on with pread/pwrite", options_.path, st.ToString());
  const uint32_t nbuf = static_cast<uint32_t>(b->pending.size());
  std::vector<bool> busy(nbuf, true);
  for (uint32_t i : b->free_bufs) busy[i] = false;
  for (uint32_t i = 0; i < nbuf; ++i) {
    if (busy[i]) b->results[b->pending[i].index] = Status::Unavailable(st.message());
  }
  for (; b->next < b->keys.size(); ++b->next) {
    b->results[b->next] = Status::Unavailable(st.message());
  }
  ring_failed_.store(true, std::memory_order_relaxed);
  auto fresh = MakeContext();
  if (fresh.ok()) {
    RetireContext(std::move(writer_));
    writer_ = std::move(fresh).value();
  }
}

Status DiskStore::Erase(std::span<const BlockKey> keys) {
  MutexLock w(&write_mu_);
  std::vector<BlockKey> gone;
  {
    MutexLock l(&mu_);
    for (const BlockKey& key : keys) {
      auto it = index_.find(key);
      if (it == index_.end()) continue;
      Unaccount(it->second);
      index_.erase(it);
      gone.push_back(key);
    }
  }
  return WriteTombstones(gone);
}

Status DiskStore::WriteTombstones(std::span<const BlockKey> gone) {
  if (gone.empty()) return Status::Ok();
  // One page each, written in one batch per buffer's worth of pages.
  std::vector<BlockKey> removed;
  Status result;
  AlignedBuffer& buf = writer_->buffers[0];
  const uint64_t per_write = buf.size() / kPageBytes;
  size_t i = 0;
  while (i < gone.size()) {
    std::shared_ptr<Segment> seg;
    {
      MutexLock l(&mu_);
      seg = active_;
    }
    const uint64_t off =
        seg != nullptr ? seg->bytes.load(std::memory_order_relaxed) : segment_bytes_;
    if (off + kPageBytes > segment_bytes_) {
      result = RollSegment(&removed);
      if (!result.ok()) break;
      continue;
    }
    const uint64_t room = (segment_bytes_ - off) / kPageBytes;
    const size_t n = std::min<size_t>({gone.size() - i, per_write, room});
    for (size_t k = 0; k < n; ++k) {
      RecordHeader h;
      h.type = RecordType::kTombstone;
      h.key = gone[i + k];
      h.layout_fingerprint = options_.layout_fingerprint;
      h.sequence = next_seq_++;
      EncodeRecordHeader(h, buf.span().subspan(k * kPageBytes, kPageBytes));
    }
    const ssize_t want = static_cast<ssize_t>(n * kPageBytes);
    if (::pwrite(seg->fd, buf.data(), static_cast<size_t>(want), off) != want) {
      result = Status::Unavailable(
          fmt::format("segment {} offset {}: writing tombstones: {}", seg->id, off, Errno(errno)));
      break;
    }
    seg->bytes.store(off + static_cast<uint64_t>(want), std::memory_order_relaxed);
    seg->synced = false;
    i += n;
  }
  written_seq_.store(next_seq_ - 1);
  if (result.ok() && options_.sync == SyncPolicy::kBatch) result = SyncLocked();
  if (!removed.empty() && on_removed_) on_removed_(removed);
  return result;
}
}  // namespace kvtier::disk
