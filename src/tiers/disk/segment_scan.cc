#include "tiers/disk/segment_scan.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
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

SegmentScan ScanSegment(const ReadAtFn& read, uint64_t file_bytes,
                        std::optional<uint64_t> fingerprint) {
  SegmentScan scan;
  scan.file_bytes = file_bytes;
  std::vector<std::byte> page(kPageBytes);

  // While resyncing, pages are read 64 at a time (a preallocated segment cut by a crash ends in
  // many zero pages); otherwise one header page per record.
  constexpr uint64_t kChunkPages = 64;
  std::vector<std::byte> chunk;
  uint64_t chunk_off = 0, chunk_len = 0;
  bool resync = false;
  auto read_page = [&](uint64_t off) -> int64_t {
    if (resync) {
      if (off < chunk_off || off + kPageBytes > chunk_off + chunk_len) {
        chunk.resize(kChunkPages * kPageBytes);
        const int64_t n = read(off, chunk);
        if (n < 0) return n;
        chunk_off = off;
        chunk_len = static_cast<uint64_t>(n);
        if (chunk_len < kPageBytes) {
          std::memset(chunk.data() + chunk_len, 0, kPageBytes - chunk_len);
          chunk_len = kPageBytes;
        }
      }
      std::memcpy(page.data(), chunk.data() + (off - chunk_off), kPageBytes);
      return static_cast<int64_t>(kPageBytes);
    }
    const int64_t n = read(off, page);
    if (n >= 0 && static_cast<uint64_t>(n) < kPageBytes) {
      std::memset(page.data() + n, 0, kPageBytes - static_cast<uint64_t>(n));
    }
    return n;
  };

  if (file_bytes < kPageBytes) {
    if (file_bytes > 0) {
      scan.issues.push_back({ScanIssue::Kind::kTornTail, 0, file_bytes,
                             "segment header incomplete (torn at creation)"});
    }
    return scan;
  }
  if (const int64_t n = read_page(0); n < 0) {
    scan.issues.push_back({ScanIssue::Kind::kIoError, 0, kPageBytes,
                           fmt::format("reading the segment header: {}", std::strerror(-n))});
    return scan;
  }
  scan.header = ParseSegmentHeader(page, &scan.header_error, &scan.header_version);
  if (!scan.header && scan.header_error == ParseError::kFutureVersion) return scan;

  // A run of pages that did not parse, reported when the next valid header (or EOF) is found.
  uint64_t bad_start = 0, bad_len = 0;
  ParseError bad_error = ParseError::kNotAHeader;
  auto flush_bad = [&](bool at_eof) {
    if (bad_len == 0) return;
    if (at_eof) {
      scan.issues.push_back(
          {ScanIssue::Kind::kTornTail, bad_start, bad_len,
           fmt::format("{} bytes after the last record do not parse (torn tail)", bad_len)});
    } else {
      scan.issues.push_back({ScanIssue::Kind::kCorruptHeader, bad_start, bad_len,
                             fmt::format("{}; skipped {} bytes to the next record",
                                         ParseErrorName(bad_error), bad_len)});
    }
    bad_len = 0;
  };

  uint64_t off = kPageBytes;
  while (off + kPageBytes <= file_bytes) {
    if (const int64_t n = read_page(off); n < 0) {
      flush_bad(false);
      scan.issues.push_back({ScanIssue::Kind::kIoError, off, kPageBytes,
                             fmt::format("read failed: {}", std::strerror(-n))});
      return scan;
    }
    ParseError err = ParseError::kNotAHeader;
    uint32_t version = 0;
    std::optional<RecordHeader> h = ParseRecordHeader(page, &err, &version);
    if (!h) {
      resync = true;
      if (bad_len == 0) {
        bad_start = off;
        bad_error = err;
      }
      if (err == ParseError::kFutureVersion && bad_len == 0) {
        // Its length field cannot be trusted either; resync like a corrupt header.
        scan.issues.push_back({ScanIssue::Kind::kFutureVersion, off, kPageBytes,
                               fmt::format("record of format version {} (this build reads {})",
                                           version, kFormatVersion)});
        off += kPageBytes;
        continue;
      }
      bad_len += kPageBytes;
      off += kPageBytes;
      continue;
    }
    const uint64_t len = h->record_bytes();
    // A checksummed header can still carry a length no record of this segment has (a bit flip
    // before the checksum was taken, a bug): its length is not followed, the next pages are
    // searched, so the records behind it are not lost. Past the end of the file it may also be
    // a write cut by a crash: when nothing valid follows, the run is a torn tail.
    const bool wrong_size =
        (h->type == RecordType::kTombstone && h->payload_bytes != 0) ||
        (h->type == RecordType::kPut && scan.header && scan.header->block_bytes != 0 &&
         h->payload_bytes != scan.header->block_bytes);
    if (off + len > file_bytes || wrong_size) {
      resync = true;
      if (bad_len == 0) {
        bad_start = off;
        bad_error = ParseError::kMalformed;
      }
      bad_len += kPageBytes;
      off += kPageBytes;
      continue;
    }
    resync = false;
    flush_bad(false);
    if (fingerprint && h->layout_fingerprint != *fingerprint) {
      scan.issues.push_back({ScanIssue::Kind::kForeignLayout, off, len,
                             fmt::format("record of layout fingerprint {:016x}, expected {:016x}",
                                         h->layout_fingerprint, *fingerprint)});
    } else {
      scan.records.push_back({off, *h});
    }
    off += len;
  }
  if (off < file_bytes) {
    // A partial page at the end of the file.
    if (bad_len == 0) bad_start = off;
    bad_len += file_bytes - off;
  }
  flush_bad(true);
  return scan;
}

}  // namespace kvtier::disk
