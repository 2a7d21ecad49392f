#include "tiers/disk/format.h"

#include <bit>
#include <cstdio>
#include <cstring>

#include "hash/xxh3_wide.h"

namespace kvtier::disk {
namespace {

static_assert(std::endian::native == std::endian::little, "the disk format is little-endian");

// Field offsets of the segment header page.
constexpr size_t kSegMagic = 0, kSegVersion = 8, kSegHeaderBytes = 12, kSegId = 16,
                 kSegFingerprint = 24, kSegBlockBytes = 32, kSegSegmentBytes = 40, kSegCreated = 48,
                 kSegChecksum = 56;
// Field offsets of the record header page.
constexpr size_t kRecMagic = 0, kRecVersion = 8, kRecType = 10, kRecHeaderBytes = 12,
                 kRecKeyHi = 16, kRecKeyLo = 24, kRecPayloadBytes = 32, kRecFingerprint = 40,
                 kRecSequence = 48, kRecPayloadChecksum = 56, kRecChecksum = 64;
constexpr uint64_t kMaxPayloadBytes = uint64_t{1} << 40;

template <typename T>
void Put(std::span<std::byte> page, size_t off, T v) {
  std::memcpy(page.data() + off, &v, sizeof(T));
}
template <typename T>
T Get(std::span<const std::byte> page, size_t off) {
  T v;
  std::memcpy(&v, page.data() + off, sizeof(T));
  return v;
}

}  // namespace

uint64_t Xxh3(std::span<const std::byte> bytes) { return WideXxh3(bytes.data(), bytes.size()); }

std::string_view ParseErrorName(ParseError e) {
  switch (e) {
    case ParseError::kNotAHeader:
      return "not a header";
    case ParseError::kBadChecksum:
      return "header checksum mismatch";
    case ParseError::kFutureVersion:
      return "future format version";
    case ParseError::kMalformed:
      return "malformed header";
  }
  return "unknown";
}

void EncodeSegmentHeader(const SegmentHeader& h, std::span<std::byte> page) {
  std::memset(page.data(), 0, kPageBytes);
  Put<uint64_t>(page, kSegMagic, kSegmentMagic);
  Put<uint32_t>(page, kSegVersion, h.format_version);
  Put<uint32_t>(page, kSegHeaderBytes, static_cast<uint32_t>(kPageBytes));
  Put<uint64_t>(page, kSegId, h.segment_id);
  Put<uint64_t>(page, kSegFingerprint, h.layout_fingerprint);
  Put<uint64_t>(page, kSegBlockBytes, h.block_bytes);
  Put<uint64_t>(page, kSegSegmentBytes, h.segment_bytes);
  Put<uint64_t>(page, kSegCreated, h.created_unix_ns);
  Put<uint64_t>(page, kSegChecksum, Xxh3(page.first(kSegChecksum)));
}

std::optional<SegmentHeader> ParseSegmentHeader(std::span<const std::byte> page, ParseError* error,
                                                uint32_t* version) {
  if (page.size() < kPageBytes || Get<uint64_t>(page, kSegMagic) != kSegmentMagic) {
    *error = ParseError::kNotAHeader;
    return std::nullopt;
  }
  const uint32_t v = Get<uint32_t>(page, kSegVersion);
  if (version) *version = v;
  // A newer version may move fields (the checksum too), so the version is checked first.
  if (v > kFormatVersion) {
    *error = ParseError::kFutureVersion;
    return std::nullopt;
  }
  if (Get<uint64_t>(page, kSegChecksum) != Xxh3(page.first(kSegChecksum))) {
    *error = ParseError::kBadChecksum;
    return std::nullopt;
  }
  if (v == 0 || Get<uint32_t>(page, kSegHeaderBytes) != kPageBytes) {
    *error = ParseError::kMalformed;
    return std::nullopt;
  }
  SegmentHeader h;
  h.format_version = v;
  h.segment_id = Get<uint64_t>(page, kSegId);
  h.layout_fingerprint = Get<uint64_t>(page, kSegFingerprint);
  h.block_bytes = Get<uint64_t>(page, kSegBlockBytes);
  h.segment_bytes = Get<uint64_t>(page, kSegSegmentBytes);
  h.created_unix_ns = Get<uint64_t>(page, kSegCreated);
  return h;
}

void EncodeRecordHeader(const RecordHeader& h, std::span<std::byte> page) {
  std::memset(page.data(), 0, kPageBytes);
  Put<uint64_t>(page, kRecMagic, kRecordMagic);
  Put<uint16_t>(page, kRecVersion, static_cast<uint16_t>(h.format_version));
  Put<uint16_t>(page, kRecType, static_cast<uint16_t>(h.type));
  Put<uint32_t>(page, kRecHeaderBytes, static_cast<uint32_t>(kPageBytes));
  Put<uint64_t>(page, kRecKeyHi, h.key.hi);
  Put<uint64_t>(page, kRecKeyLo, h.key.lo);
  Put<uint64_t>(page, kRecPayloadBytes, h.payload_bytes);
  Put<uint64_t>(page, kRecFingerprint, h.layout_fingerprint);
  Put<uint64_t>(page, kRecSequence, h.sequence);
  Put<uint64_t>(page, kRecPayloadChecksum, h.payload_checksum);
  Put<uint64_t>(page, kRecChecksum, Xxh3(page.first(kRecChecksum)));
}

std::optional<RecordHeader> ParseRecordHeader(std::span<const std::byte> page, ParseError* error,
                                              uint32_t* version) {
  if (page.size() < kPageBytes || Get<uint64_t>(page, kRecMagic) != kRecordMagic) {
    *error = ParseError::kNotAHeader;
    return std::nullopt;
  }
  const uint32_t v = Get<uint16_t>(page, kRecVersion);
  if (version) *version = v;
  if (v > kFormatVersion) {
    *error = ParseError::kFutureVersion;
    return std::nullopt;
  }
  if (Get<uint64_t>(page, kRecChecksum) != Xxh3(page.first(kRecChecksum))) {
    *error = ParseError::kBadChecksum;
    return std::nullopt;
  }
  RecordHeader h;
  h.format_version = v;
  const uint16_t type = Get<uint16_t>(page, kRecType);
  h.key.hi = Get<uint64_t>(page, kRecKeyHi);
  h.key.lo = Get<uint64_t>(page, kRecKeyLo);
  h.payload_bytes = Get<uint64_t>(page, kRecPayloadBytes);
  h.layout_fingerprint = Get<uint64_t>(page, kRecFingerprint);
  h.sequence = Get<uint64_t>(page, kRecSequence);
  h.payload_checksum = Get<uint64_t>(page, kRecPayloadChecksum);
  const bool type_ok =
      type == static_cast<uint16_t>(RecordType::kPut) ||
      (type == static_cast<uint16_t>(RecordType::kTombstone) && h.payload_bytes == 0);
  if (v == 0 || !type_ok || Get<uint32_t>(page, kRecHeaderBytes) != kPageBytes ||
      h.payload_bytes > kMaxPayloadBytes) {
    *error = ParseError::kMalformed;
    return std::nullopt;
  }
  h.type = static_cast<RecordType>(type);
  return h;
}

std::string SegmentFileName(uint64_t id) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "seg-%08llu.kvs", static_cast<unsigned long long>(id));
  return buf;
}

std::optional<uint64_t> ParseSegmentFileName(std::string_view name) {
  constexpr std::string_view kPrefix = "seg-", kSuffix = ".kvs";
  if (name.size() <= kPrefix.size() + kSuffix.size() || !name.starts_with(kPrefix) ||
      !name.ends_with(kSuffix)) {
    return std::nullopt;
  }
  const std::string_view digits =
      name.substr(kPrefix.size(), name.size() - kPrefix.size() - kSuffix.size());
  if (digits.size() > 19) return std::nullopt;
  uint64_t id = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
    id = id * 10 + static_cast<uint64_t>(c - '0');
  }
  return id;
}

}  // namespace kvtier::disk
