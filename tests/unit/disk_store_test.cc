// DiskStore, the disk tier's engine: round trips, restart, eviction under the capacity,
// corruption handling, refusal of foreign segments, durability policies, concurrency, and
// failures of the system under it (a segment that cannot be started, an io_uring ring that
// breaks).
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "testing/test_util.h"
#include "tiers/disk/disk_store.h"
#include "tiers/disk/format.h"

namespace kvtier::disk {
namespace {

constexpr uint64_t kBlock = 16 * 1024 + 512;  // not page-aligned on purpose
constexpr uint64_t kFingerprint = 0x5eed5eed12345678ULL;

BlockKey Key(uint64_t n) { return BlockKey{n * 0x9e3779b97f4a7c15ULL + 1, n}; }

// Deterministic block contents for (key n, version v).
std::vector<std::byte> Payload(uint64_t n, uint64_t v = 0, uint64_t bytes = kBlock) {
  std::vector<std::byte> out(bytes);
  uint64_t x = n * 0x2545f4914f6cdd1dULL + v * 0x9e3779b97f4a7c15ULL + 7;
  for (uint64_t i = 0; i < bytes; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    out[i] = static_cast<std::byte>(x);
  }
  return out;
}

DiskOptions Options(const std::string& dir, IoBackend io = IoBackend::kAuto) {
  DiskOptions o;
  o.path = dir;
  o.block_bytes = kBlock;
  o.layout_fingerprint = kFingerprint;
  o.capacity_bytes = 8 << 20;
  o.segment_bytes = 1 << 20;
  o.queue_depth = 8;
  o.io = io;
  o.buffer_bytes = 1 << 20;
  return o;
}

std::unique_ptr<DiskStore> OpenOrDie(const DiskOptions& o, DiskStore::RemovalFn fn = nullptr) {
  auto r = DiskStore::Open(o, std::move(fn));
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? std::move(r).value() : nullptr;
}

void PutMany(DiskStore& s, uint64_t first, uint64_t count, uint64_t version = 0) {
  std::vector<BlockKey> keys;
  std::vector<std::vector<std::byte>> data;
  std::vector<std::span<const std::byte>> blocks;
  for (uint64_t n = first; n < first + count; ++n) {
    keys.push_back(Key(n));
    data.push_back(Payload(n, version));
  }
  for (auto& d : data) blocks.emplace_back(d);
  std::vector<Status> results(keys.size());
  s.Put(keys, blocks, results);
  for (size_t i = 0; i < results.size(); ++i) {
    ASSERT_TRUE(results[i].ok()) << "key " << first + i << ": " << results[i].ToString();
  }
}

// Per-block statuses of one Put of keys first..first+count-1.
std::vector<Status> PutStatuses(DiskStore& s, uint64_t first, uint64_t count) {
  std::vector<BlockKey> keys;
  std::vector<std::vector<std::byte>> data;
  std::vector<std::span<const std::byte>> blocks;
  for (uint64_t n = first; n < first + count; ++n) {
    keys.push_back(Key(n));
    data.push_back(Payload(n));
  }
  for (auto& d : data) blocks.emplace_back(d);
  std::vector<Status> results(keys.size());
  s.Put(keys, blocks, results);
  return results;
}

// While alive, the process cannot open another file descriptor (EMFILE): the soft
// RLIMIT_NOFILE is lowered to the lowest free descriptor. Works as root too.
class NoMoreDescriptors {
 public:
  NoMoreDescriptors() {
    ::getrlimit(RLIMIT_NOFILE, &saved_);
    const int lowest_free = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (lowest_free >= 0) ::close(lowest_free);
    rlimit lim = saved_;
    lim.rlim_cur = static_cast<rlim_t>(lowest_free);
    ok_ = lowest_free >= 0 && ::setrlimit(RLIMIT_NOFILE, &lim) == 0;
  }
  ~NoMoreDescriptors() { ::setrlimit(RLIMIT_NOFILE, &saved_); }
  bool ok() const { return ok_; }

 private:
  rlimit saved_{};
  bool ok_ = false;
};

// While alive, no file of the process grows past `bytes` (EFBIG; SIGXFSZ ignored). Works as root.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(uint64_t bytes) {
    ::getrlimit(RLIMIT_FSIZE, &saved_);
    old_handler_ = ::signal(SIGXFSZ, SIG_IGN);
    rlimit lim = saved_;
    lim.rlim_cur = static_cast<rlim_t>(bytes);
    ok_ = ::setrlimit(RLIMIT_FSIZE, &lim) == 0;
  }
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &saved_);
    ::signal(SIGXFSZ, old_handler_);
  }
  bool ok() const { return ok_; }

 private:
  rlimit saved_{};
  sighandler_t old_handler_ = SIG_DFL;
  bool ok_ = false;
};

// Status of reading key n, checking the bytes against version v when OK.
Status GetOne(DiskStore& s, uint64_t n, uint64_t v = 0) {
  std::vector<std::byte> buf(kBlock);
  std::span<std::byte> out(buf);
  BlockKey key = Key(n);
  Status st;
  s.Get({&key, 1}, {&out, 1}, {&st, 1});
  if (st.ok() && buf != Payload(n, v)) return Status::Internal("served wrong bytes");
  return st;
}

uint64_t DirBytes(const std::string& dir) {
  uint64_t total = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().filename().string().starts_with("seg-")) total += e.file_size();
  }
  return total;
}

std::vector<std::string> SegmentFiles(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (ParseSegmentFileName(e.path().filename().string())) out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

void FlipByte(const std::string& file, uint64_t offset) {
  const int fd = ::open(file.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  unsigned char c = 0;
  ASSERT_EQ(::pread(fd, &c, 1, static_cast<off_t>(offset)), 1);
  c ^= 0x40;
  ASSERT_EQ(::pwrite(fd, &c, 1, static_cast<off_t>(offset)), 1);
  ::close(fd);
}

class DiskStoreTest : public ::testing::TestWithParam<IoBackend> {
 protected:
  void SetUp() override {
    ASSERT_FALSE(dir_.path().empty()) << "mkdtemp failed";
    if (GetParam() == IoBackend::kUring) {
      IoEngineOptions eo;
      eo.backend = IoBackend::kUring;
      auto probe = MakeIoEngine(eo);
      if (!probe.ok()) GTEST_SKIP() << "io_uring unavailable here: " << probe.status().ToString();
    }
  }
  ::kvtier::testing::TempDir dir_;
};

TEST_P(DiskStoreTest, PutGetRoundTripAndMiss) {
  auto s = OpenOrDie(Options(dir_.path(), GetParam()));
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->stats().io_backend, GetParam() == IoBackend::kSync ? "pread/pwrite" : "io_uring");
  PutMany(*s, 0, 20);
  for (uint64_t n = 0; n < 20; ++n) EXPECT_TRUE(GetOne(*s, n).ok()) << n;
  EXPECT_TRUE(GetOne(*s, 999).IsNotFound());
  bool found[2];
  BlockKey keys[2] = {Key(3), Key(999)};
  s->Exists(keys, found);
  EXPECT_TRUE(found[0]);
  EXPECT_FALSE(found[1]);
  EXPECT_EQ(s->stats().live_blocks, 20u);
}

TEST_P(DiskStoreTest, WrongSizeIsInvalidArgumentPerBlock) {
  auto s = OpenOrDie(Options(dir_.path(), GetParam()));
  std::vector<std::byte> good = Payload(1), small(100);
  BlockKey keys[2] = {Key(1), Key(2)};
  std::span<const std::byte> blocks[2] = {good, small};
  Status results[2];
  s->Put(keys, blocks, results);
  EXPECT_TRUE(results[0].ok());
  EXPECT_EQ(results[1].code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(GetOne(*s, 1).ok());
  EXPECT_TRUE(GetOne(*s, 2).IsNotFound());
}

TEST_P(DiskStoreTest, ReopenRebuildsTheIndexAndLatestWins) {
  {
    auto s = OpenOrDie(Options(dir_.path(), GetParam()));
    PutMany(*s, 0, 30);
    PutMany(*s, 10, 5, /*version=*/1);  // overwrites
  }
  auto s = OpenOrDie(Options(dir_.path(), GetParam()));
  EXPECT_EQ(s->stats().recovered_blocks, 30u);
  for (uint64_t n = 0; n < 30; ++n) {
    const uint64_t v = (n >= 10 && n < 15) ? 1 : 0;
    EXPECT_TRUE(GetOne(*s, n, v).ok()) << n;
  }
  // New writes after a restart go to a new segment and survive another restart.
  PutMany(*s, 30, 3);
  s.reset();
  s = OpenOrDie(Options(dir_.path(), GetParam()));
  EXPECT_TRUE(GetOne(*s, 31).ok());
  EXPECT_TRUE(GetOne(*s, 12, 1).ok());
}

TEST_P(DiskStoreTest, EraseSurvivesRestart) {
  {
    auto s = OpenOrDie(Options(dir_.path(), GetParam()));
    PutMany(*s, 0, 10);
    BlockKey gone[3] = {Key(2), Key(5), Key(12345)};
    ASSERT_TRUE(s->Erase(gone).ok());
    EXPECT_TRUE(GetOne(*s, 2).IsNotFound());
    PutMany(*s, 5, 1, /*version=*/2);  // re-put after erase
  }
  auto s = OpenOrDie(Options(dir_.path(), GetParam()));
  EXPECT_TRUE(GetOne(*s, 2).IsNotFound());
  EXPECT_TRUE(GetOne(*s, 5, 2).ok());
  EXPECT_TRUE(GetOne(*s, 4).ok());
}

TEST_P(DiskStoreTest, CapacityIsNeverExceededAndEvictionsAreReported) {
  DiskOptions o = Options(dir_.path(), GetParam());
  o.reinsert_hot = false;
  o.sync = SyncPolicy::kNone;  // thousands of batches: no fdatasync each
  std::set<BlockKey> removed;
  std::mutex mu;
  auto s = OpenOrDie(o, [&](std::span<const BlockKey> keys) {
    std::lock_guard<std::mutex> l(mu);
    removed.insert(keys.begin(), keys.end());
  });
  const uint64_t per_segment = (o.segment_bytes - kPageBytes) / o.record_bytes();
  const uint64_t total = 4 * o.capacity_bytes / o.record_bytes();
  for (uint64_t n = 0; n < total; n += 16) {
    PutMany(*s, n, 16);
    ASSERT_LE(s->used_bytes(), o.capacity_bytes);
    ASSERT_LE(DirBytes(dir_.path()), o.capacity_bytes);
  }
  const uint64_t written = (total + 15) / 16 * 16;
  EXPECT_GT(s->stats().evicted_segments, 0u);
  // Every key is either resident or was reported removed, never both.
  uint64_t resident = 0;
  for (uint64_t n = 0; n < written; ++n) {
    const Status st = GetOne(*s, n);
    const bool was_removed = removed.count(Key(n)) != 0;
    if (st.ok()) {
      ++resident;
      EXPECT_FALSE(was_removed) << n;
    } else {
      EXPECT_TRUE(st.IsNotFound()) << st.ToString();
      EXPECT_TRUE(was_removed) << n;
    }
  }
  // Oldest first: the newest blocks are all there, and at least capacity minus two segments
  // worth of blocks stays resident.
  for (uint64_t n = written - per_segment; n < written; ++n) EXPECT_TRUE(GetOne(*s, n).ok()) << n;
  EXPECT_GE(resident, (o.capacity_bytes / o.segment_bytes - 2) * per_segment);
  EXPECT_TRUE(GetOne(*s, 0).IsNotFound());
}

TEST_P(DiskStoreTest, HotBlocksAreReinsertedOnEviction) {
  DiskOptions o = Options(dir_.path(), GetParam());
  o.sync = SyncPolicy::kNone;
  auto s = OpenOrDie(o);
  PutMany(*s, 0, 20);
  for (uint64_t n = 0; n < 4; ++n) ASSERT_TRUE(GetOne(*s, n).ok());  // hot: read once
  // Push everything else out several times over.
  for (uint64_t n = 1000; n < 1000 + 4 * o.capacity_bytes / o.record_bytes(); n += 16) {
    PutMany(*s, n, 16);
    // Keep them hot: a block survives a round only if read since it was (re)written.
    for (uint64_t h = 0; h < 4; ++h) ASSERT_TRUE(GetOne(*s, h).ok()) << h;
  }
  EXPECT_GT(s->stats().reinserted_blocks, 0u);
  for (uint64_t n = 0; n < 4; ++n) EXPECT_TRUE(GetOne(*s, n).ok()) << n;
  for (uint64_t n = 4; n < 20; ++n) EXPECT_TRUE(GetOne(*s, n).IsNotFound()) << n;
  EXPECT_LE(s->used_bytes(), o.capacity_bytes);
}

// A reader of hot blocks never misses them while their segment is evicted and they are
// copied forward: they stay readable at the old place until the copy is published.
TEST_P(DiskStoreTest, HotBlocksStayReadableWhileCopiedForward) {
  DiskOptions o = Options(dir_.path(), GetParam());
  o.sync = SyncPolicy::kNone;
  auto s = OpenOrDie(o);
  PutMany(*s, 0, 4);
  std::atomic<uint64_t> passes{0}, missed{0};
  std::atomic<bool> done{false};
  std::thread reader([&] {
    while (!done.load()) {
      for (uint64_t h = 0; h < 4; ++h) {
        if (!GetOne(*s, h).ok()) missed.fetch_add(1);
      }
      passes.fetch_add(1);
    }
  });
  const uint64_t rounds = 4 * o.capacity_bytes / o.record_bytes() / 8;
  for (uint64_t r = 0; r < rounds; ++r) {
    // One reader pass between batches: the hot blocks are read before every roll, so the
    // policy always keeps them; a miss could only come from the copy-forward window.
    const uint64_t seen = passes.load();
    while (passes.load() < seen + 2) std::this_thread::yield();
    PutMany(*s, 1000 + r * 8, 8);
  }
  done.store(true);
  reader.join();
  EXPECT_EQ(missed.load(), 0u);
  EXPECT_GT(s->stats().evicted_segments, 3u);
  EXPECT_GT(s->stats().reinserted_blocks, 0u);
}

TEST_P(DiskStoreTest, KeyWrittenTwiceInOneSegmentIsKeptOrEvictedOnce) {
  DiskOptions o = Options(dir_.path(), GetParam());
  o.sync = SyncPolicy::kNone;
  std::map<BlockKey, int> removed;
  auto s = OpenOrDie(o, [&](std::span<const BlockKey> keys) {
    for (const BlockKey& k : keys) ++removed[k];
  });
  PutMany(*s, 0, 4);
  PutMany(*s, 0, 4, /*version=*/1);  // same segment, newer version
  for (uint64_t n = 1000; n < 1000 + 3 * o.capacity_bytes / o.record_bytes(); n += 16) {
    PutMany(*s, n, 16);
    ASSERT_TRUE(GetOne(*s, 0, 1).ok());  // key 0 stays hot
  }
  EXPECT_TRUE(GetOne(*s, 0, 1).ok());
  EXPECT_EQ(removed.count(Key(0)), 0u);
  EXPECT_EQ(removed[Key(1)], 1);
  EXPECT_TRUE(GetOne(*s, 1).IsNotFound());
}

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
}

TEST_P(DiskStoreTest, FlippedHeaderByteSkipsOnlyThatRecordAtOpen) {
  DiskOptions o = Options(dir_.path(), GetParam());
  {
    auto s = OpenOrDie(o);
    PutMany(*s, 0, 5);
  }
  auto files = SegmentFiles(dir_.path());
  ASSERT_EQ(files.size(), 1u);
  FlipByte(files[0], kPageBytes + 2 * o.record_bytes() + 20);  // record 2's key
  auto s = OpenOrDie(o);
  EXPECT_TRUE(GetOne(*s, 2).IsNotFound());
  for (uint64_t n : {0, 1, 3, 4}) EXPECT_TRUE(GetOne(*s, n).ok()) << n;
  EXPECT_GE(s->stats().corruptions, 1u);
}

// Two sessions: segment 1 (sealed, keys 0..4) and segment 2 (the newest, keys 5..9).
std::vector<std::string> TwoSegments(const DiskOptions& o) {
  {
    auto s = OpenOrDie(o);
    PutMany(*s, 0, 5);
  }
  {
    auto s = OpenOrDie(o);
    PutMany(*s, 5, 5);
  }
  auto files = SegmentFiles(o.path);
  std::sort(files.begin(), files.end());
  return files;
}

// A checksummed header with an impossible length in a sealed segment was taken for a torn
// tail: open truncated the file there, deleting the valid records behind it.
TEST_P(DiskStoreTest, ImpossibleLengthInASealedSegmentLosesOnlyThatRecord) {
  DiskOptions o = Options(dir_.path(), GetParam());
  const std::vector<std::string> files = TwoSegments(o);
  ASSERT_EQ(files.size(), 2u);
  const uint64_t size_before = std::filesystem::file_size(files[0]);
  {
    const int fd = ::open(files[0].c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    std::vector<std::byte> page(kPageBytes);
    const off_t at = static_cast<off_t>(kPageBytes + 2 * o.record_bytes());  // record 2
    ASSERT_EQ(::pread(fd, page.data(), kPageBytes, at), ssize_t(kPageBytes));
    ParseError err;
    std::optional<RecordHeader> h = ParseRecordHeader(page, &err);
    ASSERT_TRUE(h.has_value());
    h->payload_bytes = uint64_t{1} << 40;
    EncodeRecordHeader(*h, page);
    ASSERT_EQ(::pwrite(fd, page.data(), kPageBytes, at), ssize_t(kPageBytes));
    ::close(fd);
  }
  auto s = OpenOrDie(o);
  EXPECT_TRUE(GetOne(*s, 2).IsNotFound());
  for (uint64_t n : {0, 1, 3, 4, 5, 9}) EXPECT_TRUE(GetOne(*s, n).ok()) << n;
  EXPECT_GE(s->stats().corruptions, 1u);
  EXPECT_EQ(std::filesystem::file_size(files[0]), size_before);
}

// Only the newest segment can end in a torn write: a sealed one whose last record no longer
// parses is corrupt, reported as such and left whole (not trimmed as if a crash had cut it).
TEST_P(DiskStoreTest, UnparsableEndOfASealedSegmentIsCorruptionAndIsKept) {
  DiskOptions o = Options(dir_.path(), GetParam());
  const std::vector<std::string> files = TwoSegments(o);
  ASSERT_EQ(files.size(), 2u);
  const uint64_t size_before = std::filesystem::file_size(files[0]);
  FlipByte(files[0], kPageBytes + 4 * o.record_bytes() + 20);  // record 4's key
  auto s = OpenOrDie(o);
  EXPECT_TRUE(GetOne(*s, 4).IsNotFound());
  for (uint64_t n : {0, 1, 2, 3, 5, 9}) EXPECT_TRUE(GetOne(*s, n).ok()) << n;
  EXPECT_EQ(s->stats().corruptions, 1u);
  EXPECT_EQ(std::filesystem::file_size(files[0]), size_before);
}

TEST_P(DiskStoreTest, TornRecordsOfACrashedSegmentAreSkippedAndTrimmed) {
  DiskOptions o = Options(dir_.path(), GetParam());
  {
    auto s = OpenOrDie(o);
    PutMany(*s, 0, 5);
  }
  auto files = SegmentFiles(dir_.path());
  ASSERT_EQ(files.size(), 1u);
  const uint64_t end = std::filesystem::file_size(files[0]);
  const uint64_t rec = o.record_bytes();
  // What a crash leaves when writes complete out of order: key 5's header with half its
  // payload, key 6 complete after it, key 7's header with no payload, then preallocated zeros.
  auto record = [&](uint64_t n, uint64_t seq, size_t payload_bytes_written) {
    std::vector<std::byte> r(rec);
    const std::vector<std::byte> p = Payload(n);
    RecordHeader h;
    h.key = Key(n);
    h.payload_bytes = kBlock;
    h.layout_fingerprint = kFingerprint;
    h.sequence = seq;
    h.payload_checksum = Xxh3(p);
    EncodeRecordHeader(h, std::span<std::byte>(r).first(kPageBytes));
    std::memcpy(r.data() + kPageBytes, p.data(), payload_bytes_written);
    return r;
  };
  {
    const int fd = ::open(files[0].c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    const auto r5 = record(5, 1000, kBlock / 2), r6 = record(6, 1001, kBlock),
               r7 = record(7, 1002, 0);
    ASSERT_EQ(::pwrite(fd, r5.data(), rec, static_cast<off_t>(end)), ssize_t(rec));
    ASSERT_EQ(::pwrite(fd, r6.data(), rec, static_cast<off_t>(end + rec)), ssize_t(rec));
    ASSERT_EQ(::pwrite(fd, r7.data(), rec, static_cast<off_t>(end + 2 * rec)), ssize_t(rec));
    ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(end + 3 * rec + 8 * kPageBytes)), 0);
    ::close(fd);
  }
  auto s = OpenOrDie(o);
  for (uint64_t n : {0, 1, 2, 3, 4, 6}) EXPECT_TRUE(GetOne(*s, n).ok()) << n;
  EXPECT_TRUE(GetOne(*s, 5).IsNotFound());
  EXPECT_TRUE(GetOne(*s, 7).IsNotFound());
  EXPECT_EQ(s->stats().corruptions, 0u);  // torn, never acknowledged: not corruption
  EXPECT_EQ(std::filesystem::file_size(files[0]), end + 2 * rec);  // trimmed after key 6
  PutMany(*s, 7, 1);
  s.reset();
  s = OpenOrDie(o);
  for (uint64_t n : {0, 1, 2, 3, 4, 6, 7}) EXPECT_TRUE(GetOne(*s, n).ok()) << n;
}

TEST_P(DiskStoreTest, FutureFormatVersionIsRefused) {
  DiskOptions o = Options(dir_.path(), GetParam());
  {
    auto s = OpenOrDie(o);
    PutMany(*s, 0, 2);
  }
  auto files = SegmentFiles(dir_.path());
  ASSERT_FALSE(files.empty());
  const int fd = ::open(files[0].c_str(), O_RDWR);
  const uint32_t future = kFormatVersion + 1;
  ASSERT_EQ(::pwrite(fd, &future, 4, 8), 4);
  ::close(fd);
  auto r = DiskStore::Open(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("newer"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find(files[0]), std::string::npos) << r.status().message();
}

TEST_P(DiskStoreTest, ForeignLayoutIsRefused) {
  DiskOptions o = Options(dir_.path(), GetParam());
  {
    auto s = OpenOrDie(o);
    PutMany(*s, 0, 2);
  }
  o.layout_fingerprint ^= 1;
  auto r = DiskStore::Open(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("layout fingerprint"), std::string::npos)
      << r.status().message();
}

TEST_P(DiskStoreTest, SecondOpenOfTheSameDirectoryIsUnavailable) {
  auto s = OpenOrDie(Options(dir_.path(), GetParam()));
  auto r = DiskStore::Open(Options(dir_.path(), GetParam()));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
}

// The lock was a LOCK file: deleting it let a second writer in, which truncated the first
// one's active segment. Whatever a user deletes in the directory, the second open is refused.
TEST_P(DiskStoreTest, DeletingFilesInTheDirectoryDoesNotLetASecondWriterIn) {
  auto s = OpenOrDie(Options(dir_.path(), GetParam()));
  PutMany(*s, 0, 3);
  for (const auto& e : std::filesystem::directory_iterator(dir_.path())) {
    if (!ParseSegmentFileName(e.path().filename().string())) std::filesystem::remove(e.path());
  }
  auto r = DiskStore::Open(Options(dir_.path(), GetParam()));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable) << r.status().ToString();
  for (uint64_t n = 0; n < 3; ++n) EXPECT_TRUE(GetOne(*s, n).ok()) << n;
}

TEST_P(DiskStoreTest, SyncPolicies) {
  {
    DiskOptions o = Options(dir_.path() + "/batch", GetParam());
    o.sync = SyncPolicy::kBatch;
    auto s = OpenOrDie(o);
    PutMany(*s, 0, 3);
    EXPECT_TRUE(s->IsDurable(Key(0)));
    EXPECT_TRUE(s->IsDurable(Key(2)));
    EXPECT_FALSE(s->IsDurable(Key(3)));
  }
  {
    DiskOptions o = Options(dir_.path() + "/none", GetParam());
    o.sync = SyncPolicy::kNone;
    auto s = OpenOrDie(o);
    PutMany(*s, 0, 3);
    EXPECT_FALSE(s->IsDurable(Key(0)));
    ASSERT_TRUE(s->Sync().ok());
    EXPECT_TRUE(s->IsDurable(Key(0)));
    PutMany(*s, 3, 1);
    EXPECT_FALSE(s->IsDurable(Key(3)));
  }
  {
    DiskOptions o = Options(dir_.path() + "/interval", GetParam());
    o.sync = SyncPolicy::kInterval;
    o.sync_interval_ms = 5;
    auto s = OpenOrDie(o);
    PutMany(*s, 0, 3);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!s->IsDurable(Key(2)) && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::yield();
    }
    EXPECT_TRUE(s->IsDurable(Key(2)));
  }
}

TEST_P(DiskStoreTest, ConcurrentReadsWhileWritingServeExactBytes) {
  DiskOptions o = Options(dir_.path(), GetParam());
  o.capacity_bytes = 64 << 20;  // no eviction: every acknowledged block must be readable
  o.sync = SyncPolicy::kNone;
  auto s = OpenOrDie(o);
  std::atomic<uint64_t> acked{0};
  constexpr uint64_t kTotal = 600;
  std::atomic<uint64_t> bad{0}, reads{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < 3; ++t) {
    readers.emplace_back([&, t] {
      std::mt19937_64 rng(t);
      while (acked.load() < kTotal) {
        const uint64_t hi = acked.load();
        if (hi == 0) continue;
        const uint64_t n = rng() % hi;
        if (!GetOne(*s, n).ok()) bad.fetch_add(1);
        reads.fetch_add(1);
      }
    });
  }
  for (uint64_t n = 0; n < kTotal; n += 4) {
    PutMany(*s, n, 4);
    acked.store(n + 4);
  }
  for (auto& r : readers) r.join();
  EXPECT_EQ(bad.load(), 0u);
  EXPECT_GT(reads.load(), 0u);
}

TEST_P(DiskStoreTest, OptionsNameTheBadField) {
  DiskOptions o = Options(dir_.path(), GetParam());
  o.capacity_bytes = o.segment_bytes;  // one segment only
  Status st = o.Validate();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("capacity_bytes"), std::string::npos) << st.message();
  o = Options(dir_.path(), GetParam());
  o.segment_bytes = 4096;
  EXPECT_NE(o.Validate().message().find("segment_bytes"), std::string::npos);
  o = Options(dir_.path(), GetParam());
  o.queue_depth = 0;
  EXPECT_NE(o.Validate().message().find("queue_depth"), std::string::npos);
  o = Options("", GetParam());
  EXPECT_NE(o.Validate().message().find("path"), std::string::npos);
  // The default segment size follows a small capacity.
  o = Options(dir_.path(), GetParam());
  o.segment_bytes = 0;
  EXPECT_EQ(o.effective_segment_bytes(), 2u << 20);
  EXPECT_TRUE(o.Validate().ok());
}

TEST_P(DiskStoreTest, StatsReportTheBackendAndBuffers) {
  DiskOptions o = Options(dir_.path(), GetParam());
  o.register_buffers = false;
  auto s = OpenOrDie(o);
  DiskStats st = s->stats();
  EXPECT_FALSE(st.registered_buffers);
  if (!st.direct_io) {
    EXPECT_NE(st.notes.find("O_DIRECT"), std::string::npos) << st.notes;
  }
  EXPECT_EQ(st.queue_depth, 8u);
  EXPECT_EQ(st.segments, 1u);
  EXPECT_EQ(st.used_bytes, kPageBytes);
}

// A roll whose new file cannot be created (here: no descriptor left) used to leave the store
// with no active segment, and the next Put dereferenced it. Now the Puts in flight fail naming
// the file and the error, the store keeps serving, and a later Put retries the roll.
TEST_P(DiskStoreTest, FailedSegmentRollKeepsTheStoreUsable) {
  DiskOptions o = Options(dir_.path(), GetParam());
  std::set<BlockKey> removed;
  auto s = OpenOrDie(
      o, [&](std::span<const BlockKey> keys) { removed.insert(keys.begin(), keys.end()); });
  const uint64_t per_segment = (o.segment_bytes - kPageBytes) / o.record_bytes();
  PutMany(*s, 0, per_segment);      // the active segment is full: the next Put rolls
  ASSERT_TRUE(GetOne(*s, 0).ok());  // a reader context exists before descriptors run out
  {
    NoMoreDescriptors no_fds;
    ASSERT_TRUE(no_fds.ok());
    for (uint64_t attempt = 0; attempt < 3; ++attempt) {
      const std::vector<Status> results = PutStatuses(*s, 1000 + 4 * attempt, 4);
      for (const Status& st : results) {
        EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
        EXPECT_NE(st.message().find(dir_.path() + "/seg-"), std::string::npos) << st.message();
        EXPECT_NE(st.message().find(std::strerror(EMFILE)), std::string::npos) << st.message();
      }
    }
    for (uint64_t n = 0; n < per_segment; ++n) EXPECT_TRUE(GetOne(*s, n).ok()) << n;
    EXPECT_EQ(s->stats().segments, 1u);
    EXPECT_LE(s->used_bytes(), o.capacity_bytes);
  }
  PutMany(*s, 1000, 12);  // the roll is retried and succeeds
  for (uint64_t n = 0; n < per_segment; ++n) EXPECT_TRUE(GetOne(*s, n).ok()) << n;
  for (uint64_t n = 1000; n < 1012; ++n) EXPECT_TRUE(GetOne(*s, n).ok()) << n;
  EXPECT_TRUE(removed.empty());
  s.reset();
  s = OpenOrDie(o);
  for (uint64_t n = 0; n < per_segment; ++n) EXPECT_TRUE(GetOne(*s, n).ok()) << n;
  for (uint64_t n = 1000; n < 1012; ++n) EXPECT_TRUE(GetOne(*s, n).ok()) << n;
}

// A new segment that cannot be preallocated (here: past RLIMIT_FSIZE, as on a full disk) fails
// the roll before anything is evicted: nothing stored before is lost, hot blocks included.
TEST_P(DiskStoreTest, FailedPreallocationOfANewSegmentEvictsNothing) {
  DiskOptions o = Options(dir_.path(), GetParam());
  o.capacity_bytes = 2 * o.segment_bytes;  // the next roll must evict the first segment
  std::set<BlockKey> removed;
  auto s = OpenOrDie(
      o, [&](std::span<const BlockKey> keys) { removed.insert(keys.begin(), keys.end()); });
  const uint64_t per_segment = (o.segment_bytes - kPageBytes) / o.record_bytes();
  PutMany(*s, 0, 2 * per_segment);                                   // two full segments
  for (uint64_t n = 0; n < 4; ++n) ASSERT_TRUE(GetOne(*s, n).ok());  // hot
  {
    FileSizeLimit limit(64 << 10);
    ASSERT_TRUE(limit.ok());
    for (const Status& st : PutStatuses(*s, 1000, 4)) {
      EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
      EXPECT_NE(st.message().find(dir_.path() + "/" + SegmentFileName(3)), std::string::npos)
          << st.message();
      EXPECT_NE(st.message().find(std::strerror(EFBIG)), std::string::npos) << st.message();
    }
    for (uint64_t n = 0; n < 4; ++n) EXPECT_TRUE(GetOne(*s, n).ok()) << n;
    for (uint64_t n = 4; n < 2 * per_segment; ++n) {  // Exists: a read would make them hot
      const BlockKey key = Key(n);
      bool found = false;
      s->Exists({&key, 1}, {&found, 1});
      EXPECT_TRUE(found) << n;
    }
    EXPECT_TRUE(removed.empty());
    EXPECT_LE(DirBytes(dir_.path()), o.capacity_bytes);
  }
  PutMany(*s, 1000, 4);  // retried: now the first segment goes, its hot blocks copied forward
  for (uint64_t n = 0; n < 4; ++n) EXPECT_TRUE(GetOne(*s, n).ok()) << n;
  for (uint64_t n = 4; n < per_segment; ++n) EXPECT_TRUE(removed.count(Key(n))) << n;
  for (uint64_t n = per_segment; n < 2 * per_segment; ++n) EXPECT_TRUE(GetOne(*s, n).ok()) << n;
  for (uint64_t n = 1000; n < 1004; ++n) EXPECT_TRUE(GetOne(*s, n).ok()) << n;
  EXPECT_LE(DirBytes(dir_.path()), o.capacity_bytes);
}

// A batch of twice the capacity used to write everything, evicting every older block and then
// its own head, which it reported as ResourceExhausted: a chain's tail is useless without its
// head. Now the head is stored, the tail is refused before it is written, and only what the
// head needs is evicted.
TEST_P(DiskStoreTest, BatchLargerThanTheCapacityKeepsItsHeadAndRefusesTheTail) {
  DiskOptions o = Options(dir_.path(), GetParam());
  o.sync = SyncPolicy::kNone;
  std::set<BlockKey> removed;
  auto s = OpenOrDie(
      o, [&](std::span<const BlockKey> keys) { removed.insert(keys.begin(), keys.end()); });
  const uint64_t per_segment = (o.segment_bytes - kPageBytes) / o.record_bytes();
  PutMany(*s, 0, 10);  // older blocks, sharing the batch's first segment
  const uint64_t n = 2 * o.capacity_bytes / o.record_bytes();
  const std::vector<Status> results = PutStatuses(*s, 1000, n);
  uint64_t kept = 0;
  while (kept < n && results[kept].ok()) ++kept;
  EXPECT_GE(kept, (o.capacity_bytes / o.segment_bytes - 2) * per_segment);
  ASSERT_LT(kept, n);
  for (uint64_t i = kept; i < n; ++i) {
    EXPECT_EQ(results[i].code(), StatusCode::kResourceExhausted) << i << results[i].ToString();
  }
  EXPECT_NE(results[kept].message().find(std::to_string(o.capacity_bytes)), std::string::npos)
      << results[kept].message();
  for (uint64_t i = 0; i < kept; ++i) EXPECT_TRUE(GetOne(*s, 1000 + i).ok()) << i;
  for (uint64_t i = kept; i < n; ++i) EXPECT_TRUE(GetOne(*s, 1000 + i).IsNotFound()) << i;
  for (uint64_t i = 0; i < n; ++i) EXPECT_EQ(removed.count(Key(1000 + i)), 0u) << i;
  for (uint64_t i = 0; i < 10; ++i) EXPECT_TRUE(GetOne(*s, i).ok()) << i;
  EXPECT_LE(s->used_bytes(), o.capacity_bytes);
  EXPECT_LE(DirBytes(dir_.path()), o.capacity_bytes);
  EXPECT_EQ(s->stats().evicted_segments, 0u);
  PutMany(*s, 5000, 16);  // the next batch evicts the oldest segment as usual
  for (uint64_t i = 5000; i < 5016; ++i) EXPECT_TRUE(GetOne(*s, i).ok()) << i;
  EXPECT_EQ(s->stats().evicted_segments, 1u);
  EXPECT_FALSE(removed.empty());
}

// An engine over a real one whose ring breaks when `breaks` is positive (one break each): the
// Wait that sees it fails as a broken ring's does, the requests it held are lost (they are run
// to the end first, so no real I/O outlives the test), and every later Wait fails too.
class BreakableEngine final : public IoEngine {
 public:
  BreakableEngine(std::unique_ptr<IoEngine> inner, std::atomic<int>* breaks)
      : inner_(std::move(inner)), breaks_(breaks) {
    queue_depth_ = inner_->queue_depth();
    registered_ = inner_->registered_buffers();
  }
  std::string_view name() const override { return inner_->name(); }
  IoBackend backend() const override { return inner_->backend(); }
  void Queue(const IoRequest& request) override {
    if (broken_) {
      ++lost_;
    } else {
      inner_->Queue(request);
    }
  }
  void Submit() override {
    if (!broken_) inner_->Submit();
  }
  uint32_t outstanding() const override { return broken_ ? lost_ : inner_->outstanding(); }
  Status Wait(uint32_t min_complete, std::vector<IoCompletion>* out) override {
    int left = broken_ ? 0 : breaks_->load();
    while (left > 0 && !breaks_->compare_exchange_weak(left, left - 1)) {
    }
    if (left > 0) {
      std::vector<IoCompletion> dropped;
      lost_ = inner_->outstanding();
      if (!inner_->Wait(lost_, &dropped).ok()) std::abort();
      broken_ = true;
    }
    if (broken_) return Status::Internal("io_uring_submit_and_wait: Bad address (injected)");
    return inner_->Wait(min_complete, out);
  }

 private:
  std::unique_ptr<IoEngine> inner_;
  std::atomic<int>* breaks_;
  bool broken_ = false;
  uint32_t lost_ = 0;
};

// A writer whose ring broke used to keep it: its lost requests stayed outstanding and every
// later Put failed. Now the batch's blocks fail (a miss, recomputed), and the store goes on
// with pread/pwrite.
TEST(DiskStoreRingTest, BrokenRingFailsItsBlocksAndTheStoreGoesOnWithPread) {
  ::kvtier::testing::TempDir dir;
  std::atomic<int> breaks{0};
  DiskOptions o = Options(dir.path(), IoBackend::kAuto);
  o.make_io_engine = [&](const IoEngineOptions& eo) -> Result<std::unique_ptr<IoEngine>> {
    KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<IoEngine> inner, MakeIoEngine(eo));
    if (eo.backend == IoBackend::kSync) return inner;  // asked for plain pread/pwrite
    return std::unique_ptr<IoEngine>(new BreakableEngine(std::move(inner), &breaks));
  };
  auto s = OpenOrDie(o);
  ASSERT_NE(s, nullptr);
  PutMany(*s, 0, 8);
  ASSERT_TRUE(GetOne(*s, 0).ok());  // a reader context on a breakable ring, pooled

  breaks.store(1);  // the writer's ring breaks under the next batch
  for (const Status& st : PutStatuses(*s, 100, 8)) {
    EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
    EXPECT_NE(st.message().find("injected"), std::string::npos) << st.message();
  }
  EXPECT_EQ(breaks.load(), 0);
  EXPECT_EQ(s->stats().io_backend, "pread/pwrite");
  EXPECT_NE(s->stats().notes.find("io_uring ring failed"), std::string::npos);
  PutMany(*s, 200, 60);  // across a roll, on the new writer
  for (uint64_t n = 0; n < 8; ++n) EXPECT_TRUE(GetOne(*s, n).ok()) << n;
  for (uint64_t n = 100; n < 108; ++n) EXPECT_TRUE(GetOne(*s, n).IsNotFound()) << n;

  breaks.store(1);  // now the pooled reader's ring breaks
  {
    std::vector<std::vector<std::byte>> bufs(4, std::vector<std::byte>(kBlock));
    std::vector<std::span<std::byte>> out(bufs.begin(), bufs.end());
    std::vector<BlockKey> keys = {Key(200), Key(201), Key(202), Key(203)};
    std::vector<Status> results(4);
    s->Get(keys, out, results);
    for (const Status& st : results)
      EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
  }
  EXPECT_EQ(breaks.load(), 0);
  breaks.store(1);  // would break a new ring: the next reader has none
  for (uint64_t n = 200; n < 260; ++n) EXPECT_TRUE(GetOne(*s, n).ok()) << n;
  EXPECT_EQ(breaks.load(), 1);

  s.reset();
  o.make_io_engine = nullptr;
  s = OpenOrDie(o);
  for (uint64_t n = 0; n < 8; ++n) EXPECT_TRUE(GetOne(*s, n).ok()) << n;
  for (uint64_t n = 200; n < 260; ++n) EXPECT_TRUE(GetOne(*s, n).ok()) << n;
  for (uint64_t n = 100; n < 108; ++n) {
    const Status st = GetOne(*s, n);  // written or not, never wrong bytes
    EXPECT_TRUE(st.ok() || st.IsNotFound()) << st.ToString();
  }
}

bool UringAvailable() {
  IoEngineOptions probe;
  probe.backend = IoBackend::kUring;
  return MakeIoEngine(probe).ok();
}

// Runs checks in a forked child (for limits and ids the test process must keep) that an alarm
// kills after 10 s. Returns the child's result (0: every check passed, else the failed check's
// number), or -signal when a signal ended it.
int InChild(int (*checks)()) {
  const pid_t pid = ::fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    ::alarm(10);
    _exit(checks());
  }
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
}

// Under `ulimit -f` below the segment size the process was killed by SIGXFSZ with no message
// (at open, preallocating the first segment). Now the open refuses with the limit named, and a
// limit lowered after open fails the write with EFBIG (Unavailable) instead of killing.
TEST(DiskStoreLimitsTest, FileSizeLimitIsRefusedOrReportedNeverKills) {
  const int rc = InChild([] {
    ::signal(SIGXFSZ, SIG_DFL);
    kvtier::testing::TempDir dir;
    DiskOptions o = Options(dir.path() + "/tier", IoBackend::kSync);
    rlimit saved{};
    ::getrlimit(RLIMIT_FSIZE, &saved);
    rlimit lim = saved;
    lim.rlim_cur = 64 << 10;
    if (::setrlimit(RLIMIT_FSIZE, &lim) != 0) return 10;
    auto refused = DiskStore::Open(o);
    if (refused.ok()) return 11;
    if (refused.status().code() != StatusCode::kResourceExhausted) return 12;
    if (refused.status().message().find("ulimit -f") == std::string::npos) return 13;
    if (::setrlimit(RLIMIT_FSIZE, &saved) != 0) return 14;
    int result = 0;
    {
      auto s = DiskStore::Open(o);
      if (!s.ok()) return 15;
      const uint64_t per_segment = (o.segment_bytes - kPageBytes) / o.record_bytes();
      PutMany(**s, 0, per_segment);  // full: the next Put rolls a segment
      if (::setrlimit(RLIMIT_FSIZE, &lim) != 0) return 16;
      for (const Status& st : PutStatuses(**s, 1000, 2)) {
        if (st.code() != StatusCode::kUnavailable) result = 17;
        if (st.message().find(std::strerror(EFBIG)) == std::string::npos) result = 18;
      }
    }
    return result;
  });
  EXPECT_EQ(rc, 0) << (rc < 0 ? "killed by signal " + std::to_string(-rc) : "check failed");
}

// One descriptor per segment: a tier of more segments than `ulimit -n` allows opened and then
// failed batch after batch. Now the soft limit is raised to what the tier needs when the hard
// limit allows, and the open is refused, naming the limit, when it does not.
TEST(DiskStoreLimitsTest, OpenFileLimitIsRaisedOrTheOpenRefused) {
  const int rc = InChild([] {
    kvtier::testing::TempDir dir;
    DiskOptions o = Options(dir.path() + "/tier", IoBackend::kSync);
    o.capacity_bytes = 256 << 20;  // 256 segments of 1 MiB
    rlimit lim{};
    lim.rlim_cur = 64;
    lim.rlim_max = 4096;
    if (::setrlimit(RLIMIT_NOFILE, &lim) != 0) return 10;
    int result = 0;
    {
      auto s = DiskStore::Open(o);
      if (!s.ok()) return 11;
      ::getrlimit(RLIMIT_NOFILE, &lim);
      if (lim.rlim_cur < 256) result = 12;
    }
    lim.rlim_cur = 64;
    lim.rlim_max = 64;
    if (::setrlimit(RLIMIT_NOFILE, &lim) != 0) return 13;
    auto refused = DiskStore::Open(o);
    if (refused.ok()) return 14;
    if (refused.status().code() != StatusCode::kResourceExhausted) return 15;
    if (refused.status().message().find("ulimit -n") == std::string::npos) return 16;
    return result;
  });
  EXPECT_EQ(rc, 0) << (rc < 0 ? "killed by signal " + std::to_string(-rc) : "check failed");
}

// Mounts a tmpfs of `bytes` at dir in a private mount namespace (the calling process only: run
// it in a child). False when this process may not (no CAP_SYS_ADMIN, no user namespaces).
bool MountSmallFilesystem(const std::string& dir, uint64_t bytes) {
  if (::unshare(CLONE_NEWNS) != 0) {
    const uid_t uid = ::getuid();
    const gid_t gid = ::getgid();
    if (::unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0) return false;
    std::ofstream("/proc/self/setgroups") << "deny";
    std::ofstream("/proc/self/uid_map") << "0 " << uid << " 1";
    std::ofstream("/proc/self/gid_map") << "0 " << gid << " 1";
  }
  if (::mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) return false;
  const std::string opts = "size=" + std::to_string(bytes);
  return ::mount("tmpfs", dir.c_str(), "tmpfs", 0, opts.c_str()) == 0;
}

// Fills the filesystem of dir until a write fails (ENOSPC).
void FillFilesystem(const std::string& dir) {
  const int fd = ::open((dir + "/filler").c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  std::vector<char> chunk(4096, 'f');
  while (fd >= 0 && ::write(fd, chunk.data(), chunk.size()) == ssize_t(chunk.size())) {
  }
  if (fd >= 0) ::close(fd);
}

// A full filesystem: every Put batch failed (and logged), nothing was evicted to make room, and
// the next process could not open the tier at all, its blocks unusable. Now the capacity is
// clamped to what the filesystem holds, a roll that meets ENOSPC evicts the oldest segment and
// tries again, and a tier that cannot start a segment opens read-only and serves its blocks.
TEST(DiskStoreLimitsTest, FullFilesystemEvictsForRoomAndOpensReadOnly) {
  kvtier::testing::TempDir dir;
  static std::string path;
  path = dir.path();
  const int rc = InChild([] {
    if (!MountSmallFilesystem(path, 4 << 20)) return 77;
    DiskOptions o = Options(path + "/tier", IoBackend::kSync);
    o.capacity_bytes = 64 << 20;  // far more than the 4 MiB filesystem
    const uint64_t per_segment = (o.segment_bytes - kPageBytes) / o.record_bytes();
    uint64_t next = 0;
    {
      auto s = DiskStore::Open(o);
      if (!s.ok()) return 10;
      if ((*s)->stats().capacity_bytes > (4u << 20)) return 11;
      for (int i = 0; i < 6; ++i, next += per_segment / 2) {  // 3 segments' worth
        for (const Status& st : PutStatuses(**s, next, per_segment / 2)) {
          if (!st.ok()) return 12;
        }
      }
      FillFilesystem(path);  // another file takes the rest: the next roll meets ENOSPC
      for (int i = 0; i < 4; ++i, next += per_segment / 2) {
        for (const Status& st : PutStatuses(**s, next, per_segment / 2)) {
          if (!st.ok()) return 13;
        }
      }
      if ((*s)->stats().space_evictions == 0) return 14;
    }
    FillFilesystem(path);  // what the close gave back, too
    auto s = DiskStore::Open(o);
    if (!s.ok()) return 15;  // read-only, not refused
    if (!GetOne(**s, next - 1).ok()) return 16;
    // A Put makes room by evicting the oldest segment.
    for (const Status& st : PutStatuses(**s, next, 2)) {
      if (!st.ok()) return 17;
    }
    if (!GetOne(**s, next).ok()) return 18;
    return 0;
  });
  if (rc == 77) GTEST_SKIP() << "cannot mount a small tmpfs here (needs root or user namespaces)";
  EXPECT_EQ(rc, 0) << (rc < 0 ? "killed by signal " + std::to_string(-rc) : "check failed");
}

// A completion that never arrives (here: a read of an empty pipe) used to block Wait forever.
// Now Wait fails after stall_timeout_ms, and the engine stays failed. Run in a child that an
// alarm kills if Wait hangs.
TEST(DiskIoEngineTest, LostCompletionFailsTheWaitInsteadOfHanging) {
  if (!UringAvailable()) GTEST_SKIP() << "io_uring unavailable here";
  const int rc = InChild([] {
    int fds[2];
    if (::pipe(fds) != 0) return 10;
    AlignedBuffer buf(4096);
    IoEngineOptions o;
    o.backend = IoBackend::kUring;
    o.queue_depth = 4;
    o.stall_timeout_ms = 200;
    auto engine = MakeIoEngine(o);
    if (!engine.ok()) return 11;
    (*engine)->Queue(IoRequest{false, fds[0], buf.data(), 4096, 0, -1, 7});
    std::vector<IoCompletion> done;
    const auto t0 = std::chrono::steady_clock::now();
    const Status st = (*engine)->Wait(1, &done);
    if (st.ok()) return 12;
    if (std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(150)) return 13;
    if (st.message().find("no progress") == std::string::npos) return 14;
    (*engine)->Queue(IoRequest{false, fds[0], buf.data(), 4096, 0, -1, 8});
    if ((*engine)->Wait(1, &done).ok() || !done.empty()) return 15;  // failed for good
    (*engine).reset();  // the ring goes before its buffer
    return 0;
  });
  ASSERT_NE(rc, -SIGALRM) << "Wait hung";
  EXPECT_EQ(rc, 0) << "child check " << rc << " failed";
}

// io_uring pins registered buffers against RLIMIT_MEMLOCK (8 MiB for non-root here): a refused
// registration must fall back to plain buffers and say why. Run in a child whose limit is
// lowered (and, as root, which drops to nobody, since CAP_IPC_LOCK ignores the limit).
TEST(DiskIoEngineTest, RefusedBufferRegistrationFallsBackAndSaysWhy) {
  if (!UringAvailable()) GTEST_SKIP() << "io_uring unavailable here";
  const int rc = InChild([] {
    rlimit lim{1 << 20, 1 << 20};
    if (::setrlimit(RLIMIT_MEMLOCK, &lim) != 0) return 10;
    if (::geteuid() == 0 && ::setresuid(65534, 65534, 65534) != 0) return 11;
    AlignedBuffer buf(4 << 20);
    IoEngineOptions o;
    o.backend = IoBackend::kUring;
    o.queue_depth = 4;
    o.buffers = {buf.span()};
    auto engine = MakeIoEngine(o);
    if (!engine.ok()) return 12;
    if ((*engine)->registered_buffers()) return 13;
    if ((*engine)->note().find("RLIMIT_MEMLOCK") == std::string::npos) return 14;
    // Still usable without registration.
    AlignedBuffer data(4096);
    std::memset(data.data(), 0x5a, 4096);
    FILE* f = std::tmpfile();
    if (f == nullptr) return 15;
    (*engine)->Queue(IoRequest{true, ::fileno(f), data.data(), 4096, 0, 0, 1});
    std::vector<IoCompletion> done;
    if (!(*engine)->Wait(1, &done).ok() || done.size() != 1 || done[0].result != 4096) return 16;
    return 0;
  });
  if (rc == 13) GTEST_SKIP() << "the kernel registered past RLIMIT_MEMLOCK";
  EXPECT_EQ(rc, 0) << "child check " << rc << " failed";
}

INSTANTIATE_TEST_SUITE_P(Backends, DiskStoreTest,
                         ::testing::Values(IoBackend::kUring, IoBackend::kSync),
                         [](const ::testing::TestParamInfo<IoBackend>& p) {
                           return p.param == IoBackend::kSync ? std::string("Sync")
                                                              : std::string("Uring");
                         });

}  // namespace
}  // namespace kvtier::disk
