// DiskStore's opening: the process limits it needs, the directory lock, and the index rebuilt
// from the segment files' record headers (recovery after a crash included).
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

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "tiers/disk/disk_segment.h"
#include "tiers/disk/disk_store.h"
#include "tiers/disk/format.h"
#include "tiers/disk/segment_scan.h"

namespace kvtier::disk {

namespace {

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

// Segment file ids in dir, oldest first. Names that only look like segment files are logged.
std::vector<uint64_t> ListSegmentIds(const std::string& dir) {
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
  return ids;
}

// OK, or InvalidArgument when the scanned segment at path is of a future format version or a
// foreign layout.
Status CheckSegmentHeader(const SegmentScan& scan, const std::string& path,
                          const DiskOptions& options) {
  if (!scan.header && scan.header_error == ParseError::kFutureVersion) {
    return Status::InvalidArgument(fmt::format(
        "{}: segment format version {} is newer than this build reads ({}); refusing to open "
        "it rather than misread it (use a newer kvtier or another directory)",
        path, scan.header_version, kFormatVersion));
  }
  if (scan.header && scan.header->layout_fingerprint != options.layout_fingerprint) {
    return Status::InvalidArgument(fmt::format(
        "{}: segment written for layout fingerprint {:016x} ({} bytes per block), this tier's "
        "layout is {:016x} ({} bytes per block); refusing to mix layouts (use another "
        "directory)",
        path, scan.header->layout_fingerprint, scan.header->block_bytes, options.layout_fingerprint,
        options.block_bytes));
  }
  return Status::Ok();
}

// Whether the scan ends in a torn tail: the newest segment of a process that crashed.
bool EndsTorn(const SegmentScan& scan, uint64_t file_bytes) {
  return scan.header && !scan.issues.empty() &&
         scan.issues.back().kind == ScanIssue::Kind::kTornTail &&
         scan.issues.back().offset + scan.issues.back().length == file_bytes;
}

// A segment the last process did not seal (it crashed): its unwritten end goes, and the
// records that may have been in flight at the crash (the last `window`) have their payloads
// checked now, so a torn one is dropped as torn rather than served later as Corruption. Torn
// records are marked RecordType{0}; returns the bytes kept (file_bytes if the trim failed).
uint64_t TrimCrashedTail(int fd, size_t window, const std::string& dir, const std::string& path,
                         uint64_t file_bytes, SegmentScan* scan) {
  uint64_t trim = scan->issues.back().offset;
  window = std::min<size_t>(scan->records.size(), window);
  std::vector<std::byte> payload;
  const ReadAtFn read = PreadReader(fd);
  for (size_t i = scan->records.size() - window; i < scan->records.size(); ++i) {
    const ScannedRecord& r = scan->records[i];
    if (r.header.type != RecordType::kPut) continue;
    payload.resize(r.header.payload_bytes);
    if (read(r.offset + kPageBytes, payload) == static_cast<int64_t>(payload.size()) &&
        Xxh3(payload) == r.header.payload_checksum) {
      continue;
    }
    spdlog::info("disk tier {}: {} offset {}: record cut by the crash (torn), skipped", dir, path,
                 r.offset);
    scan->records[i].header.type = RecordType{0};  // skipped below
  }
  while (!scan->records.empty() && scan->records.back().header.type == RecordType{0}) {
    trim = scan->records.back().offset;
    scan->records.pop_back();
  }
  return ::ftruncate(fd, static_cast<off_t>(trim)) == 0 ? trim : file_bytes;
}

// A configured path that cannot be a directory here is the configuration's fault, not ours.
Status DirectoryError(const std::string& dir, const char* what, int err) {
  std::string msg = fmt::format("{}: {}: {}", dir, what, Errno(err));
  const bool users = err == EACCES || err == ENOENT || err == ENOTDIR || err == EROFS ||
                     err == EPERM || err == ENAMETOOLONG || err == ELOOP;
  return users ? Status::InvalidArgument(std::move(msg)) : Status::Internal(std::move(msg));
}

}  // namespace

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
Status DiskStore::OpenDirectory(std::vector<BlockKey>* removed) {
  // Nothing else runs yet; the lock is for the thread-safety analysis and the lock order.
  MutexLock w(&write_mu_);
  const std::string& dir = options_.path;
  KVTIER_RETURN_IF_ERROR(LockDirectory());
  const std::vector<uint64_t> ids = ListSegmentIds(dir);

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
    KVTIER_RETURN_IF_ERROR(RecoverSegment(id, id == ids.back(), &max_seq, &recovered_issues));
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

  ClampCapacityToFilesystem(/*at_open=*/true);
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

Status DiskStore::LockDirectory() {
  const std::string& dir = options_.path;
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return DirectoryError(dir, "mkdir", errno);
  }
  dir_fd_ = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd_ < 0) return DirectoryError(dir, "open", errno);
  // The directory itself is locked: a lock file can be unlinked from under its holder, and
  // the next process would lock a new file and write into the same segments.
  if (::flock(dir_fd_, LOCK_EX | LOCK_NB) != 0) {
    return Status::Unavailable(
        fmt::format("{}: the directory is in use by another disk tier ({})", dir, Errno(errno)));
  }
  return Status::Ok();
}

Status DiskStore::RecoverSegment(uint64_t id, bool newest, uint64_t* max_seq,
                                 uint64_t* recovered_issues) {
  auto seg = std::make_shared<Segment>();
  seg->id = id;
  seg->path = options_.path + "/" + SegmentFileName(id);
  const int scan_fd = ::open(seg->path.c_str(), O_RDWR | O_CLOEXEC);
  if (scan_fd < 0) return Status::Internal(fmt::format("{}: open: {}", seg->path, Errno(errno)));
  struct stat st {};
  ::fstat(scan_fd, &st);
  const uint64_t file_bytes = static_cast<uint64_t>(st.st_size);
  SegmentScan scan = ScanSegment(PreadReader(scan_fd), file_bytes, options_.layout_fingerprint);
  if (Status header = CheckSegmentHeader(scan, seg->path, options_); !header.ok()) {
    ::close(scan_fd);
    return header;
  }
  uint64_t kept_bytes = file_bytes;
  // Only the newest segment was being written when a process died: a tail that does not
  // parse anywhere else is damage to sealed data, reported and kept, never cut off.
  if (newest && EndsTorn(scan, file_bytes)) {
    // At most one writer's buffers were in flight at the crash.
    const size_t window = std::max<size_t>(writer_->buffers.size(), 32);
    kept_bytes = TrimCrashedTail(scan_fd, window, options_.path, seg->path, file_bytes, &scan);
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
    return Status::Ok();
  }
  *recovered_issues += ReportScanIssues(scan, newest, seg->path);
  int flags = O_RDONLY | O_CLOEXEC | (direct_ ? O_DIRECT : 0);
  seg->fd = ::open(seg->path.c_str(), flags);
  if (seg->fd < 0 && errno == EINVAL && direct_) {
    direct_ = false;
    seg->fd = ::open(seg->path.c_str(), O_RDONLY | O_CLOEXEC);
  }
  if (seg->fd < 0) return Status::Internal(fmt::format("{}: open: {}", seg->path, Errno(errno)));
  seg->bytes.store(AlignUp(kept_bytes), std::memory_order_relaxed);
  *recovered_issues += IndexScannedRecords(seg, scan, max_seq);
  next_segment_id_ = id + 1;
  return Status::Ok();
}

uint64_t DiskStore::ReportScanIssues(const SegmentScan& scan, bool newest,
                                     const std::string& path) {
  const std::string& dir = options_.path;
  uint64_t issues = 0;
  if (!scan.header) {
    ++issues;
    corruptions_.fetch_add(1, std::memory_order_relaxed);
    spdlog::warn(
        "disk tier {}: Corruption: {} offset 0: segment header: {}; reading its "
        "records by their own headers",
        dir, path, ParseErrorName(scan.header_error));
  }
  for (const ScanIssue& issue : scan.issues) {
    if (issue.is_corruption() || (!newest && issue.kind == ScanIssue::Kind::kTornTail)) {
      ++issues;
      corruptions_.fetch_add(1, std::memory_order_relaxed);
      spdlog::warn("disk tier {}: Corruption: {} offset {}: {}", dir, path, issue.offset,
                   issue.is_corruption()
                       ? issue.message
                       : fmt::format("the last {} bytes of a sealed segment do not parse; kept",
                                     issue.length));
    } else {
      spdlog::info("disk tier {}: {} offset {}: {}", dir, path, issue.offset, issue.message);
    }
  }
  return issues;
}

uint64_t DiskStore::IndexScannedRecords(const std::shared_ptr<Segment>& seg,
                                        const SegmentScan& scan, uint64_t* max_seq) {
  uint64_t issues = 0;
  MutexLock l(&mu_);
  segments_[seg->id] = seg;
  sealed_bytes_ += seg->bytes.load(std::memory_order_relaxed);
  // Records in file order, segments in id order: that is sequence order, so later wins.
  for (const ScannedRecord& r : scan.records) {
    *max_seq = std::max(*max_seq, r.header.sequence);
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
      ++issues;
      spdlog::warn(
          "disk tier {}: {} offset {}: record of {} bytes, the tier's blocks are {}; "
          "skipped",
          options_.path, seg->path, r.offset, r.header.payload_bytes, options_.block_bytes);
      continue;
    }
    Publish(r.header.key, Location{seg->id, r.offset, r.header.sequence, false});
  }
  return issues;
}

void DiskStore::ClampCapacityToFilesystem(bool at_open) {
  // The tier's room is what its segments use plus the free space. A roll makes the new segment
  // whole before it evicts (RollSegment), so the capacity is that room less one segment: then
  // no roll meets ENOSPC. The floor is two segments; when fewer than three fit at open, the
  // segments shrink instead (a 20 MiB filesystem under 16 MiB segments froze the tier: the
  // second segment never fit and nothing could be evicted for it).
  struct statvfs fs {};
  if (::fstatvfs(dir_fd_, &fs) != 0) return;
  uint64_t used = 0;
  {
    MutexLock l(&mu_);
    used = sealed_bytes_ + (active_ ? active_->bytes.load(std::memory_order_relaxed) : 0);
  }
  const uint64_t room = (used + uint64_t{fs.f_bavail} * fs.f_frsize) / kPageBytes * kPageBytes;
  const uint64_t seg_before = segment_bytes_;
  if (at_open && room < 3 * segment_bytes_) {
    segment_bytes_ = std::max(room / 3 / kPageBytes * kPageBytes, kPageBytes + record_bytes_);
  }
  const uint64_t fits = room > segment_bytes_ ? room - segment_bytes_ : 0;
  const uint64_t cap = std::clamp(fits, 2 * segment_bytes_, options_.capacity_bytes);
  const uint64_t before = capacity_bytes_.exchange(cap);
  if (cap == before && segment_bytes_ == seg_before) return;
  if (!at_open && !space_log_.Allow()) return;
  spdlog::warn(
      "disk tier {}: the filesystem holds {} bytes for the tier (its segments and the free "
      "space): capacity {} of the configured {}, in segments of {} bytes{}",
      options_.path, room, cap, options_.capacity_bytes, segment_bytes_,
      at_open ? "" : " (capacity changes are said at most every 10 s)");
}

}  // namespace kvtier::disk
