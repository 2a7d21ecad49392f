// DiskStore's reader side: a record whose bytes fail verification is Corruption, dropped (for
// good: a tombstone), and the rest stays readable; GetSlice reads parts of blocks, in place when
// aligned, and hands back each block's checksum from its header.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kvtier/block_key.h"

#include "testing/disk_store_util.h"
#include "tiers/disk/disk_store.h"
#include "tiers/disk/format.h"

namespace kvtier::disk {
namespace {

TEST_P(DiskStoreTest, FlippedPayloadByteIsCorruptionAndTheRestStaysReadable) {
  DiskOptions o = Options(dir_.path(), GetParam());
  {
    auto s = OpenOrDie(o);
    PutMany(*s, 0, 5);
  }
  auto files = SegmentFiles(dir_.path());
  ASSERT_EQ(files.size(), 1u);
  // Record 2 starts at page 1 + 2 records; flip a payload byte in it.
  FlipByte(files[0], kPageBytes + 2 * o.record_bytes() + kPageBytes + 1000);
  auto s = OpenOrDie(o);
  const Status st = GetOne(*s, 2);
  EXPECT_EQ(st.code(), StatusCode::kCorruption) << st.ToString();
  EXPECT_NE(st.message().find("checksum"), std::string::npos) << st.message();
  EXPECT_TRUE(GetOne(*s, 2).IsNotFound());  // dropped
  for (uint64_t n : {0, 1, 3, 4}) EXPECT_TRUE(GetOne(*s, n).ok()) << n;
  EXPECT_EQ(s->stats().corruptions, 1u);
  // The drop outlives the process: reopened, the index rebuilt from the segments holds the
  // corrupt record's tombstone, so no later process loads it again.
  s.reset();
  s = OpenOrDie(o);
  EXPECT_TRUE(GetOne(*s, 2).IsNotFound());
  for (uint64_t n : {0, 1, 3, 4}) EXPECT_TRUE(GetOne(*s, n).ok()) << n;
  EXPECT_EQ(s->stats().corruptions, 0u);
}

// Logs every request over a real engine, to see where reads land.
class RecordingEngine final : public ForwardingEngine {
 public:
  RecordingEngine(std::unique_ptr<IoEngine> inner, std::vector<IoRequest>* log)
      : ForwardingEngine(std::move(inner)), log_(log) {}
  void Queue(const IoRequest& request) override {
    EXPECT_LT(inner_->outstanding(), queue_depth_);  // the engine's precondition
    log_->push_back(request);
    inner_->Queue(request);
  }

 private:
  std::vector<IoRequest>* log_;
};

DiskOptions RecordingOptions(const std::string& dir, IoBackend io, std::vector<IoRequest>* log) {
  DiskOptions o = Options(dir, io);
  o.make_io_engine = [log](const IoEngineOptions& eo) -> Result<std::unique_ptr<IoEngine>> {
    KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<IoEngine> inner, MakeIoEngine(eo));
    return std::unique_ptr<IoEngine>(new RecordingEngine(std::move(inner), log));
  };
  return o;
}

std::vector<IoRequest> Reads(const std::vector<IoRequest>& log) {
  std::vector<IoRequest> out;
  std::copy_if(log.begin(), log.end(), std::back_inserter(out),
               [](const IoRequest& r) { return !r.write; });
  return out;
}

struct Sliced {
  std::vector<Status> results;
  std::vector<uint64_t> checksums;  // empty unless asked for
};

// GetSlice of keys ns at offset into out[i], asking for checksums when `checksums`.
Sliced ReadSlices(DiskStore& s, const std::vector<uint64_t>& ns, uint64_t offset,
                  const std::vector<std::span<std::byte>>& out, bool checksums) {
  std::vector<BlockKey> keys;
  for (uint64_t n : ns) keys.push_back(Key(n));
  Sliced r{std::vector<Status>(ns.size()), std::vector<uint64_t>(checksums ? ns.size() : 0, 7)};
  s.GetSlice(keys, offset, out, r.checksums, r.results);
  return r;
}

// Whether bytes equal block n's bytes [offset, offset + bytes.size()).
bool SliceOf(uint64_t n, uint64_t offset, std::span<const std::byte> bytes) {
  const std::vector<std::byte> block = Payload(n);
  return offset + bytes.size() <= block.size() &&
         std::equal(bytes.begin(), bytes.end(), block.begin() + static_cast<ptrdiff_t>(offset));
}

TEST_P(DiskStoreTest, AlignedSlicesAreReadInPlaceWithoutTheHeader) {
  std::vector<IoRequest> log;
  auto s = OpenOrDie(RecordingOptions(dir_.path(), GetParam(), &log));
  ASSERT_NE(s, nullptr);
  PutMany(*s, 0, 3);
  constexpr uint64_t kLayer = 2 * kPageBytes;
  AlignedBuffer buf(3 * kLayer);
  for (uint64_t offset : {uint64_t{0}, kLayer}) {
    std::vector<std::span<std::byte>> out;
    for (uint64_t i = 0; i < 3; ++i) out.push_back(buf.span().subspan(i * kLayer, kLayer));
    log.clear();
    const Sliced r = ReadSlices(*s, {0, 1, 2}, offset, out, false);
    for (uint64_t i = 0; i < 3; ++i) {
      ASSERT_TRUE(r.results[i].ok()) << r.results[i].ToString();
      EXPECT_TRUE(SliceOf(i, offset, out[i])) << "key " << i << " offset " << offset;
    }
    // One read per slice, of the slice alone, into the caller's buffer (no bounce, no header).
    const std::vector<IoRequest> reads = Reads(log);
    ASSERT_EQ(reads.size(), 3u);
    for (const IoRequest& q : reads) {
      EXPECT_GE(q.buf, buf.data());
      EXPECT_LT(q.buf, buf.data() + buf.size());
      EXPECT_EQ(q.len, kLayer);
      EXPECT_EQ(q.offset % kPageBytes, 0u);
    }
  }
}

TEST_P(DiskStoreTest, UnalignedSlicesIntoUnalignedBuffersAreBouncedOnAlignedReads) {
  std::vector<IoRequest> log;
  auto s = OpenOrDie(RecordingOptions(dir_.path(), GetParam(), &log));
  ASSERT_NE(s, nullptr);
  PutMany(*s, 0, 3);
  const bool direct = s->stats().direct_io;
  std::vector<std::byte> raw(3 * 1000 + 1);
  for (uint64_t offset : {uint64_t{100}, kPageBytes - 500, kBlock - 1000}) {
    std::fill(raw.begin(), raw.end(), std::byte{0});
    std::vector<std::span<std::byte>> out;
    for (uint64_t i = 0; i < 3; ++i) out.emplace_back(raw.data() + 1 + i * 1000, 1000);
    log.clear();
    const Sliced r = ReadSlices(*s, {0, 1, 2}, offset, out, false);
    for (uint64_t i = 0; i < 3; ++i) {
      ASSERT_TRUE(r.results[i].ok()) << r.results[i].ToString();
      EXPECT_TRUE(SliceOf(i, offset, out[i])) << "key " << i << " offset " << offset;
    }
    EXPECT_EQ(raw[0], std::byte{0});  // nothing written before the first slice
    // O_DIRECT: only whole, aligned pages are read, never into the caller's odd buffer.
    for (const IoRequest& q : Reads(log)) {
      if (!direct) continue;
      EXPECT_EQ(q.offset % kPageBytes, 0u) << q.offset;
      EXPECT_EQ(q.len % kPageBytes, 0u) << q.len;
      EXPECT_EQ(reinterpret_cast<uintptr_t>(q.buf) % kPageBytes, 0u);
    }
  }
}

TEST_P(DiskStoreTest, SlicesWithChecksumsAssembleBlocksThatVerify) {
  // Queue depth 1 puts a want's header and slice reads in different rounds.
  for (uint32_t depth : {8u, 1u}) {
    std::vector<IoRequest> log;
    DiskOptions o = RecordingOptions(dir_.path(), GetParam(), &log);
    o.queue_depth = depth;
    auto s = OpenOrDie(o);
    ASSERT_NE(s, nullptr);
    PutMany(*s, 0, 4);
    constexpr uint64_t kLayer = kBlock / 3;  // 5632: neither offsets nor lengths page-aligned
    std::vector<std::vector<std::byte>> blocks(4, std::vector<std::byte>(kBlock));
    for (uint64_t offset = 0; offset < kBlock; offset += kLayer) {
      std::vector<std::span<std::byte>> out;
      for (auto& b : blocks) out.emplace_back(b.data() + offset, kLayer);
      log.clear();
      const Sliced r = ReadSlices(*s, {0, 1, 2, 3}, offset, out, true);
      for (uint64_t n = 0; n < 4; ++n) {
        ASSERT_TRUE(r.results[n].ok()) << r.results[n].ToString();
        EXPECT_EQ(r.checksums[n], Checksum64(Payload(n))) << "key " << n << " offset " << offset;
      }
      EXPECT_EQ(Reads(log).size(), 8u);  // a header and a slice per key
    }
    for (uint64_t n = 0; n < 4; ++n) EXPECT_EQ(blocks[n], Payload(n)) << "depth " << depth;
  }
}

TEST_P(DiskStoreTest, MissingKeyIsNotFoundAndTheRestOfTheSliceBatchIsRead) {
  auto s = OpenOrDie(Options(dir_.path(), GetParam()));
  ASSERT_NE(s, nullptr);
  PutMany(*s, 0, 2);
  std::vector<std::vector<std::byte>> bufs(3, std::vector<std::byte>(1000));
  std::vector<std::span<std::byte>> out(bufs.begin(), bufs.end());
  const Sliced r = ReadSlices(*s, {0, 99, 1}, 300, out, true);
  ASSERT_TRUE(r.results[0].ok()) << r.results[0].ToString();
  EXPECT_TRUE(r.results[1].IsNotFound()) << r.results[1].ToString();
  ASSERT_TRUE(r.results[2].ok()) << r.results[2].ToString();
  EXPECT_TRUE(SliceOf(0, 300, out[0]));
  EXPECT_TRUE(SliceOf(1, 300, out[2]));
  EXPECT_EQ(r.checksums[0], Checksum64(Payload(0)));
  EXPECT_EQ(r.checksums[1], 0u);
  EXPECT_EQ(r.checksums[2], Checksum64(Payload(1)));

  // A slice past the block's end is refused here too (not only by Tier::GetSlice).
  const Sliced past = ReadSlices(*s, {0}, kBlock - 10, {out[0]}, false);
  EXPECT_EQ(past.results[0].code(), StatusCode::kInvalidArgument) << past.results[0].ToString();
}

TEST_P(DiskStoreTest, CorruptHeaderFailsASliceWithChecksumsAndDropsTheBlock) {
  DiskOptions o = Options(dir_.path(), GetParam());
  auto s = OpenOrDie(o);
  ASSERT_NE(s, nullptr);
  PutMany(*s, 0, 3);
  auto files = SegmentFiles(dir_.path());
  ASSERT_EQ(files.size(), 1u);
  FlipByte(files[0], kPageBytes + 1 * o.record_bytes() + 20);  // record 1's key, while open
  std::vector<std::vector<std::byte>> bufs(3, std::vector<std::byte>(1000));
  std::vector<std::span<std::byte>> out(bufs.begin(), bufs.end());

  // Without checksums the header is not read: the slice's bytes are intact.
  Sliced r = ReadSlices(*s, {0, 1, 2}, 0, out, false);
  for (const Status& st : r.results) EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_TRUE(SliceOf(1, 0, out[1]));

  r = ReadSlices(*s, {0, 1, 2}, 0, out, true);
  EXPECT_TRUE(r.results[0].ok()) << r.results[0].ToString();
  EXPECT_EQ(r.results[1].code(), StatusCode::kCorruption) << r.results[1].ToString();
  const std::string where = "offset " + std::to_string(kPageBytes + o.record_bytes());
  EXPECT_NE(r.results[1].message().find(where), std::string::npos) << r.results[1].message();
  EXPECT_NE(r.results[1].message().find("segment "), std::string::npos);
  EXPECT_EQ(r.checksums[1], 0u);
  EXPECT_TRUE(r.results[2].ok()) << r.results[2].ToString();
  EXPECT_EQ(r.checksums[2], Checksum64(Payload(2)));

  r = ReadSlices(*s, {1}, 0, {out[1]}, false);
  EXPECT_TRUE(r.results[0].IsNotFound()) << r.results[0].ToString();  // dropped
  EXPECT_EQ(s->stats().corruptions, 1u);
  for (uint64_t n : {0, 2}) EXPECT_TRUE(GetOne(*s, n).ok()) << n;
}

INSTANTIATE_TEST_SUITE_P(Backends, DiskStoreTest,
                         ::testing::Values(IoBackend::kUring, IoBackend::kSync), BackendName);

}  // namespace
}  // namespace kvtier::disk
