// A memory arena shared by mappings (Arena), the daemon's arena as a client process maps it
// (MapArena), and ArenaWarmer.
//
// One mapping per memfd per process (MapArena): the clients of one tenant in a process (an
// engine's own and its store lane) share it, so pages one of them faulted in serve the other;
// it is unmapped when the last user lets go, so a copy in flight survives a reconnect.
//
// ArenaWarmer: faults in, off the engine's path, the pages an arena's writer is about to write:
// the daemon's slots a client is told it writes next (serve.warm_ahead), or the slots an
// in-process host tier hands out next (its warm_ahead param). A store's first write to a fresh
// page faults once per 4 KiB page: on a 2-core VM a fresh 12 MiB store took 17-21 ms against
// 1.4 ms warm, and a store is on a lookup's path when the next turn needs it.
//
// One thread, started at the first Add, at SCHED_IDLE: it uses CPU time nobody else wants,
// one 256 KiB MADV_POPULATE_WRITE call at a time (the call faults pages in writable without
// writing them, so a store may write the same pages meanwhile). A kernel without it (before
// 5.14) ends the warming for good; nothing is touched by hand.
//
// Thread-safety: every method may be called from any thread.
#ifndef KVTIER_COMMON_ARENA_H_
#define KVTIER_COMMON_ARENA_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "kvtier/status.h"

namespace kvtier {

struct Arena {
  std::byte* base = nullptr;
  size_t bytes = 0;
  bool pinned = false;  // with CUDA: registered as pinned memory, so device copies are DMA
  ~Arena();
};

// This process's mapping of the memfd fd (bytes long, read-write): the one it has already
// when another client mapped the same file, else a new one. The caller keeps fd.
// Unavailable when it cannot be mapped.
Result<std::shared_ptr<Arena>> MapArena(int fd, size_t bytes);

class ArenaWarmer {
 public:
  ArenaWarmer() = default;
  // Stops within one call and joins.
  ~ArenaWarmer();
  ArenaWarmer(const ArenaWarmer&) = delete;
  ArenaWarmer& operator=(const ArenaWarmer&) = delete;

  // Queues [offset, offset + span) of arena for each offset (parts past it are left out); the
  // arena stays mapped while queued. Another arena than the one queued before replaces it,
  // dropping what was queued for the old one.
  void Add(std::shared_ptr<Arena> arena, std::span<const uint64_t> offsets, size_t span);
  // Bytes faulted in so far.
  uint64_t warmed_bytes() const { return warmed_bytes_.load(std::memory_order_relaxed); }

 private:
  struct Range {
    size_t begin, end;
  };
  void Run();

  Mutex mu_;
  CondVar cv_;
  std::shared_ptr<Arena> arena_ KVTIER_GUARDED_BY(mu_);  // what queue_ is of; null when empty
  std::vector<Range> queue_ KVTIER_GUARDED_BY(mu_);
  bool stop_ KVTIER_GUARDED_BY(mu_) = false;
  bool unsupported_ KVTIER_GUARDED_BY(mu_) = false;
  std::thread thread_;  // started by the first Add, under mu_
  std::atomic<uint64_t> warmed_bytes_{0};
};

}  // namespace kvtier

#endif  // KVTIER_COMMON_ARENA_H_
