#include "tiers/disk/disk_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "tiers/disk/format.h"
#include "tiers/disk/segment_scan.h"

namespace kvtier::disk {

struct DiskStore::Segment {
  uint64_t id = 0;
  std::string path;
  int fd = -1;
  std::atomic<uint64_t> bytes{0};  // end of the last record placed (the file's length)
  uint64_t live_bytes = 0;         // guarded by DiskStore::mu_
  uint64_t live_blocks = 0;        // guarded by DiskStore::mu_
  // (key, offset) of every put record placed here; guarded by DiskStore::mu_.
  std::vector<std::pair<BlockKey, uint64_t>> records;
  bool synced = true;  // guarded by DiskStore::write_mu_ (set by the writer)

  ~Segment() {
    if (fd >= 0) ::close(fd);
  }
};

namespace {

constexpr uint64_t kDefaultSegmentBytes = 256ull << 20;

std::string Errno(int err) { return std::strerror(err); }

uint64_t NowUnixNs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

// Descriptors the process has open now (0 when /proc cannot tell).
uint64_t OpenDescriptors() {
  DIR* d = ::opendir("/proc/self/fd");
  if (d == nullptr) return 0;
  uint64_t n = 0;
  while (dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
  ::closedir(d);
  return n > 0 ? n - 1 : 0;  // not the one opendir holds
}

// The process limits the tier runs under, checked before anything is written: past them it
// would fail later, one batch at a time, or (ulimit -f) be killed by SIGXFSZ with no message.
Status CheckProcessLimits(const std::string& dir, uint64_t capacity_bytes, uint64_t segment_bytes) {
  // SIGXFSZ's default action kills the process when a write passes RLIMIT_FSIZE; ignored, the
  // write fails with EFBIG and the tier reports it. An application's own handler is kept.
  struct sigaction old {};
  if (::sigaction(SIGXFSZ, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) {
    ::signal(SIGXFSZ, SIG_IGN);
  }
  rlimit fsize{};
  if (::getrlimit(RLIMIT_FSIZE, &fsize) == 0 && fsize.rlim_cur != RLIM_INFINITY &&
      fsize.rlim_cur < segment_bytes) {
    return Status::ResourceExhausted(fmt::format(
        "{}: segments of {} bytes exceed this process's file size limit of {} bytes (ulimit -f): "
        "lower params.segment_bytes or raise the limit",
        dir, segment_bytes, static_cast<uint64_t>(fsize.rlim_cur)));
  }
  // One descriptor per segment (the capacity's worth, the active one and the next), the
  // directory, and a few I/O contexts (an io_uring ring each).
  constexpr uint64_t kSpareDescriptors = 16;
  const uint64_t need = OpenDescriptors() + capacity_bytes / segment_bytes + 3 + kSpareDescriptors;
  rlimit nofile{};
  if (::getrlimit(RLIMIT_NOFILE, &nofile) != 0 || nofile.rlim_cur == RLIM_INFINITY ||
      nofile.rlim_cur >= need) {
    return Status::Ok();
  }
  if (nofile.rlim_max == RLIM_INFINITY || nofile.rlim_max >= need) {
    const rlim_t before = nofile.rlim_cur;
    nofile.rlim_cur = static_cast<rlim_t>(need);
    if (::setrlimit(RLIMIT_NOFILE, &nofile) == 0) {
      spdlog::info("disk tier {}: raised the open file limit from {} to {} (ulimit -n)", dir,
                   static_cast<uint64_t>(before), need);
      return Status::Ok();
    }
  }
  return Status::ResourceExhausted(fmt::format(
      "{}: {} bytes in segments of {} bytes need about {} open files, more than this process may "
      "open ({}, ulimit -n; hard limit {}): raise params.segment_bytes or the limit",
      dir, capacity_bytes, segment_bytes, need, static_cast<uint64_t>(nofile.rlim_cur),
      nofile.rlim_max == RLIM_INFINITY ? std::string("unlimited")
                                       : std::to_string(nofile.rlim_max)));
}

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

DiskStore::DiskStore(const DiskOptions& options, RemovalFn on_removed)
    : options_(options),
      segment_bytes_(options.effective_segment_bytes()),
      record_bytes_(options.record_bytes()),
      on_removed_(std::move(on_removed)),
      capacity_bytes_(options.capacity_bytes) {}

Result<std::unique_ptr<DiskStore>> DiskStore::Open(const DiskOptions& options,
                                                   RemovalFn on_removed) {
  KVTIER_RETURN_IF_ERROR(options.Validate());
  KVTIER_RETURN_IF_ERROR(
      CheckProcessLimits(options.path, options.capacity_bytes, options.effective_segment_bytes()));
  std::unique_ptr<DiskStore> store(new DiskStore(options, std::move(on_removed)));
  std::vector<BlockKey> removed;
  KVTIER_RETURN_IF_ERROR(store->OpenDirectory(&removed));
  if (!removed.empty() && store->on_removed_) store->on_removed_(removed);
  return store;
}

DiskStore::~DiskStore() {
  if (sync_thread_.joinable()) {
    {
      std::lock_guard<std::mutex> l(sync_mu_);
      stop_ = true;
    }
    sync_cv_.notify_all();
    sync_thread_.join();
  }
  {
    // The active segment gives back its preallocated tail before the final sync.
    MutexLock l(&mu_);
    if (active_ != nullptr &&
        ::ftruncate(active_->fd, static_cast<off_t>(active_->bytes.load())) == 0) {
      active_->synced = false;
    }
  }
  if (options_.sync != SyncPolicy::kNone) {
    MutexLock w(&write_mu_);
    Status st = writer_ != nullptr ? SyncLocked() : Status::Ok();
    if (!st.ok()) spdlog::error("disk tier {}: sync at close: {}", options_.path, st.ToString());
  }
  {
    MutexLock l(&mu_);
    active_.reset();
    segments_.clear();
  }
  if (dir_fd_ >= 0) ::close(dir_fd_);  // releases the flock
}

Result<std::unique_ptr<DiskStore::IoContext>> DiskStore::MakeContext() {
  auto ctx = std::make_unique<IoContext>();
  const uint64_t n =
      std::clamp<uint64_t>(options_.buffer_bytes / record_bytes_, 1, options_.queue_depth);
  IoEngineOptions eo;
  // After a ring failed, new contexts do not try io_uring again (see Put).
  eo.backend = ring_failed_.load(std::memory_order_relaxed) ? IoBackend::kSync : options_.io;
  eo.queue_depth = static_cast<uint32_t>(n);
  eo.register_buffers = options_.register_buffers;
  for (uint64_t i = 0; i < n; ++i) {
    ctx->buffers.emplace_back(record_bytes_);
    eo.buffers.push_back(ctx->buffers.back().span());
  }
  ctx->iov.resize(n);
  KVTIER_ASSIGN_OR_RETURN(ctx->engine,
                          options_.make_io_engine ? options_.make_io_engine(eo) : MakeIoEngine(eo));
  return ctx;
}

std::unique_ptr<DiskStore::IoContext> DiskStore::AcquireReader() {
  {
    MutexLock l(&pool_mu_);
    if (!readers_.empty()) {
      auto ctx = std::move(readers_.back());
      readers_.pop_back();
      return ctx;
    }
  }
  auto ctx = MakeContext();
  if (!ctx.ok()) return nullptr;
  return std::move(ctx).value();
}

void DiskStore::ReleaseReader(std::unique_ptr<IoContext> ctx) {
  MutexLock l(&pool_mu_);
  readers_.push_back(std::move(ctx));
}

void DiskStore::RetireContext(std::unique_ptr<IoContext> ctx) {
  MutexLock l(&pool_mu_);
  broken_.push_back(std::move(ctx));
}

Status DiskStore::OpenDirectory(std::vector<BlockKey>* removed) {
  // Nothing else runs yet; the lock is for the thread-safety analysis and the lock order.
  MutexLock w(&write_mu_);
  const std::string& dir = options_.path;
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return Status::Internal(fmt::format("{}: mkdir: {}", dir, Errno(errno)));
  }
  dir_fd_ = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd_ < 0) return Status::Internal(fmt::format("{}: open: {}", dir, Errno(errno)));
  // The directory itself is locked: a lock file can be unlinked from under its holder, and
  // the next process would lock a new file and write into the same segments.
  if (::flock(dir_fd_, LOCK_EX | LOCK_NB) != 0) {
    return Status::Unavailable(
        fmt::format("{}: the directory is in use by another disk tier ({})", dir, Errno(errno)));
  }

  // Segment files, oldest first.
  std::vector<uint64_t> ids;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      const std::string_view name = e->d_name;
      if (auto id = ParseSegmentFileName(name)) {
        ids.push_back(*id);
      } else if (name.starts_with("seg-") || name.ends_with(".kvs")) {
        spdlog::warn("disk tier {}: {}: not a segment file name (seg-<id>.kvs); not read", dir,
                     name);
      }
    }
    ::closedir(d);
  }
  std::sort(ids.begin(), ids.end());

  // Writer context first: it tells which backend this machine gives us.
  KVTIER_ASSIGN_OR_RETURN(writer_, MakeContext());
  std::vector<std::string> notes;
  if (!writer_->engine->note().empty()) notes.push_back(writer_->engine->note());
  io_name_ = std::string(writer_->engine->name());
  io_registered_ = writer_->engine->registered_buffers();

  direct_ = options_.direct_io;
  uint64_t max_seq = 0;
  uint64_t recovered_issues = 0;
  for (uint64_t id : ids) {
    auto seg = std::make_shared<Segment>();
    seg->id = id;
    seg->path = dir + "/" + SegmentFileName(id);
    const int scan_fd = ::open(seg->path.c_str(), O_RDWR | O_CLOEXEC);
    if (scan_fd < 0) return Status::Internal(fmt::format("{}: open: {}", seg->path, Errno(errno)));
    struct stat st {};
    ::fstat(scan_fd, &st);
    const uint64_t file_bytes = static_cast<uint64_t>(st.st_size);
    SegmentScan scan = ScanSegment(PreadReader(scan_fd), file_bytes, options_.layout_fingerprint);
    if (!scan.header && scan.header_error == ParseError::kFutureVersion) {
      ::close(scan_fd);
      return Status::InvalidArgument(fmt::format(
          "{}: segment format version {} is newer than this build reads ({}); refusing to open "
          "it rather than misread it (use a newer kvtier or another directory)",
          seg->path, scan.header_version, kFormatVersion));
    }
    if (scan.header && scan.header->layout_fingerprint != options_.layout_fingerprint) {
      ::close(scan_fd);
      return Status::InvalidArgument(fmt::format(
          "{}: segment written for layout fingerprint {:016x} ({} bytes per block), this tier's "
          "layout is {:016x} ({} bytes per block); refusing to mix layouts (use another "
          "directory)",
          seg->path, scan.header->layout_fingerprint, scan.header->block_bytes,
          options_.layout_fingerprint, options_.block_bytes));
    }
    uint64_t kept_bytes = file_bytes;
    // Only the newest segment was being written when a process died: a tail that does not
    // parse anywhere else is damage to sealed data, reported and kept, never cut off.
    const bool newest = id == ids.back();
    if (newest && scan.header && !scan.issues.empty() &&
        scan.issues.back().kind == ScanIssue::Kind::kTornTail &&
        scan.issues.back().offset + scan.issues.back().length == file_bytes) {
      // A segment the last process did not seal (it crashed): its unwritten end goes, and the
      // records that may have been in flight at the crash (at most one writer's buffers) have
      // their payloads checked now, so a torn one is dropped as torn rather than served later
      // as Corruption.
      uint64_t trim = scan.issues.back().offset;
      const size_t window =
          std::min<size_t>(scan.records.size(), std::max<size_t>(writer_->buffers.size(), 32));
      std::vector<std::byte> payload;
      const ReadAtFn read = PreadReader(scan_fd);
      for (size_t i = scan.records.size() - window; i < scan.records.size(); ++i) {
        const ScannedRecord& r = scan.records[i];
        if (r.header.type != RecordType::kPut) continue;
        payload.resize(r.header.payload_bytes);
        if (read(r.offset + kPageBytes, payload) == static_cast<int64_t>(payload.size()) &&
            Xxh3(payload) == r.header.payload_checksum) {
          continue;
        }
        spdlog::info("disk tier {}: {} offset {}: record cut by the crash (torn), skipped", dir,
                     seg->path, r.offset);
        scan.records[i].header.type = RecordType{0};  // skipped below
      }
      while (!scan.records.empty() && scan.records.back().header.type == RecordType{0}) {
        trim = scan.records.back().offset;
        scan.records.pop_back();
      }
      if (::ftruncate(scan_fd, static_cast<off_t>(trim)) == 0) kept_bytes = trim;
    }
    ::close(scan_fd);
    auto corrupt = [newest](const ScanIssue& i) {
      return i.is_corruption() || (!newest && i.kind == ScanIssue::Kind::kTornTail);
    };
    const bool any_corrupt = std::any_of(scan.issues.begin(), scan.issues.end(), corrupt);
    if (file_bytes < kPageBytes || (scan.header && scan.records.empty() && !any_corrupt)) {
      // Torn while being created, or holding no record: nothing to keep.
      ::unlink(seg->path.c_str());
      next_segment_id_ = id + 1;
      continue;
    }
    if (!scan.header) {
      ++recovered_issues;
      corruptions_.fetch_add(1, std::memory_order_relaxed);
      spdlog::warn(
          "disk tier {}: Corruption: {} offset 0: segment header: {}; reading its "
          "records by their own headers",
          dir, seg->path, ParseErrorName(scan.header_error));
    }
    for (const ScanIssue& issue : scan.issues) {
      if (corrupt(issue)) {
        ++recovered_issues;
        corruptions_.fetch_add(1, std::memory_order_relaxed);
        spdlog::warn("disk tier {}: Corruption: {} offset {}: {}", dir, seg->path, issue.offset,
                     issue.is_corruption()
                         ? issue.message
                         : fmt::format("the last {} bytes of a sealed segment do not parse; kept",
                                       issue.length));
      } else {
        spdlog::info("disk tier {}: {} offset {}: {}", dir, seg->path, issue.offset, issue.message);
      }
    }
    int flags = O_RDONLY | O_CLOEXEC | (direct_ ? O_DIRECT : 0);
    seg->fd = ::open(seg->path.c_str(), flags);
    if (seg->fd < 0 && errno == EINVAL && direct_) {
      direct_ = false;
      seg->fd = ::open(seg->path.c_str(), O_RDONLY | O_CLOEXEC);
    }
    if (seg->fd < 0) return Status::Internal(fmt::format("{}: open: {}", seg->path, Errno(errno)));
    seg->bytes.store(AlignUp(kept_bytes), std::memory_order_relaxed);
    {
      MutexLock l(&mu_);
      segments_[id] = seg;
      sealed_bytes_ += seg->bytes.load(std::memory_order_relaxed);
      // Records in file order, segments in id order: that is sequence order, so later wins.
      for (const ScannedRecord& r : scan.records) {
        max_seq = std::max(max_seq, r.header.sequence);
        if (r.header.type == RecordType{0}) continue;  // torn at the crash
        if (r.header.type == RecordType::kTombstone) {
          auto it = index_.find(r.header.key);
          if (it != index_.end() && it->second.seq < r.header.sequence) {
            Unaccount(it->second);
            index_.erase(it);
          }
          continue;
        }
        if (r.header.payload_bytes != options_.block_bytes) {
          ++recovered_issues;
          spdlog::warn(
              "disk tier {}: {} offset {}: record of {} bytes, the tier's blocks are {}; "
              "skipped",
              dir, seg->path, r.offset, r.header.payload_bytes, options_.block_bytes);
          continue;
        }
        Publish(r.header.key, Location{id, r.offset, r.header.sequence, false});
      }
    }
    next_segment_id_ = id + 1;
  }
  uint64_t recovered = 0;
  {
    MutexLock l(&mu_);
    recovered = index_.size();
  }
  recovered_.store(recovered, std::memory_order_relaxed);
  next_seq_ = max_seq + 1;
  written_seq_.store(max_seq);
  durable_seq_.store(max_seq);  // what survived is as durable as it gets
  if (!ids.empty() || recovered_issues > 0) {
    spdlog::info("disk tier {}: recovered {} blocks from {} segments ({} issues)", dir, recovered,
                 ids.size(), recovered_issues);
  }

  // A filesystem that cannot hold the capacity would fail rolls with ENOSPC: the capacity is
  // what it can hold (what the segments use plus its free space), at least two segments (the
  // roll then evicts for room, see RollSegment).
  struct statvfs fs {};
  if (::fstatvfs(dir_fd_, &fs) == 0) {
    uint64_t sealed = 0;
    {
      MutexLock l(&mu_);
      sealed = sealed_bytes_;
    }
    const uint64_t room = (sealed + uint64_t{fs.f_bavail} * fs.f_frsize) / kPageBytes * kPageBytes;
    if (room < capacity_bytes_) {
      capacity_bytes_ = std::max(room, 2 * segment_bytes_);
      spdlog::warn(
          "disk tier {}: the filesystem holds {} bytes for the tier, less than the {} "
          "of its capacity: using {}",
          dir, room, options_.capacity_bytes, capacity_bytes_);
    }
  }
  // A fresh active segment; old ones are never appended to (their tails may be torn). When
  // none can be started (a full or read-only filesystem), what is here is still served: the
  // tier opens read-only, and every Put tries the roll again (evicting for room then).
  if (Status st = RollSegment(removed, /*evict_for_space=*/false); !st.ok()) {
    spdlog::warn(
        "disk tier {}: {}; opened read-only: the {} blocks here are served, writes "
        "fail until a segment can be started",
        dir, st.ToString(), recovered);
  }
  if (!direct_) {
    notes.push_back(fmt::format("O_DIRECT refused by the filesystem of {}: buffered I/O", dir));
  }
  for (size_t i = 0; i < notes.size(); ++i) notes_ += (i ? "; " : "") + notes[i];
  if (!notes_.empty()) spdlog::warn("disk tier {}: {}", dir, notes_);

  if (options_.sync == SyncPolicy::kInterval) {
    sync_thread_ = std::thread([this] { SyncLoop(); });
  }
  return Status::Ok();
}

void DiskStore::Unaccount(const Location& loc) {
  auto s = segments_.find(loc.segment_id);
  if (s != segments_.end()) {
    s->second->live_bytes -= record_bytes_;
    --s->second->live_blocks;
  }
}

void DiskStore::Publish(const BlockKey& key, const Location& loc) {
  auto it = index_.find(key);
  if (it != index_.end()) {
    Unaccount(it->second);
    it->second = loc;
  } else {
    index_.emplace(key, loc);
  }
  auto s = segments_.find(loc.segment_id);
  if (s != segments_.end()) {
    s->second->live_bytes += record_bytes_;
    ++s->second->live_blocks;
    s->second->records.emplace_back(key, loc.offset);
  }
}

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
        return Status::Unavailable(fmt::format("{}: fdatasync: {}", old->path, Errno(errno)));
      }
      old->synced = true;
      syncs_.fetch_add(1, std::memory_order_relaxed);
      durable_seq_.store(next_seq_ - 1);
    }
  }

  // The new file is made whole before anything is evicted: a roll that fails (EMFILE, ENOSPC,
  // a read-only directory) then loses nothing, and the sealed old segment stays active (full,
  // so the next write tries the roll again). A filesystem fuller than the capacity says (other
  // files grew) gives up the oldest segment for the room, as the capacity would have.
  std::shared_ptr<Segment> seg;
  for (;;) {
    int err = 0;
    Result<std::shared_ptr<Segment>> made = StartSegment(&err);
    if (made.ok()) {
      seg = std::move(made).value();
      break;
    }
    if (!evict_for_space || (err != ENOSPC && err != EDQUOT) ||
        !EvictOldestForSpace(old.get(), removed)) {
      return made.status();
    }
  }

  // Evict oldest segments until the new one fits under the capacity.
  std::vector<std::pair<BlockKey, Location>> hot;
  std::vector<std::shared_ptr<Segment>> evicted;
  for (;;) {
    uint64_t victim = 0;
    {
      MutexLock l(&mu_);
      const uint64_t old_bytes = old ? old->bytes.load(std::memory_order_relaxed) : 0;
      if (sealed_bytes_ + old_bytes + segment_bytes_ <= capacity_bytes_ || segments_.empty()) {
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

bool DiskStore::EvictOldestForSpace(const Segment* keep, std::vector<BlockKey>* removed) {
  uint64_t victim = 0;
  std::string path;
  {
    MutexLock l(&mu_);
    if (segments_.empty()) return false;
    auto it = segments_.begin();
    if (keep != nullptr && it->first == keep->id) return false;  // the one just sealed
    victim = it->first;
    path = it->second->path;
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
  }
  ::unlink(path.c_str());
  space_evictions_.fetch_add(1, std::memory_order_relaxed);
  if (log_limit_.Allow()) {
    spdlog::warn(
        "disk tier {}: the filesystem is full below the capacity: evicted {} early for room",
        options_.path, path);
  }
  return true;
}

bool DiskStore::RollEvicts(uint64_t first_id) const {
  uint64_t newer = 0;
  for (auto it = segments_.lower_bound(first_id); it != segments_.end(); ++it) {
    newer += it->second->bytes.load(std::memory_order_relaxed);
  }
  return newer + segment_bytes_ > capacity_bytes_;
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

void DiskStore::Put(std::span<const BlockKey> keys,
                    std::span<const std::span<const std::byte>> blocks, std::span<Status> results) {
  std::vector<BlockKey> removed;
  {
    MutexLock w(&write_mu_);
    IoContext& ctx = *writer_;
    const uint32_t nbuf = static_cast<uint32_t>(ctx.buffers.size());
    struct Pending {
      size_t index;
      Location loc;
    };
    std::vector<Pending> pending(nbuf);
    std::vector<uint32_t> free_bufs;
    for (uint32_t b = nbuf; b-- > 0;) free_bufs.push_back(b);
    std::vector<IoCompletion> done;
    std::shared_ptr<Segment> seg;
    {
      MutexLock l(&mu_);
      seg = active_;
    }
    // Segments from this id on hold this batch's blocks (0: none yet); it never evicts them.
    uint64_t first_segment = 0;
    for (Status& r : results) r = Status::Unavailable("write not completed");
    bool wrote = false;
    size_t next = 0;
    // sums[i - sums_base] is the payload checksum of block i, for next <= i < summed.
    std::vector<uint64_t> sums;
    size_t summed = 0, sums_base = 0;
    Status stop;  // why the blocks from `next` on are not written
    while (next < keys.size() || ctx.engine->outstanding() > 0) {
      while (next < keys.size() && !free_bufs.empty() && stop.ok()) {
        if (blocks[next].size() != options_.block_bytes) {
          results[next] =
              Status::InvalidArgument(fmt::format("block of {} bytes, the tier's blocks are {}",
                                                  blocks[next].size(), options_.block_bytes));
          ++next;
          continue;
        }
        uint64_t off = seg != nullptr ? seg->bytes.load(std::memory_order_relaxed) : segment_bytes_;
        if (off + record_bytes_ > segment_bytes_) {
          if (ctx.engine->outstanding() > 0) break;  // drain before sealing
          bool self_evicting = false;
          if (first_segment != 0) {
            MutexLock l(&mu_);
            self_evicting = RollEvicts(first_segment);
          }
          if (self_evicting) {
            // Writing on would evict this batch's own head, and a prefix is useless without its
            // head: the head stays (as the Cache does for a full tier) and the tail is refused.
            stop = Status::ResourceExhausted(fmt::format(
                "batch of {} blocks ({} bytes on disk) is more than the tier holds at once ({} "
                "bytes of capacity in {}-byte segments): blocks {} to {} not stored, the head "
                "before them kept",
                keys.size(), keys.size() * record_bytes_, capacity_bytes_, segment_bytes_, next,
                keys.size() - 1));
            break;
          }
          stop = RollSegment(&removed);
          if (!stop.ok()) {
            if (log_limit_.Allow()) {
              spdlog::error("disk tier {}: {} (such errors are logged at most every {} s)",
                            options_.path, stop.ToString(), LogLimiter::kIntervalS);
            }
            break;
          }
          MutexLock l(&mu_);
          seg = active_;
          off = seg->bytes.load(std::memory_order_relaxed);
        }
        const uint32_t b = free_bufs.back();
        free_bufs.pop_back();
        std::byte* buf = ctx.buffers[b].data();
        RecordHeader h;
        h.key = keys[next];
        h.payload_bytes = options_.block_bytes;
        h.layout_fingerprint = options_.layout_fingerprint;
        h.sequence = next_seq_++;
        h.payload_checksum = next < summed ? sums[next - sums_base] : Xxh3(blocks[next]);
        EncodeRecordHeader(h, {buf, kPageBytes});
        IoRequest req{
            true, seg->fd, buf, static_cast<uint32_t>(record_bytes_), off, static_cast<int>(b), b};
        if (ZeroCopy(blocks[next].data())) {
          // The caller's page-aligned block goes to the device as it is: no bounce copy.
          ctx.iov[b][0] = {buf, kPageBytes};
          ctx.iov[b][1] = {const_cast<std::byte*>(blocks[next].data()), options_.block_bytes};
          req.iov = ctx.iov[b].data();
          req.iovcnt = 2;
        } else {
          std::memcpy(buf + kPageBytes, blocks[next].data(), options_.block_bytes);
          std::memset(buf + kPageBytes + options_.block_bytes, 0,
                      record_bytes_ - kPageBytes - options_.block_bytes);
        }
        seg->bytes.store(off + record_bytes_, std::memory_order_relaxed);
        seg->synced = false;
        pending[b] = {next, Location{seg->id, off, h.sequence, false}};
        if (first_segment == 0) first_segment = seg->id;
        ctx.engine->Queue(req);
        ++next;
      }
      if (!stop.ok()) {
        for (; next < keys.size(); ++next) results[next] = stop;
      }
      if (ctx.engine->outstanding() == 0) continue;
      // While the device writes, the next block's checksum is computed (one ahead per wait).
      ctx.engine->Submit();
      if (summed < next) {
        summed = next;
        sums_base = next;
        sums.clear();
      }
      if (summed < keys.size() && blocks[summed].size() == options_.block_bytes) {
        sums.push_back(Xxh3(blocks[summed]));
        ++summed;
      }
      done.clear();
      Status st = ctx.engine->Wait(1, &done);
      if (!st.ok()) {
        // The ring itself failed: what it holds never completes, so those blocks and the rest
        // are not stored. A ring that failed once is not trusted again (its kernel or device
        // is likely to fail the next one the same way, and a retry could hang): this context
        // and every one made from now on use pread/pwrite.
        spdlog::error("disk tier {}: {}; going on with pread/pwrite", options_.path, st.ToString());
        std::vector<bool> busy(nbuf, true);
        for (uint32_t b : free_bufs) busy[b] = false;
        for (uint32_t b = 0; b < nbuf; ++b) {
          if (busy[b]) results[pending[b].index] = Status::Unavailable(st.message());
        }
        for (; next < keys.size(); ++next) results[next] = Status::Unavailable(st.message());
        ring_failed_.store(true, std::memory_order_relaxed);
        auto fresh = MakeContext();
        if (fresh.ok()) {
          RetireContext(std::move(writer_));
          writer_ = std::move(fresh).value();
        }
        break;
      }
      MutexLock l(&mu_);
      for (const IoCompletion& c : done) {
        const Pending& p = pending[c.tag];
        if (c.result == static_cast<int64_t>(record_bytes_)) {
          Publish(keys[p.index], p.loc);
          results[p.index] = Status::Ok();
          wrote = true;
        } else {
          results[p.index] = Status::Unavailable(fmt::format(
              "segment {} offset {}: write: {}", p.loc.segment_id, p.loc.offset,
              c.result < 0 ? Errno(static_cast<int>(-c.result)) : std::string("short write")));
        }
        free_bufs.push_back(static_cast<uint32_t>(c.tag));
      }
    }
    written_seq_.store(next_seq_ - 1);
    if (wrote && options_.sync == SyncPolicy::kBatch) {
      Status st = SyncLocked();
      if (!st.ok()) spdlog::error("disk tier {}: {}", options_.path, st.ToString());
    }
  }
  if (!removed.empty() && on_removed_) on_removed_(removed);
}

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

std::vector<BlockKey> DiskStore::Keys() const {
  MutexLock l(&mu_);
  std::vector<BlockKey> keys;
  keys.reserve(index_.size());
  for (const auto& [key, loc] : index_) keys.push_back(key);
  return keys;
}

void DiskStore::Exists(std::span<const BlockKey> keys, std::span<bool> out) const {
  MutexLock l(&mu_);
  for (size_t i = 0; i < keys.size(); ++i) out[i] = index_.count(keys[i]) != 0;
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
  if (gone.empty()) return Status::Ok();
  // Tombstones, so the keys stay gone after a restart. One page each, written in one batch per
  // buffer's worth of pages.
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

Status DiskStore::SyncLocked() {
  std::vector<std::shared_ptr<Segment>> todo;
  {
    MutexLock l(&mu_);
    for (const auto& [id, seg] : segments_) {
      if (!seg->synced) todo.push_back(seg);
    }
  }
  const uint64_t upto = next_seq_ - 1;
  for (const auto& seg : todo) {
    if (::fdatasync(seg->fd) != 0) {
      return Status::Unavailable(fmt::format("{}: fdatasync: {}", seg->path, Errno(errno)));
    }
    seg->synced = true;
    syncs_.fetch_add(1, std::memory_order_relaxed);
  }
  durable_seq_.store(upto);
  return Status::Ok();
}

Status DiskStore::Sync() {
  MutexLock w(&write_mu_);
  return SyncLocked();
}

void DiskStore::SyncLoop() {
  std::unique_lock<std::mutex> l(sync_mu_);
  while (!stop_) {
    sync_cv_.wait_for(l, std::chrono::milliseconds(options_.sync_interval_ms));
    if (stop_) break;
    l.unlock();
    if (durable_seq_.load() < written_seq_.load()) {
      Status st = Sync();
      if (!st.ok()) spdlog::error("disk tier {}: {}", options_.path, st.ToString());
    }
    l.lock();
  }
}

bool DiskStore::IsDurable(const BlockKey& key) const {
  MutexLock l(&mu_);
  auto it = index_.find(key);
  return it != index_.end() && it->second.seq <= durable_seq_.load();
}

uint64_t DiskStore::used_bytes() const {
  MutexLock l(&mu_);
  return sealed_bytes_ + (active_ ? active_->bytes.load(std::memory_order_relaxed) : 0);
}

DiskStats DiskStore::stats() const {
  DiskStats s;
  s.io_backend = io_name_;
  s.registered_buffers = io_registered_;
  s.direct_io = direct_;
  s.notes = notes_;
  if (ring_failed_.load(std::memory_order_relaxed)) {
    s.io_backend = std::string(IoBackendName(IoBackend::kSync));
    s.registered_buffers = false;
    s.notes += std::string(s.notes.empty() ? "" : "; ") +
               "an io_uring ring failed: new I/O contexts use pread/pwrite";
  }
  s.queue_depth = options_.queue_depth;
  s.capacity_bytes = capacity_bytes_;
  s.space_evictions = space_evictions_.load(std::memory_order_relaxed);
  s.segment_bytes = segment_bytes_;
  {
    MutexLock l(&mu_);
    s.used_bytes = sealed_bytes_ + (active_ ? active_->bytes.load(std::memory_order_relaxed) : 0);
    s.segments = segments_.size();
    s.live_blocks = index_.size();
    for (const auto& [id, seg] : segments_) s.live_bytes += seg->live_bytes;
  }
  s.dead_bytes = s.used_bytes - std::min(s.used_bytes, s.live_bytes + s.segments * kPageBytes);
  s.written_seq = written_seq_.load();
  s.durable_seq = durable_seq_.load();
  s.syncs = syncs_.load();
  s.corruptions = corruptions_.load();
  s.recovered_blocks = recovered_.load();
  s.evicted_segments = evicted_segments_.load();
  s.evicted_blocks = evicted_blocks_.load();
  s.reinserted_blocks = reinserted_.load();
  return s;
}

}  // namespace kvtier::disk
