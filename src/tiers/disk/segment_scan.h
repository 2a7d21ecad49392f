// Scanning a segment file's header pages: the index rebuild at open, `kvtier disk inspect`,
// `kvtier disk verify` and the record fuzzer all go through here.
//
// The scan reads the segment header, then walks record headers from offset 4096: a valid header
// gives the next record's offset; a page that does not parse starts a resync that looks at each
// following 4 KiB page for the next valid header, so one corrupt record never hides the rest of
// the segment. Bytes that do not parse up to the end of the file are a torn tail (an
// unacknowledged write cut by a crash), reported separately from corruption.
//
// Thread-safety: pure functions; `read` must be safe to call from the calling thread.
#ifndef KVTIER_TIERS_DISK_SEGMENT_SCAN_H_
#define KVTIER_TIERS_DISK_SEGMENT_SCAN_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "tiers/disk/format.h"

namespace kvtier::disk {

// Reads up to buf.size() bytes at offset; returns the bytes read (short only at end of file)
// or -errno.
using ReadAtFn = std::function<int64_t(uint64_t offset, std::span<std::byte> buf)>;

// A ReadAtFn over a file descriptor (pread, retried on EINTR). The fd must outlive it.
ReadAtFn PreadReader(int fd);

struct ScannedRecord {
  uint64_t offset = 0;  // of the header page
  RecordHeader header;
};

struct ScanIssue {
  enum class Kind : uint8_t {
    kCorruptHeader,  // bytes that do not parse, followed by a valid record
    kForeignLayout,  // a valid record of another layout fingerprint (skipped)
    kFutureVersion,  // a record of a newer format version (skipped, not guessed at)
    kTornTail,       // bytes that do not parse up to the end of the file
    kIoError,        // a read failed; the scan stopped here
  };
  Kind kind = Kind::kCorruptHeader;
  uint64_t offset = 0;
  uint64_t length = 0;
  std::string message;
  // Whether this issue means stored data is bad (a torn tail is not: it was never acknowledged).
  bool is_corruption() const { return kind != Kind::kTornTail; }
};
std::string_view ScanIssueKindName(ScanIssue::Kind kind);

struct SegmentScan {
  uint64_t file_bytes = 0;
  std::optional<SegmentHeader> header;  // nullopt: the header page did not parse
  ParseError header_error = ParseError::kNotAHeader;
  uint32_t header_version = 0;         // the version field seen (for refusal messages)
  std::vector<ScannedRecord> records;  // in file order
  std::vector<ScanIssue> issues;       // in file order
};

// Scans one segment of file_bytes bytes. Records whose layout fingerprint differs from
// `fingerprint` are skipped as kForeignLayout; std::nullopt accepts every fingerprint.
SegmentScan ScanSegment(const ReadAtFn& read, uint64_t file_bytes,
                        std::optional<uint64_t> fingerprint);

}  // namespace kvtier::disk

#endif  // KVTIER_TIERS_DISK_SEGMENT_SCAN_H_
