// The disk tier's record format and header scanner (src/tiers/disk/format.h, segment_scan.h).
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "tiers/disk/format.h"
#include "tiers/disk/segment_scan.h"

namespace kvtier::disk {
namespace {

RecordHeader SampleRecord(uint64_t n, uint64_t payload = 8192) {
  RecordHeader h;
  h.key = BlockKey{0x1111000000000000ULL + n, 0x2222000000000000ULL + n};
  h.payload_bytes = payload;
  h.layout_fingerprint = 0xfeedfacecafebeefULL;
  h.sequence = 100 + n;
  h.payload_checksum = 0x0123456789abcdefULL ^ n;
  return h;
}

TEST(DiskFormatTest, SegmentHeaderRoundTrips) {
  SegmentHeader h;
  h.segment_id = 42;
  h.layout_fingerprint = 0xabcdef0123456789ULL;
  h.block_bytes = 2 << 20;
  h.segment_bytes = 256 << 20;
  h.created_unix_ns = 1234567890123ULL;
  std::vector<std::byte> page(kPageBytes, std::byte{0x5a});
  EncodeSegmentHeader(h, page);
  ParseError err;
  auto got = ParseSegmentHeader(page, &err);
  ASSERT_TRUE(got.has_value()) << ParseErrorName(err);
  EXPECT_EQ(got->segment_id, 42u);
  EXPECT_EQ(got->layout_fingerprint, h.layout_fingerprint);
  EXPECT_EQ(got->block_bytes, h.block_bytes);
  EXPECT_EQ(got->segment_bytes, h.segment_bytes);
  EXPECT_EQ(got->created_unix_ns, h.created_unix_ns);
  EXPECT_EQ(got->format_version, kFormatVersion);
}

TEST(DiskFormatTest, RecordHeaderRoundTrips) {
  const RecordHeader h = SampleRecord(7);
  std::vector<std::byte> page(kPageBytes);
  EncodeRecordHeader(h, page);
  ParseError err;
  auto got = ParseRecordHeader(page, &err);
  ASSERT_TRUE(got.has_value()) << ParseErrorName(err);
  EXPECT_EQ(got->key, h.key);
  EXPECT_EQ(got->payload_bytes, h.payload_bytes);
  EXPECT_EQ(got->layout_fingerprint, h.layout_fingerprint);
  EXPECT_EQ(got->sequence, h.sequence);
  EXPECT_EQ(got->payload_checksum, h.payload_checksum);
  EXPECT_EQ(got->type, RecordType::kPut);
  EXPECT_EQ(got->record_bytes(), kPageBytes + 8192);
}

TEST(DiskFormatTest, EveryFlippedHeaderBitIsRejected) {
  std::vector<std::byte> page(kPageBytes);
  EncodeRecordHeader(SampleRecord(1), page);
  for (size_t byte = 0; byte < 72; ++byte) {
    for (int bit = 0; bit < 8; ++bit) {
      std::vector<std::byte> bad = page;
      bad[byte] ^= std::byte(1u << bit);
      ParseError err;
      EXPECT_FALSE(ParseRecordHeader(bad, &err).has_value()) << "byte " << byte << " bit " << bit;
    }
  }
}

TEST(DiskFormatTest, FutureVersionIsNamedNotMisread) {
  std::vector<std::byte> page(kPageBytes);
  SegmentHeader h;
  EncodeSegmentHeader(h, page);
  const uint32_t future = kFormatVersion + 1;
  std::memcpy(page.data() + 8, &future, 4);  // the version field; checksum left stale
  ParseError err;
  uint32_t version = 0;
  EXPECT_FALSE(ParseSegmentHeader(page, &err, &version).has_value());
  EXPECT_EQ(err, ParseError::kFutureVersion);
  EXPECT_EQ(version, future);
}

TEST(DiskFormatTest, ZeroPageIsNotAHeader) {
  std::vector<std::byte> page(kPageBytes);
  ParseError err;
  EXPECT_FALSE(ParseRecordHeader(page, &err).has_value());
  EXPECT_EQ(err, ParseError::kNotAHeader);
}

TEST(DiskFormatTest, ChecksumIsKvtierChecksum64) {
  // Xxh3 picks an AVX2 build at run time; its values must be the core's XXH3-64.
  std::vector<std::byte> bytes((1 << 20) + 77);
  uint64_t x = 12345;
  for (auto& b : bytes) {
    x = x * 6364136223846793005ULL + 1;
    b = static_cast<std::byte>(x >> 57);
  }
  for (size_t n : {size_t{0}, size_t{1}, size_t{17}, size_t{240}, size_t{1023}, size_t{1024},
                   size_t{4096}, size_t{65537}, bytes.size()}) {
    const std::span<const std::byte> s(bytes.data(), n);
    EXPECT_EQ(Xxh3(s), Checksum64(s)) << n << " bytes";
  }
}

TEST(DiskFormatTest, SegmentFileNames) {
  EXPECT_EQ(SegmentFileName(42), "seg-00000042.kvs");
  EXPECT_EQ(ParseSegmentFileName("seg-00000042.kvs"), 42u);
  EXPECT_EQ(ParseSegmentFileName(SegmentFileName(123456789012ULL)), 123456789012ULL);
  EXPECT_FALSE(ParseSegmentFileName("seg-.kvs").has_value());
  EXPECT_FALSE(ParseSegmentFileName("seg-0000004x.kvs").has_value());
  EXPECT_FALSE(ParseSegmentFileName("LOCK").has_value());
  EXPECT_FALSE(ParseSegmentFileName("seg-00000042.kvs.tmp").has_value());
}

// An in-memory segment: header page, then records with payload pages of a fill byte.
class MemSegment {
 public:
  explicit MemSegment(uint64_t fingerprint) : fingerprint_(fingerprint) {
    bytes_.resize(kPageBytes);
    SegmentHeader h;
    h.segment_id = 1;
    h.layout_fingerprint = fingerprint;
    h.block_bytes = 8192;
    EncodeSegmentHeader(h, bytes_);
  }
  uint64_t Add(uint64_t n, uint64_t payload, uint64_t fingerprint) {
    RecordHeader h = SampleRecord(n, payload);
    h.layout_fingerprint = fingerprint;
    const uint64_t off = bytes_.size();
    bytes_.resize(off + h.record_bytes(), std::byte{0x77});
    EncodeRecordHeader(h, std::span<std::byte>(bytes_).subspan(off, kPageBytes));
    return off;
  }
  uint64_t Add(uint64_t n) { return Add(n, 8192, fingerprint_); }
  std::vector<std::byte>& bytes() { return bytes_; }
  SegmentScan Scan(uint64_t size) const {
    return ScanSegment(
        [this](uint64_t off, std::span<std::byte> buf) -> int64_t {
          if (off >= bytes_.size()) return 0;
          const size_t n = std::min<size_t>(buf.size(), bytes_.size() - off);
          std::memcpy(buf.data(), bytes_.data() + off, n);
          return static_cast<int64_t>(n);
        },
        size, fingerprint_);
  }
  SegmentScan Scan() const { return Scan(bytes_.size()); }

 private:
  uint64_t fingerprint_;
  std::vector<std::byte> bytes_;
};

TEST(DiskScanTest, FindsEveryRecordInOrder) {
  MemSegment seg(9);
  std::vector<uint64_t> offs;
  for (uint64_t n = 0; n < 5; ++n) offs.push_back(seg.Add(n));
  SegmentScan scan = seg.Scan();
  ASSERT_TRUE(scan.header.has_value());
  ASSERT_EQ(scan.records.size(), 5u);
  EXPECT_TRUE(scan.issues.empty());
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(scan.records[i].offset, offs[i]);
    EXPECT_EQ(scan.records[i].header.sequence, 100 + i);
  }
}

TEST(DiskScanTest, CorruptHeaderSkipsOnlyThatRecord) {
  MemSegment seg(9);
  std::vector<uint64_t> offs;
  for (uint64_t n = 0; n < 5; ++n) offs.push_back(seg.Add(n));
  seg.bytes()[offs[2] + 20] ^= std::byte{0x01};  // inside the key
  SegmentScan scan = seg.Scan();
  ASSERT_EQ(scan.records.size(), 4u);
  EXPECT_EQ(scan.records[2].offset, offs[3]);
  ASSERT_EQ(scan.issues.size(), 1u);
  EXPECT_EQ(scan.issues[0].kind, ScanIssue::Kind::kCorruptHeader);
  EXPECT_EQ(scan.issues[0].offset, offs[2]);
  EXPECT_EQ(scan.issues[0].length, offs[3] - offs[2]);
  EXPECT_TRUE(scan.issues[0].is_corruption());
}

TEST(DiskScanTest, TruncatedLastRecordIsATornTail) {
  MemSegment seg(9);
  seg.Add(0);
  const uint64_t last = seg.Add(1);
  SegmentScan scan = seg.Scan(last + kPageBytes * 2);  // header and one payload page only
  ASSERT_EQ(scan.records.size(), 1u);
  ASSERT_EQ(scan.issues.size(), 1u);
  EXPECT_EQ(scan.issues[0].kind, ScanIssue::Kind::kTornTail);
  EXPECT_EQ(scan.issues[0].offset, last);
  EXPECT_FALSE(scan.issues[0].is_corruption());
}

// A header whose checksum matches but whose length is impossible (past the end of the file, or
// not the segment's block size) was taken for a torn tail: the scan stopped there and the
// records behind it were cut off at open. It is corruption, and the scan resyncs past it.
TEST(DiskScanTest, ImpossibleLengthInASealedSegmentIsCorruptionNotATornTail) {
  for (uint64_t bad_payload : {uint64_t{1} << 40, uint64_t{4096}}) {
    MemSegment seg(9);
    std::vector<uint64_t> offs;
    for (uint64_t n = 0; n < 5; ++n) offs.push_back(seg.Add(n));
    RecordHeader h = SampleRecord(2, bad_payload);
    h.layout_fingerprint = 9;
    EncodeRecordHeader(h, std::span<std::byte>(seg.bytes()).subspan(offs[2], kPageBytes));
    SegmentScan scan = seg.Scan();
    ASSERT_EQ(scan.records.size(), 4u) << bad_payload;
    EXPECT_EQ(scan.records[2].offset, offs[3]);
    EXPECT_EQ(scan.records[3].offset, offs[4]);
    ASSERT_EQ(scan.issues.size(), 1u);
    EXPECT_EQ(scan.issues[0].kind, ScanIssue::Kind::kCorruptHeader) << scan.issues[0].message;
    EXPECT_EQ(scan.issues[0].offset, offs[2]);
    EXPECT_EQ(scan.issues[0].length, offs[3] - offs[2]);
  }
}

TEST(DiskScanTest, GarbageToEndOfFileIsATornTail) {
  MemSegment seg(9);
  seg.Add(0);
  const uint64_t end = seg.bytes().size();
  seg.bytes().resize(end + 3 * kPageBytes);  // zeros, as after a cut write
  SegmentScan scan = seg.Scan();
  ASSERT_EQ(scan.records.size(), 1u);
  ASSERT_EQ(scan.issues.size(), 1u);
  EXPECT_EQ(scan.issues[0].kind, ScanIssue::Kind::kTornTail);
  EXPECT_EQ(scan.issues[0].offset, end);
  EXPECT_EQ(scan.issues[0].length, 3 * kPageBytes);
}

TEST(DiskScanTest, ForeignLayoutRecordIsSkippedAndNamed) {
  MemSegment seg(9);
  seg.Add(0);
  const uint64_t foreign = seg.Add(1, 8192, 10);
  seg.Add(2);
  SegmentScan scan = seg.Scan();
  ASSERT_EQ(scan.records.size(), 2u);
  ASSERT_EQ(scan.issues.size(), 1u);
  EXPECT_EQ(scan.issues[0].kind, ScanIssue::Kind::kForeignLayout);
  EXPECT_EQ(scan.issues[0].offset, foreign);
}

TEST(DiskScanTest, FutureVersionSegmentStopsTheScan) {
  MemSegment seg(9);
  seg.Add(0);
  const uint32_t future = kFormatVersion + 3;
  std::memcpy(seg.bytes().data() + 8, &future, 4);
  SegmentScan scan = seg.Scan();
  EXPECT_FALSE(scan.header.has_value());
  EXPECT_EQ(scan.header_error, ParseError::kFutureVersion);
  EXPECT_EQ(scan.header_version, future);
  EXPECT_TRUE(scan.records.empty());
}

}  // namespace
}  // namespace kvtier::disk
