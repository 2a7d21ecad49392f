// DiskStore's opening: recovery of torn and corrupt segments, refusal of foreign segments and of
// a directory in use, and the process and filesystem limits checked at open.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "testing/disk_store_util.h"
#include "tiers/disk/disk_store.h"
#include "tiers/disk/format.h"

namespace kvtier::disk {
namespace {

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

// A configured path that cannot be a directory is the user's to fix: InvalidArgument naming
// it, not Internal (a bug).
TEST_P(DiskStoreTest, PathThatCannotBeADirectoryIsInvalidArgument) {
  const std::string file = dir_.path() + "/a-file";
  std::fclose(std::fopen(file.c_str(), "w"));
  auto r = DiskStore::Open(Options(file + "/tier", GetParam()));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().ToString();
  EXPECT_NE(r.status().message().find(file + "/tier: mkdir: "), std::string::npos)
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

// Issue 27 item 4: on a 20 MiB filesystem a tier of 64 MiB in (default) 16 MiB segments kept
// two segments as its floor, met ENOSPC starting its second one and then failed every write
// for good: the only segment to evict was the one just sealed, which was never given up. Now
// the segments shrink so that the floor (and the next segment) fits, and the tier stores three
// filesystems' worth, showing itself degraded.
TEST(DiskStoreLimitsTest, FilesystemSmallerThanTwoSegmentsShrinksTheSegmentsAndGoesOn) {
  kvtier::testing::TempDir dir;
  static std::string path;
  path = dir.path();
  const int rc = InChild([] {
    constexpr uint64_t kFs = 20 << 20;
    if (!MountSmallFilesystem(path, kFs)) return 77;
    DiskOptions o = Options(path + "/tier", IoBackend::kSync);
    o.capacity_bytes = 64 << 20;
    o.segment_bytes = 0;  // the default: a quarter of the capacity, 16 MiB
    auto s = DiskStore::Open(o);
    if (!s.ok()) return 10;
    const DiskStats st = (*s)->stats();
    if (st.capacity_bytes + st.segment_bytes > kFs || st.capacity_bytes < 2 * st.segment_bytes)
      return 11;
    if (!st.degraded || st.write_failing) return 12;
    uint64_t next = 0;
    for (; next < 3 * kFs / o.record_bytes(); next += 32) {
      for (const Status& r : PutStatuses(**s, next, 32)) {
        if (!r.ok()) return 13;
      }
    }
    if (!GetOne(**s, next - 1).ok()) return 14;
    if ((*s)->stats().write_failing || (*s)->stats().evicted_segments == 0) return 15;
    return 0;
  });
  if (rc == 77) GTEST_SKIP() << "cannot mount a small tmpfs here (needs root or user namespaces)";
  EXPECT_EQ(rc, 0) << (rc < 0 ? "killed by signal " + std::to_string(-rc) : "check failed");
}

// Another file takes all the room while the tier holds one segment: the roll met ENOSPC and
// had nothing to evict but the segment it had just sealed, which it kept, so every write failed
// from then on. Now that segment goes too (a tier that stores nothing new is worse than one
// that drops its oldest blocks), and the tier goes on with the room it frees.
TEST(DiskStoreLimitsTest, FilesystemFilledByAnotherFileEvictsTheLastSegmentAndGoesOn) {
  kvtier::testing::TempDir dir;
  static std::string path;
  path = dir.path();
  const int rc = InChild([] {
    if (!MountSmallFilesystem(path, 8 << 20)) return 77;
    DiskOptions o = Options(path + "/tier", IoBackend::kSync);  // 1 MiB segments
    const uint64_t per_segment = (o.segment_bytes - kPageBytes) / o.record_bytes();
    auto s = DiskStore::Open(o);
    if (!s.ok()) return 10;
    PutMany(**s, 0, 2);
    FillFilesystem(path);  // the active segment is all the tier holds
    uint64_t next = 2;
    for (int i = 0; i < 6; ++i, next += per_segment / 2) {  // three segments' worth
      for (const Status& r : PutStatuses(**s, next, per_segment / 2)) {
        if (!r.ok()) return 11;
      }
    }
    if (!GetOne(**s, next - 1).ok()) return 12;
    const DiskStats st = (*s)->stats();
    if (st.space_evictions == 0 || !st.degraded || st.write_failing) return 13;
    return 0;
  });
  if (rc == 77) GTEST_SKIP() << "cannot mount a small tmpfs here (needs root or user namespaces)";
  EXPECT_EQ(rc, 0) << (rc < 0 ? "killed by signal " + std::to_string(-rc) : "check failed");
}

INSTANTIATE_TEST_SUITE_P(Backends, DiskStoreTest,
                         ::testing::Values(IoBackend::kUring, IoBackend::kSync), BackendName);

}  // namespace
}  // namespace kvtier::disk
