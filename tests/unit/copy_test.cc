// CopyBlock (streaming stores for large copies) and CopyPool (a batch split across threads).
#include "common/copy.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <random>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "kvtier/block_key.h"
#include "testing/test_util.h"

namespace kvtier {
namespace {

// Sizes around every path (small, the streaming threshold, odd tails) at odd alignments, with
// guard bytes on both sides that must stay untouched.
TEST(CopyBlockTest, EveryByteAndNothingBeyond) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{15}, size_t{64}, size_t{4095}, size_t{65536},
                   size_t{65537}, size_t{256} << 10, (size_t{1} << 20) + 13}) {
    for (size_t misalign : {size_t{0}, size_t{1}, size_t{7}, size_t{33}}) {
      auto src = testing::MakeBlock(n + 64, static_cast<uint32_t>(n + misalign));
      std::vector<std::byte> dst(n + 128, std::byte{0xAB});
      CopyBlock(dst.data() + 32 + misalign, src.data() + misalign, n);
      ASSERT_EQ(std::memcmp(dst.data() + 32 + misalign, src.data() + misalign, n), 0)
          << n << " bytes at +" << misalign;
      for (size_t i = 0; i < 32 + misalign; ++i) ASSERT_EQ(dst[i], std::byte{0xAB}) << n;
      for (size_t i = 32 + misalign + n; i < dst.size(); ++i)
        ASSERT_EQ(dst[i], std::byte{0xAB}) << n;
    }
  }
}

// The fused copy returns exactly Checksum64 of the bytes, across its chunk boundaries and
// tails, and copies as CopyBlock does.
TEST(CopyBlockChecksumTest, SameBytesAndSameChecksumAsTwoPasses) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{1023}, size_t{65535}, size_t{65536}, size_t{65537},
                   (size_t{256} << 10) + 17, (size_t{2} << 20)}) {
    for (size_t misalign : {size_t{0}, size_t{5}}) {
      auto src = testing::MakeBlock(n + 8, static_cast<uint32_t>(n * 3 + misalign));
      std::vector<std::byte> dst(n + 64, std::byte{0xCD});
      const uint64_t sum = CopyBlockChecksum(dst.data() + 16 + misalign, src.data() + misalign, n);
      ASSERT_EQ(sum, Checksum64(std::span(src).subspan(misalign, n))) << n << " +" << misalign;
      ASSERT_EQ(std::memcmp(dst.data() + 16 + misalign, src.data() + misalign, n), 0) << n;
      for (size_t i = 16 + misalign + n; i < dst.size(); ++i)
        ASSERT_EQ(dst[i], std::byte{0xCD}) << n;
    }
  }
}

// A batch of jobs of uneven sizes is split by bytes across threads (at 4 KiB boundaries that
// cut jobs in the middle): every byte lands, whatever the thread count.
TEST(CopyPoolTest, SplitsABatchAcrossThreadsByBytes) {
  for (int threads : {1, 2, 3, 4}) {
    CopyPool pool(threads);
    EXPECT_EQ(pool.threads(), threads);
    std::mt19937 rng(threads);
    std::vector<std::vector<std::byte>> srcs, dsts;
    std::vector<CopyJob> jobs;
    for (int j = 0; j < 37; ++j) {
      const size_t n = 1 + rng() % (300 << 10);
      srcs.push_back(testing::MakeBlock(n, rng()));
      dsts.emplace_back(n);
    }
    for (size_t j = 0; j < srcs.size(); ++j)
      jobs.push_back({dsts[j].data(), srcs[j].data(), srcs[j].size()});
    pool.Run(jobs, /*min_parallel_bytes=*/0);
    for (size_t j = 0; j < srcs.size(); ++j) ASSERT_EQ(srcs[j], dsts[j]) << threads << "/" << j;
  }
}

// CopyRange copies exactly bytes [begin, end) of the jobs' concatenation, whichever jobs the
// range starts, ends or lies in, and nothing of the others.
TEST(CopyRangeTest, CopiesExactlyTheRangeOfTheConcatenation) {
  const std::vector<size_t> sizes = {5, 0, 4096, 1, 70000, 33};
  size_t total = 0;
  for (size_t n : sizes) total += n;
  for (auto [begin, end] : std::vector<std::pair<size_t, size_t>>{{0, total},
                                                                  {0, 3},
                                                                  {3, 5},
                                                                  {4, 4102},
                                                                  {5, 4101},
                                                                  {4100, 4102},
                                                                  {4101, 74000},
                                                                  {total - 1, total}}) {
    std::vector<std::vector<std::byte>> srcs, dsts;
    std::vector<CopyJob> jobs;
    for (size_t j = 0; j < sizes.size(); ++j) {
      srcs.push_back(testing::MakeBlock(sizes[j], j + 1));
      dsts.emplace_back(sizes[j], std::byte{0xEE});
    }
    for (size_t j = 0; j < sizes.size(); ++j)
      jobs.push_back({dsts[j].data(), srcs[j].data(), sizes[j]});
    CopyRange(jobs, begin, end);
    size_t at = 0;
    for (size_t j = 0; j < sizes.size(); ++j)
      for (size_t i = 0; i < sizes[j]; ++i, ++at)
        ASSERT_EQ(dsts[j][i], at >= begin && at < end ? srcs[j][i] : std::byte{0xEE})
            << begin << ".." << end << " byte " << at;
  }
}

TEST(CopyPoolTest, ParallelForRunsEveryWorkerOnceAndTheCallerIsWorkerZero) {
  CopyPool pool(4);
  for (int round = 0; round < 50; ++round) {
    std::atomic<int> calls{0};
    std::vector<std::atomic<int>> seen(4);
    std::thread::id caller_id;
    const std::thread::id me = std::this_thread::get_id();
    pool.ParallelFor([&](int i, int n) {
      ASSERT_EQ(n, 4);
      ++seen[i];
      ++calls;
      if (i == 0) caller_id = std::this_thread::get_id();
    });
    EXPECT_EQ(calls.load(), 4);
    for (auto& s : seen) EXPECT_EQ(s.load(), 1);
    EXPECT_EQ(caller_id, me);
  }
}

TEST(CopyPoolTest, ConcurrentRunsAreSerialisedAndAllComplete) {
  CopyPool pool(2);
  std::vector<std::thread> callers;
  std::atomic<int> ok{0};
  for (int c = 0; c < 4; ++c)
    callers.emplace_back([&, c] {
      for (int r = 0; r < 20; ++r) {
        auto src = testing::MakeBlock(2 << 20, c * 100 + r);
        std::vector<std::byte> dst(src.size());
        CopyJob job{dst.data(), src.data(), src.size()};
        pool.Run({&job, 1});
        if (src == dst) ++ok;
      }
    });
  for (auto& t : callers) t.join();
  EXPECT_EQ(ok.load(), 80);
}

}  // namespace
}  // namespace kvtier
