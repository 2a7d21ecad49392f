#include "transfer/transfer.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "testing/test_util.h"

namespace kvtier {
namespace {

using std::chrono::milliseconds;
constexpr milliseconds kLong{30000};

std::unique_ptr<TransferEngine> Engine(int threads, size_t queue_bytes = size_t{256} << 20,
                                       size_t chunk = size_t{4} << 20) {
  TransferOptions o;
  o.threads = threads;
  o.queue_bytes = queue_bytes;
  o.chunk_bytes = chunk;
  auto e = TransferEngine::Open(o);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return std::move(e).value();
}

TEST(TransferEngineTest, OptionsAreValidated) {
  TransferOptions o;
  o.threads = 0;
  EXPECT_EQ(TransferEngine::Open(o).status().code(), StatusCode::kInvalidArgument);
  o.threads = 1;
  o.chunk_bytes = 100;
  EXPECT_NE(TransferEngine::Open(o).status().message().find("chunk_bytes"), std::string::npos);
}

TEST(TransferEngineTest, CopiesEveryByteAndCoalescesNeighbours) {
  auto engine = Engine(2);
  const size_t n = 64, piece = 4096;
  auto src = testing::MakeBlock(n * piece, 1);
  std::vector<std::byte> dst(n * piece);
  std::vector<CopySegment> segs;
  // Pieces in order and contiguous on both sides: one copy. A gap on one side breaks the run.
  for (size_t i = 0; i < n; ++i)
    segs.push_back({src.data() + i * piece, dst.data() + i * piece, piece, 0});
  auto h = engine->Prepare(segs, 1);
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->num_copies(), 1u);
  EXPECT_EQ(h->bytes(), n * piece);
  EXPECT_EQ(h->Poll(), TransferState::kPrepared);
  ASSERT_TRUE(engine->Post(*h, kLong).ok());
  ASSERT_TRUE(h->Wait(kLong).ok());
  EXPECT_EQ(h->Poll(), TransferState::kDone);
  EXPECT_EQ(std::memcmp(src.data(), dst.data(), dst.size()), 0);

  // Reversed order: nothing is adjacent in list order, so nothing merges.
  std::reverse(segs.begin(), segs.end());
  auto h2 = engine->Prepare(segs, 1);
  ASSERT_TRUE(h2.ok());
  EXPECT_EQ(h2->num_copies(), n);
}

TEST(TransferEngineTest, LongSegmentsAreSplitIntoChunks) {
  auto engine = Engine(2, size_t{256} << 20, 64 << 10);
  auto src = testing::MakeBlock(1 << 20, 2);
  std::vector<std::byte> dst(src.size());
  CopySegment s{src.data(), dst.data(), src.size(), 0};
  auto h = engine->Prepare({&s, 1}, 1);
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->num_copies(), 16u);
  ASSERT_TRUE(engine->Post(*h, kLong).ok());
  ASSERT_TRUE(h->Wait(kLong).ok());
  EXPECT_EQ(src, dst);
}

TEST(TransferEngineTest, BadSegmentsAreNamed) {
  auto engine = Engine(1);
  std::vector<std::byte> a(16), b(16);
  CopySegment null_src{nullptr, b.data(), 16, 0};
  EXPECT_NE(engine->Prepare({&null_src, 1}, 1).status().message().find("segment 0"),
            std::string::npos);
  CopySegment high{a.data(), b.data(), 16, 3};
  auto r = engine->Prepare({&high, 1}, 2);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("layer 3"), std::string::npos);
  EXPECT_EQ(engine->Prepare({}, 0).status().code(), StatusCode::kInvalidArgument);
  TransferHandle empty;
  EXPECT_EQ(engine->Post(empty, kLong).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(empty.Wait(kLong).code(), StatusCode::kInvalidArgument);
}

TEST(TransferEngineTest, PostTwiceAndWaitUnpostedAreRefused) {
  auto engine = Engine(1);
  std::vector<std::byte> a(4096), b(4096);
  CopySegment s{a.data(), b.data(), a.size(), 0};
  auto h = engine->Prepare({&s, 1}, 1);
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->Wait(kLong).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(engine->Post(*h, kLong).ok());
  EXPECT_EQ(engine->Post(*h, kLong).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(h->Wait(kLong).ok());
}

TEST(TransferEngineTest, LayersCompleteInOrderWithOneWorker) {
  // One worker drains the FIFO in layer order, so when layer l is done every earlier layer is.
  auto engine = Engine(1);
  KvLayout layout{.num_layers = 8,
                  .num_kv_heads = 2,
                  .head_dim = 64,
                  .dtype = DType::kFp16,
                  .block_tokens = 16};
  const size_t bb = layout.bytes_per_block(), blocks = 32;
  auto src = testing::MakeBlock(bb * blocks, 3);
  std::vector<std::byte> dst(src.size());
  std::vector<std::span<const std::byte>> s;
  std::vector<std::span<std::byte>> d;
  for (size_t i = 0; i < blocks; ++i) {
    s.emplace_back(src.data() + i * bb, bb);
    d.emplace_back(dst.data() + i * bb, bb);
  }
  auto segs = LayerwiseSegments(layout, s, d);
  ASSERT_TRUE(segs.ok());
  EXPECT_EQ(segs->size(), blocks * layout.num_layers);
  auto h = engine->Prepare(*segs, layout.num_layers);
  ASSERT_TRUE(h.ok());
  ASSERT_TRUE(engine->Post(*h, kLong).ok());
  const size_t lb = layout.layer_bytes();
  for (uint32_t l = 0; l < layout.num_layers; ++l) {
    ASSERT_TRUE(h->WaitLayer(l, kLong).ok());
    for (size_t i = 0; i < blocks; ++i)
      ASSERT_EQ(std::memcmp(src.data() + i * bb + l * lb, dst.data() + i * bb + l * lb, lb), 0)
          << "layer " << l << " block " << i;
  }
  EXPECT_TRUE(h->Wait(kLong).ok());
  EXPECT_EQ(src, dst);
  EXPECT_EQ(h->WaitLayer(8, kLong).code(), StatusCode::kInvalidArgument);
}

TEST(TransferEngineTest, LayerwiseSegmentsRefuseWrongSizes) {
  KvLayout layout{.num_layers = 2,
                  .num_kv_heads = 1,
                  .head_dim = 64,
                  .dtype = DType::kFp16,
                  .block_tokens = 16};
  std::vector<std::byte> a(layout.bytes_per_block()), b(10);
  std::vector<std::span<const std::byte>> s{a};
  std::vector<std::span<std::byte>> d{b};
  EXPECT_EQ(LayerwiseSegments(layout, s, d).status().code(), StatusCode::kInvalidArgument);
}

TEST(TransferEngineTest, WaitTimesOutAndTheTransferGoesOn) {
  auto engine = Engine(1, size_t{1} << 30, 64 << 10);
  // 128 MiB into never-touched pages with one worker takes far longer than 1 ms anywhere.
  const size_t n = size_t{128} << 20;
  std::vector<std::byte> src(n, std::byte{9});
  std::unique_ptr<std::byte[]> dst(new std::byte[n]);
  CopySegment s{src.data(), dst.get(), n, 0};
  auto h = engine->Prepare({&s, 1}, 1);
  ASSERT_TRUE(h.ok());
  ASSERT_TRUE(engine->Post(*h, kLong).ok());
  Status st = h->Wait(milliseconds(1));
  EXPECT_EQ(st.code(), StatusCode::kUnavailable);
  EXPECT_NE(st.message().find("timed out after 1 ms"), std::string::npos) << st.message();
  EXPECT_TRUE(h->Wait(kLong).ok());
  EXPECT_EQ(dst[n - 1], std::byte{9});
}

TEST(TransferEngineTest, ReleaseInFlightStopsTouchingTheBuffers) {
  auto engine = Engine(2, size_t{1} << 30, 64 << 10);
  for (int round = 0; round < 20; ++round) {
    const size_t n = size_t{16} << 20;
    std::unique_ptr<std::byte[]> src(new std::byte[n]);
    std::unique_ptr<std::byte[]> dst(new std::byte[n]);
    CopySegment s{src.get(), dst.get(), n, 0};
    {
      auto h = engine->Prepare({&s, 1}, 1);
      ASSERT_TRUE(h.ok());
      ASSERT_TRUE(engine->Post(*h, kLong).ok());
      if (round % 2 == 0) {
        h->Release();
        EXPECT_FALSE(h->valid());
      }
      // Odd rounds: the handle's destructor cancels.
    }
    // Freed at once: a worker still copying would be a use-after-free under ASan.
    src.reset();
    dst.reset();
  }
  EXPECT_EQ(engine->queued_bytes(), 0u) << "skipped copies must leave the queue's byte count";
}

TEST(TransferEngineTest, CancelledTransferSaysSo) {
  auto engine = Engine(1, size_t{1} << 30, 64 << 10);
  const size_t n = size_t{256} << 20;
  std::unique_ptr<std::byte[]> src(new std::byte[n]);
  std::unique_ptr<std::byte[]> dst(new std::byte[n]);
  CopySegment s{src.get(), dst.get(), n, 0};
  auto h = engine->Prepare({&s, 1}, 1);
  ASSERT_TRUE(h.ok());
  ASSERT_TRUE(engine->Post(*h, kLong).ok());
  TransferHandle moved = std::move(*h);
  EXPECT_FALSE(h->valid());
  moved.Cancel();  // 4,096 chunks on one worker: far from done
  ASSERT_TRUE(moved.valid());
  ASSERT_EQ(moved.Poll(), TransferState::kCancelled);
  Status st = moved.Wait(kLong);
  EXPECT_EQ(st.code(), StatusCode::kUnavailable);
  EXPECT_NE(st.message().find("cancelled"), std::string::npos);
  EXPECT_EQ(moved.WaitLayer(0, kLong).code(), StatusCode::kUnavailable);
  moved.Cancel();  // idempotent
  moved.Release();
  EXPECT_FALSE(moved.valid());
}

TEST(TransferEngineTest, FullQueueAppliesBackpressure) {
  auto engine = Engine(1, 1 << 20, 64 << 10);
  // 256 MiB into never-touched pages (each first write faults): far from done microseconds
  // after it is posted.
  const size_t big = size_t{256} << 20;
  std::unique_ptr<std::byte[]> src(new std::byte[big]);
  std::unique_ptr<std::byte[]> dst(new std::byte[big]);
  std::vector<std::byte> small_src = testing::MakeBlock(1 << 20, 4), small_dst(1 << 20);
  CopySegment s{src.get(), dst.get(), big, 0};
  auto first = engine->Prepare({&s, 1}, 1);
  ASSERT_TRUE(first.ok());
  // Larger than the whole queue: admitted because the queue is empty.
  ASSERT_TRUE(engine->Post(*first, kLong).ok());
  CopySegment t{small_src.data(), small_dst.data(), small_src.size(), 0};
  auto second = engine->Prepare({&t, 1}, 1);
  ASSERT_TRUE(second.ok());
  Status full = engine->Post(*second, milliseconds(0));
  EXPECT_EQ(full.code(), StatusCode::kResourceExhausted) << full.ToString();
  EXPECT_NE(full.message().find("queue full for 0 ms"), std::string::npos) << full.message();
  EXPECT_EQ(second->Poll(), TransferState::kPrepared);
  ASSERT_TRUE(engine->Post(*second, kLong).ok());  // waits for room
  EXPECT_LE(engine->queued_bytes(), small_src.size()) << "admitted once the first one drained";
  EXPECT_TRUE(second->Wait(kLong).ok());
  EXPECT_EQ(small_src, small_dst);
}

TEST(TransferEngineTest, StressPostWaitCancelFromManyThreads) {
  auto engine = Engine(2, 8 << 20, 16 << 10);
  std::atomic<int> done{0}, cancelled{0}, timeouts{0};
  auto worker = [&](uint32_t seed) {
    std::mt19937 rng(seed);
    for (int i = 0; i < 60; ++i) {
      const size_t n = 4096 * (1 + rng() % 64);
      auto src = testing::MakeBlock(n, rng());
      std::vector<std::byte> dst(n);
      const uint32_t layers = 1 + rng() % 4;
      std::vector<CopySegment> segs;
      for (size_t off = 0; off < n; off += 4096)
        segs.push_back({src.data() + off, dst.data() + off, 4096,
                        static_cast<uint32_t>((off / 4096) % layers)});
      auto h = engine->Prepare(segs, layers);
      ASSERT_TRUE(h.ok());
      ASSERT_TRUE(engine->Post(*h, kLong).ok());
      switch (rng() % 3) {
        case 0:
          ASSERT_TRUE(h->Wait(kLong).ok());
          ASSERT_EQ(src, dst);
          done++;
          break;
        case 1:
          h->Release();  // cancel in flight; dst and src die right after
          cancelled++;
          break;
        case 2:
          if (!h->WaitLayer(0, milliseconds(0)).ok()) timeouts++;
          ASSERT_TRUE(h->WaitLayer(layers - 1, kLong).ok());
          ASSERT_TRUE(h->Wait(kLong).ok());
          ASSERT_EQ(src, dst);
          done++;
          break;
      }
    }
  };
  std::vector<std::thread> threads;
  for (uint32_t s = 0; s < 4; ++s) threads.emplace_back(worker, s + 1);
  for (auto& t : threads) t.join();
  EXPECT_EQ(done + cancelled, 240);
  EXPECT_EQ(engine->queued_bytes(), 0u);
}

}  // namespace
}  // namespace kvtier
