#include "tiers/disk/segment_scan.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

namespace kvtier::disk {

std::string_view ScanIssueKindName(ScanIssue::Kind kind) {
  switch (kind) {
    case ScanIssue::Kind::kCorruptHeader:
      return "corrupt";
    case ScanIssue::Kind::kForeignLayout:
      return "foreign-layout";
    case ScanIssue::Kind::kFutureVersion:
      return "future-version";
    case ScanIssue::Kind::kTornTail:
      return "torn-tail";
    case ScanIssue::Kind::kIoError:
      return "io-error";
  }
  return "unknown";
}

ReadAtFn PreadReader(int fd) {
  return [fd](uint64_t off, std::span<std::byte> buf) -> int64_t {
    uint64_t done = 0;
    while (done < buf.size()) {
      const ssize_t n =
          ::pread(fd, buf.data() + done, buf.size() - done, static_cast<off_t>(off + done));
      if (n < 0) {
        if (errno == EINTR) continue;
        return -errno;
      }
      if (n == 0) break;
      done += static_cast<uint64_t>(n);
    }
    return static_cast<int64_t>(done);
  };
}

namespace {

// One scan of one segment: the segment header, then record headers in file order, resyncing
// page by page after a page that does not parse; records and issues go into a SegmentScan.
class Scanner {
 public:
  Scanner(const ReadAtFn& read, uint64_t file_bytes, std::optional<uint64_t> fingerprint)
      : read_(read), fingerprint_(fingerprint), page_(kPageBytes) {
    scan_.file_bytes = file_bytes;
  }

  SegmentScan Run();

 private:
  // Reads the page at off into page_ (zero-filled past the end of the file); the bytes read or
  // -errno.
  int64_t ReadPage(uint64_t off);
  // The same while resyncing, through a chunk of kChunkPages pages.
  int64_t ReadChunkedPage(uint64_t off);
  // Parses the segment header; false when there is nothing more to scan.
  bool ScanSegmentHeader();
  // Scans the record header at off; the offset to scan next, or nullopt when a read failed.
  std::optional<uint64_t> ScanRecord(uint64_t off);
  // Adds the page at off to the run of pages that do not parse.
  void MarkBad(uint64_t off, ParseError err);
  // Reports the run of pages that did not parse, if any: a torn tail at the end of the file,
  // corruption before a valid record.
  void FlushBad(bool at_eof);

  const ReadAtFn& read_;
  const std::optional<uint64_t> fingerprint_;
  SegmentScan scan_;
  std::vector<std::byte> page_;

  // While resyncing, pages are read 64 at a time (a preallocated segment cut by a crash ends in
  // many zero pages); otherwise one header page per record.
  static constexpr uint64_t kChunkPages = 64;
  std::vector<std::byte> chunk_;
  uint64_t chunk_off_ = 0, chunk_len_ = 0;
  bool resync_ = false;

  // A run of pages that did not parse, reported when the next valid header (or EOF) is found.
  uint64_t bad_start_ = 0, bad_len_ = 0;
  ParseError bad_error_ = ParseError::kNotAHeader;
};

SegmentScan Scanner::Run() {
  if (!ScanSegmentHeader()) return std::move(scan_);
  const uint64_t file_bytes = scan_.file_bytes;
  uint64_t off = kPageBytes;
  while (off + kPageBytes <= file_bytes) {
    const std::optional<uint64_t> next = ScanRecord(off);
    if (!next) return std::move(scan_);
    off = *next;
  }
  if (off < file_bytes) {
    // A partial page at the end of the file.
    if (bad_len_ == 0) bad_start_ = off;
    bad_len_ += file_bytes - off;
  }
  FlushBad(true);
  return std::move(scan_);
}

int64_t Scanner::ReadPage(uint64_t off) {
  if (resync_) return ReadChunkedPage(off);
  const int64_t n = read_(off, page_);
  if (n >= 0 && static_cast<uint64_t>(n) < kPageBytes) {
    std::memset(page_.data() + n, 0, kPageBytes - static_cast<uint64_t>(n));
  }
  return n;
}

int64_t Scanner::ReadChunkedPage(uint64_t off) {
  if (off < chunk_off_ || off + kPageBytes > chunk_off_ + chunk_len_) {
    chunk_.resize(kChunkPages * kPageBytes);
    const int64_t n = read_(off, chunk_);
    if (n < 0) return n;
    chunk_off_ = off;
    chunk_len_ = static_cast<uint64_t>(n);
    if (chunk_len_ < kPageBytes) {
      std::memset(chunk_.data() + chunk_len_, 0, kPageBytes - chunk_len_);
      chunk_len_ = kPageBytes;
    }
  }
  std::memcpy(page_.data(), chunk_.data() + (off - chunk_off_), kPageBytes);
  return static_cast<int64_t>(kPageBytes);
}

bool Scanner::ScanSegmentHeader() {
  const uint64_t file_bytes = scan_.file_bytes;
  if (file_bytes < kPageBytes) {
    if (file_bytes > 0) {
      scan_.issues.push_back({ScanIssue::Kind::kTornTail, 0, file_bytes,
                              "segment header incomplete (torn at creation)"});
    }
    return false;
  }
  if (const int64_t n = ReadPage(0); n < 0) {
    scan_.issues.push_back({ScanIssue::Kind::kIoError, 0, kPageBytes,
                            fmt::format("reading the segment header: {}", std::strerror(-n))});
    return false;
  }
  scan_.header = ParseSegmentHeader(page_, &scan_.header_error, &scan_.header_version);
  return scan_.header || scan_.header_error != ParseError::kFutureVersion;
}

std::optional<uint64_t> Scanner::ScanRecord(uint64_t off) {
  if (const int64_t n = ReadPage(off); n < 0) {
    FlushBad(false);
    scan_.issues.push_back({ScanIssue::Kind::kIoError, off, kPageBytes,
                            fmt::format("read failed: {}", std::strerror(-n))});
    return std::nullopt;
  }
  ParseError err = ParseError::kNotAHeader;
  uint32_t version = 0;
  std::optional<RecordHeader> h = ParseRecordHeader(page_, &err, &version);
  if (!h) {
    resync_ = true;
    if (err == ParseError::kFutureVersion && bad_len_ == 0) {
      // Its length field cannot be trusted either; resync like a corrupt header.
      scan_.issues.push_back({ScanIssue::Kind::kFutureVersion, off, kPageBytes,
                              fmt::format("record of format version {} (this build reads {})",
                                          version, kFormatVersion)});
      return off + kPageBytes;
    }
    MarkBad(off, err);
    return off + kPageBytes;
  }
  const uint64_t len = h->record_bytes();
  // A checksummed header can still carry a length no record of this segment has (a bit flip
  // before the checksum was taken, a bug): its length is not followed, the next pages are
  // searched, so the records behind it are not lost. Past the end of the file it may also be
  // a write cut by a crash: when nothing valid follows, the run is a torn tail.
  const bool wrong_size =
      (h->type == RecordType::kTombstone && h->payload_bytes != 0) ||
      (h->type == RecordType::kPut && scan_.header && scan_.header->block_bytes != 0 &&
       h->payload_bytes != scan_.header->block_bytes);
  if (off + len > scan_.file_bytes || wrong_size) {
    resync_ = true;
    MarkBad(off, ParseError::kMalformed);
    return off + kPageBytes;
  }
  resync_ = false;
  FlushBad(false);
  if (fingerprint_ && h->layout_fingerprint != *fingerprint_) {
    scan_.issues.push_back({ScanIssue::Kind::kForeignLayout, off, len,
                            fmt::format("record of layout fingerprint {:016x}, expected {:016x}",
                                        h->layout_fingerprint, *fingerprint_)});
  } else {
    scan_.records.push_back({off, *h});
  }
  return off + len;
}

void Scanner::MarkBad(uint64_t off, ParseError err) {
  if (bad_len_ == 0) {
    bad_start_ = off;
    bad_error_ = err;
  }
  bad_len_ += kPageBytes;
}

void Scanner::FlushBad(bool at_eof) {
  if (bad_len_ == 0) return;
  if (at_eof) {
    scan_.issues.push_back(
        {ScanIssue::Kind::kTornTail, bad_start_, bad_len_,
         fmt::format("{} bytes after the last record do not parse (torn tail)", bad_len_)});
  } else {
    scan_.issues.push_back({ScanIssue::Kind::kCorruptHeader, bad_start_, bad_len_,
                            fmt::format("{}; skipped {} bytes to the next record",
                                        ParseErrorName(bad_error_), bad_len_)});
  }
  bad_len_ = 0;
}

}  // namespace

SegmentScan ScanSegment(const ReadAtFn& read, uint64_t file_bytes,
                        std::optional<uint64_t> fingerprint) {
  return Scanner(read, file_bytes, fingerprint).Run();
}

}  // namespace kvtier::disk
