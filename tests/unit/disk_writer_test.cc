// DiskStore's writer side: eviction under the capacity, reinsertion of hot blocks, and the
// failures of the system under it (a segment that cannot be started or preallocated, a batch
// larger than the capacity, an io_uring ring that breaks).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "testing/disk_store_util.h"
#include "tiers/disk/disk_store.h"
#include "tiers/disk/format.h"

namespace kvtier::disk {
namespace {

// While alive, the process cannot open another file descriptor (EMFILE): the soft
// RLIMIT_NOFILE is lowered to the lowest free descriptor. Works as root too.
class NoMoreDescriptors {
 public:
  NoMoreDescriptors() {
    // UBSan checks a polymorphic type the first time it meets it, and that check needs a
    // descriptor: the store's first fmt::format, with none left, was reported as an invalid
    // vptr of fmt's buffer. Format once while descriptors remain.
    if (fmt::format("{}", std::string("descriptors run out")).empty()) std::abort();
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

uint64_t DirBytes(const std::string& dir) {
  uint64_t total = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().filename().string().starts_with("seg-")) total += e.file_size();
  }
  return total;
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
class BreakableEngine final : public ForwardingEngine {
 public:
  BreakableEngine(std::unique_ptr<IoEngine> inner, std::atomic<int>* breaks)
      : ForwardingEngine(std::move(inner)), breaks_(breaks) {}
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

INSTANTIATE_TEST_SUITE_P(Backends, DiskStoreTest,
                         ::testing::Values(IoBackend::kUring, IoBackend::kSync), BackendName);

}  // namespace
}  // namespace kvtier::disk
