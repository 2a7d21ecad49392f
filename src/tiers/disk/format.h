// The on-disk format of the disk tier: segment and record headers (see doc/disk_format.md).
//
// A tier directory holds append-only segment files seg-<id:08>.kvs. Each starts with one 4 KiB
// segment header page; records follow at 4 KiB-aligned offsets, each a 4 KiB header page and
// then the payload padded to 4 KiB, so every read and write is O_DIRECT-aligned and an index
// rebuild reads only header pages. All integers are little-endian; checksums are XXH3-64 (the
// same function as kvtier::Checksum64).
//
// Thread-safety: pure functions over values.
#ifndef KVTIER_TIERS_DISK_FORMAT_H_
#define KVTIER_TIERS_DISK_FORMAT_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "kvtier/block_key.h"
#include "kvtier/status.h"

namespace kvtier::disk {

inline constexpr uint32_t kFormatVersion = 1;
inline constexpr uint64_t kPageBytes = 4096;  // alignment of every O_DIRECT offset and length
inline constexpr uint64_t kSegmentMagic = 0x475352454954564bULL;  // "KVTIERSG" little-endian
inline constexpr uint64_t kRecordMagic = 0x435252454954564bULL;   // "KVTIERRC" little-endian

inline uint64_t AlignUp(uint64_t n, uint64_t a = kPageBytes) { return (n + a - 1) / a * a; }

// XXH3-64 of bytes (inlined for speed; identical to kvtier::Checksum64).
uint64_t Xxh3(std::span<const std::byte> bytes);

struct SegmentHeader {
  uint32_t format_version = kFormatVersion;
  uint64_t segment_id = 0;
  uint64_t layout_fingerprint = 0;
  uint64_t block_bytes = 0;    // payload bytes of the tier's blocks (informative)
  uint64_t segment_bytes = 0;  // the size the writer meant to fill
  uint64_t created_unix_ns = 0;
};

enum class RecordType : uint16_t { kPut = 1, kTombstone = 2 };

struct RecordHeader {
  uint32_t format_version = kFormatVersion;
  RecordType type = RecordType::kPut;
  BlockKey key;
  uint64_t payload_bytes = 0;
  uint64_t layout_fingerprint = 0;
  uint64_t sequence = 0;          // global write order across segments: later wins
  uint64_t payload_checksum = 0;  // XXH3-64 of the payload (0 for a tombstone)

  // Bytes the record occupies on disk: the header page plus the padded payload.
  uint64_t record_bytes() const { return kPageBytes + AlignUp(payload_bytes); }
};

// Why a page did not parse as a header.
enum class ParseError : uint8_t {
  kNotAHeader,     // wrong magic (zeros, payload bytes, torn write)
  kBadChecksum,    // right magic, header checksum mismatch: corrupt
  kFutureVersion,  // written by a newer format version: refuse, do not guess
  kMalformed,      // fields out of range although the checksum matched
};
std::string_view ParseErrorName(ParseError e);

// Writes a header into page (kPageBytes long; bytes after the header are zeroed).
void EncodeSegmentHeader(const SegmentHeader& h, std::span<std::byte> page);
void EncodeRecordHeader(const RecordHeader& h, std::span<std::byte> page);

// Parses a header from the first bytes of page (at least kPageBytes). On failure returns
// nullopt and sets *error (and *version to the version field it saw, for messages).
std::optional<SegmentHeader> ParseSegmentHeader(std::span<const std::byte> page, ParseError* error,
                                                uint32_t* version = nullptr);
std::optional<RecordHeader> ParseRecordHeader(std::span<const std::byte> page, ParseError* error,
                                              uint32_t* version = nullptr);

// "seg-00000042.kvs"; ParseSegmentFileName returns the id or nullopt for other names.
std::string SegmentFileName(uint64_t id);
std::optional<uint64_t> ParseSegmentFileName(std::string_view name);

}  // namespace kvtier::disk

#endif  // KVTIER_TIERS_DISK_FORMAT_H_
