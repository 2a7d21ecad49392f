// DiskStore's own surface: round trips, restart, erase, durability policies, concurrent reads,
// options and stats. The writer, reader, recovery and I/O engine have test files of their own
// (disk_writer_test.cc, disk_reader_test.cc, disk_recovery_test.cc, disk_io_engine_test.cc).
#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <thread>
#include <vector>

#include "testing/disk_store_util.h"
#include "tiers/disk/disk_store.h"
#include "tiers/disk/format.h"

namespace kvtier::disk {
namespace {

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

INSTANTIATE_TEST_SUITE_P(Backends, DiskStoreTest,
                         ::testing::Values(IoBackend::kUring, IoBackend::kSync), BackendName);

}  // namespace
}  // namespace kvtier::disk
