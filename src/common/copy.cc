#include "common/copy.h"

#include <algorithm>
#include <cstring>

#include "hash/xxh3_wide.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace kvtier {

namespace {

#if defined(__SSE2__)
// Copies lines * 64 bytes with streaming stores to a 16-byte aligned dst; the caller fences.
void StreamLines(unsigned char* d, const unsigned char* s, size_t lines) {
  auto* dp = reinterpret_cast<__m128i*>(d);
  auto* sp = reinterpret_cast<const __m128i*>(s);
  for (size_t i = 0; i < lines; ++i) {
    __m128i a = _mm_loadu_si128(sp + 0);
    __m128i b = _mm_loadu_si128(sp + 1);
    __m128i c = _mm_loadu_si128(sp + 2);
    __m128i e = _mm_loadu_si128(sp + 3);
    _mm_stream_si128(dp + 0, a);
    _mm_stream_si128(dp + 1, b);
    _mm_stream_si128(dp + 2, c);
    _mm_stream_si128(dp + 3, e);
    sp += 4;
    dp += 4;
  }
}

// Bytes to copy with memcpy before d is 16-byte aligned.
size_t AlignHead(const void* d) { return (16 - (reinterpret_cast<uintptr_t>(d) & 15)) & 15; }
#endif

constexpr size_t kStreamMin = 64 * 1024;

}  // namespace

void CopyBlock(void* dst, const void* src, size_t n) {
  if (n == 0) return;  // an empty buffer's pointer may be null, which memcpy must not be given
#if defined(__SSE2__)
  if (n < kStreamMin) {
    std::memcpy(dst, src, n);
    return;
  }
  auto* d = static_cast<unsigned char*>(dst);
  auto* s = static_cast<const unsigned char*>(src);
  const size_t head = AlignHead(d);
  std::memcpy(d, s, head);
  const size_t lines = (n - head) / 64;
  StreamLines(d + head, s + head, lines);
  // Streaming stores are weakly ordered: fence before anyone may read the destination.
  _mm_sfence();
  const size_t done = head + lines * 64;
  std::memcpy(d + done, s + done, n - done);
#else
  std::memcpy(dst, src, n);
#endif
}

uint64_t CopyBlockChecksum(void* dst, const void* src, size_t n) {
#if defined(__SSE2__)
  if (n < kStreamMin) {
    CopyBlock(dst, src, n);
    return WideXxh3(src, n);
  }
  // 8 KiB: the chunk is still in L1 when it is hashed right after its copy read it (+6% over
  // 64 KiB chunks hashed from L2, 1 and 2 threads, 256 KiB blocks; one fence for the block).
  constexpr size_t kChunk = 8 * 1024;
  alignas(64) XXH3_state_t state;
  XXH3_64bits_reset(&state);
  auto* d = static_cast<unsigned char*>(dst);
  auto* s = static_cast<const unsigned char*>(src);
  size_t at = AlignHead(d);
  std::memcpy(d, s, at);
  WideXxh3Update(&state, s, at);
  while (n - at >= 64) {
    const size_t len = std::min(kChunk, (n - at) / 64 * 64);
    StreamLines(d + at, s + at, len / 64);
    WideXxh3Update(&state, s + at, len);
    at += len;
  }
  _mm_sfence();
  std::memcpy(d + at, s + at, n - at);
  WideXxh3Update(&state, s + at, n - at);
  return XXH3_64bits_digest(&state);
#else
  std::memcpy(dst, src, n);
  return WideXxh3(src, n);
#endif
}

void CopyRange(std::span<const CopyJob> jobs, size_t begin, size_t end) {
  size_t offset = 0;
  for (const CopyJob& j : jobs) {
    size_t jb = offset, je = offset + j.bytes;
    offset = je;
    if (je <= begin) continue;
    if (jb >= end) break;
    size_t from = std::max(begin, jb) - jb;
    size_t to = std::min(end, je) - jb;
    CopyBlock(j.dst + from, j.src + from, to - from);
  }
}

CopyPool::CopyPool(int threads) : threads_(threads < 1 ? 1 : threads) {
  for (int i = 1; i < threads_; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
}

CopyPool::~CopyPool() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  start_cv_.SignalAll();
  for (auto& t : workers_) t.join();
}

void CopyPool::WorkerLoop(int index) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int, int)>* task;
    {
      MutexLock lock(&mu_);
      while (!stop_ && generation_ == seen) start_cv_.Wait(&mu_);
      if (stop_) return;
      seen = generation_;
      task = task_;
    }
    (*task)(index, threads_);
    {
      MutexLock lock(&mu_);
      if (--pending_ == 0) done_cv_.Signal();
    }
  }
}

void CopyPool::ParallelFor(const std::function<void(int, int)>& fn) {
  if (threads_ == 1) {
    fn(0, 1);
    return;
  }
  MutexLock run_lock(&run_mu_);
  {
    MutexLock lock(&mu_);
    task_ = &fn;
    pending_ = threads_ - 1;
    ++generation_;
  }
  start_cv_.SignalAll();
  fn(0, threads_);
  MutexLock lock(&mu_);
  while (pending_ != 0) done_cv_.Wait(&mu_);
  task_ = nullptr;
}

void CopyPool::Run(std::span<const CopyJob> jobs, size_t min_parallel_bytes) {
  size_t total = 0;
  for (const CopyJob& j : jobs) total += j.bytes;
  if (threads_ == 1 || total < min_parallel_bytes) {
    CopyRange(jobs, 0, total);
    return;
  }
  // Split on 4 KiB boundaries so threads never share a destination cache line.
  const size_t kAlign = 4096;
  ParallelFor([&](int i, int n) {
    size_t per = (total / n + kAlign - 1) / kAlign * kAlign;
    size_t begin = std::min(total, per * i);
    size_t end = i == n - 1 ? total : std::min(total, per * (i + 1));
    if (begin < end) CopyRange(jobs, begin, end);
  });
}

}  // namespace kvtier
