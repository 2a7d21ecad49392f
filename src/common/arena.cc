#include "common/arena.h"

#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

#ifdef KVTIER_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older headers lack it
#endif

namespace kvtier {

Arena::~Arena() {
#ifdef KVTIER_HAVE_CUDA
  if (pinned) cudaHostUnregister(base);
#endif
  if (base) munmap(base, bytes);
}

Result<std::shared_ptr<Arena>> MapArena(int fd, size_t bytes) {
  struct stat st {};
  if (fstat(fd, &st) != 0)
    return Status::Unavailable(std::string("cannot stat the daemon's arena: ") +
                               std::strerror(errno));
  // By file identity: a restarted daemon's memfd is another file, and gets its own mapping.
  static std::mutex mu;
  static std::map<std::pair<dev_t, ino_t>, std::weak_ptr<Arena>> mapped;
  std::lock_guard<std::mutex> lock(mu);
  std::erase_if(mapped, [](const auto& e) { return e.second.expired(); });
  auto& slot = mapped[{st.st_dev, st.st_ino}];
  if (auto a = slot.lock(); a && a->bytes == bytes) return a;
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED)
    return Status::Unavailable(std::string("cannot map the daemon's arena: ") +
                               std::strerror(errno));
  auto a = std::make_shared<Arena>();
  a->base = static_cast<std::byte*>(p);
  a->bytes = bytes;
#ifdef KVTIER_HAVE_CUDA
  if (cudaHostRegister(a->base, bytes, cudaHostRegisterDefault) == cudaSuccess)
    a->pinned = true;
  else
    (void)cudaGetLastError();
#endif
  slot = a;
  return a;
}

ArenaWarmer::~ArenaWarmer() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.SignalAll();
  if (thread_.joinable()) thread_.join();
}

void ArenaWarmer::Add(std::shared_ptr<Arena> arena, std::span<const uint64_t> offsets,
                      size_t span) {
  if (!arena || offsets.empty() || span == 0) return;
  const auto page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  MutexLock lock(&mu_);
  if (stop_ || unsupported_) return;
  if (arena != arena_) {
    queue_.clear();
    arena_ = std::move(arena);
  }
  for (uint64_t off : offsets) {
    if (off >= arena_->bytes) continue;
    const size_t begin = off / page * page;
    const size_t end = std::min<size_t>(arena_->bytes, (off + span + page - 1) / page * page);
    // Slots the daemon claims in a run are adjacent: one range, warmed a chunk at a time.
    if (!queue_.empty() && queue_.back().end == begin)
      queue_.back().end = end;
    else
      queue_.push_back({begin, end});
  }
  if (!thread_.joinable()) thread_ = std::thread([this] { Run(); });
  cv_.SignalAll();
}

void ArenaWarmer::Run() {
  sched_param p{};
  (void)pthread_setschedparam(pthread_self(), SCHED_IDLE, &p);
  // The call holds the address space's lock: at SCHED_IDLE it may be preempted holding it, and
  // an engine thread that maps or unmaps memory then waits for it. 256 KiB (64 pages) bounds
  // that wait at a fraction of a millisecond.
  constexpr size_t kChunk = size_t{256} << 10;
  for (;;) {
    size_t begin = 0, end = 0;
    std::shared_ptr<Arena> arena;  // mapped until the call returns
    {
      MutexLock lock(&mu_);
      while (queue_.empty() && !stop_) cv_.Wait(&mu_);
      if (stop_) return;
      begin = queue_.front().begin;
      end = std::min(queue_.front().end, begin + kChunk);
      arena = arena_;
    }
    const bool ok = madvise(arena->base + begin, end - begin, MADV_POPULATE_WRITE) == 0;
    const int err = errno;
    MutexLock lock(&mu_);
    if (ok) warmed_bytes_.fetch_add(end - begin, std::memory_order_relaxed);
    if (!ok && err == EINVAL) {  // the kernel cannot: stop for good
      unsupported_ = true;
      queue_.clear();
    } else if (arena == arena_ && !queue_.empty() && queue_.front().begin == begin) {
      // Past this chunk (a failed one too: a later store faults it in, as without warming).
      if (end >= queue_.front().end)
        queue_.erase(queue_.begin());
      else
        queue_.front().begin = end;
    }
    if (queue_.empty()) arena_.reset();  // nothing keeps the mapping for us any more
  }
}

}  // namespace kvtier
