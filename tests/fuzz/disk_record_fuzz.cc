// libFuzzer target for the disk tier's record parser and segment scanner.
//
// Input: one control byte, then a segment image. With bit 0 of the control byte set, every page
// that starts with the record magic gets its header checksum recomputed first, so mutated
// fields (lengths, types, versions) get past the checksum and reach the field checks.
// Invariants checked: parsing never reads out of bounds (ASan), a parsed header re-encodes to a
// header that parses to the same fields, and scanned records are page-aligned, in file order,
// non-overlapping and inside the file.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "tiers/disk/format.h"
#include "tiers/disk/segment_scan.h"

using namespace kvtier::disk;

namespace {

void Require(bool ok) {
  if (!ok) std::abort();
}

void CheckRoundTrip(std::span<const std::byte> page) {
  ParseError err;
  if (auto h = ParseRecordHeader(page, &err)) {
    std::vector<std::byte> again(kPageBytes);
    EncodeRecordHeader(*h, again);
    auto h2 = ParseRecordHeader(again, &err);
    Require(h2.has_value());
    Require(h2->key == h->key && h2->payload_bytes == h->payload_bytes &&
            h2->sequence == h->sequence && h2->payload_checksum == h->payload_checksum &&
            h2->layout_fingerprint == h->layout_fingerprint && h2->type == h->type);
  }
  if (auto s = ParseSegmentHeader(page, &err)) {
    std::vector<std::byte> again(kPageBytes);
    EncodeSegmentHeader(*s, again);
    auto s2 = ParseSegmentHeader(again, &err);
    Require(s2.has_value() && s2->segment_id == s->segment_id &&
            s2->layout_fingerprint == s->layout_fingerprint);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t control = data[0];
  std::vector<std::byte> image(reinterpret_cast<const std::byte*>(data + 1),
                               reinterpret_cast<const std::byte*>(data + size));
  if (control & 1) {
    for (size_t off = 0; off + kPageBytes <= image.size(); off += kPageBytes) {
      uint64_t magic;
      std::memcpy(&magic, image.data() + off, 8);
      if (magic == kRecordMagic) {
        const uint64_t sum = Xxh3(std::span<const std::byte>(image.data() + off, 64));
        std::memcpy(image.data() + off + 64, &sum, 8);
      }
    }
  }
  // Every page (and a short tail) through the header parsers.
  for (size_t off = 0; off < image.size(); off += kPageBytes) {
    std::vector<std::byte> page(kPageBytes);
    std::memcpy(page.data(), image.data() + off, std::min<size_t>(kPageBytes, image.size() - off));
    CheckRoundTrip(page);
  }
  const ReadAtFn read = [&image](uint64_t off, std::span<std::byte> buf) -> int64_t {
    if (off >= image.size()) return 0;
    const size_t n = std::min<size_t>(buf.size(), image.size() - off);
    std::memcpy(buf.data(), image.data() + off, n);
    return static_cast<int64_t>(n);
  };
  for (int pass = 0; pass < 2; ++pass) {
    const SegmentScan scan =
        ScanSegment(read, image.size(), pass == 0 ? std::nullopt : std::optional<uint64_t>(7));
    uint64_t end = kPageBytes;
    for (const ScannedRecord& r : scan.records) {
      Require(r.offset % kPageBytes == 0);
      Require(r.offset >= end);
      end = r.offset + r.header.record_bytes();
      Require(end <= image.size());
      if (pass == 1) Require(r.header.layout_fingerprint == 7);
    }
    for (const ScanIssue& i : scan.issues) Require(i.offset <= image.size());
  }
  return 0;
}
