// IoEngine: batched positional reads and writes for the disk tier, over io_uring (liburing) or,
// when io_uring is unavailable, a plain pread/pwrite loop with the same contract.
//
// A caller queues up to queue_depth() requests, then Wait()s for completions; io_uring submits
// the whole batch with one system call. Buffers given at construction are registered with the
// ring (IORING_OP_READ_FIXED/WRITE_FIXED) when the kernel and RLIMIT_MEMLOCK allow; otherwise
// the engine uses them unregistered and says why in note().
//
// Thread-safety: none; one engine per thread at a time (the disk tier keeps one for its writer
// and a pool for readers). Ownership: the engine never owns request buffers; registered buffers
// must outlive it.
#ifndef KVTIER_TIERS_DISK_IO_ENGINE_H_
#define KVTIER_TIERS_DISK_IO_ENGINE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <sys/uio.h>

#include "kvtier/status.h"

namespace kvtier::disk {

// Page-aligned heap memory for O_DIRECT. Move-only.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t bytes);  // aborts when out of memory
  AlignedBuffer(AlignedBuffer&& other) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  ~AlignedBuffer();

  std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  std::span<std::byte> span() const { return {data_, size_}; }

 private:
  std::byte* data_ = nullptr;
  size_t size_ = 0;
};

enum class IoBackend : uint8_t { kAuto, kUring, kSync };
std::string_view IoBackendName(IoBackend backend);

struct IoRequest {
  bool write = false;
  int fd = -1;
  std::byte* buf = nullptr;
  uint32_t len = 0;
  uint64_t offset = 0;
  int buf_index = -1;  // index into the registered buffers, or -1
  uint64_t tag = 0;    // returned in the completion
  // Vectored instead (buf/len/buf_index unused): iovcnt pieces, contiguous in the file from
  // offset. The array must stay valid until the request completes.
  const iovec* iov = nullptr;
  int iovcnt = 0;
};

struct IoCompletion {
  uint64_t tag = 0;
  int64_t result = 0;  // bytes transferred, or -errno
};

struct IoEngineOptions {
  IoBackend backend = IoBackend::kAuto;  // kAuto: io_uring when it initialises, else sync
  uint32_t queue_depth = 32;
  bool register_buffers = true;
  std::vector<std::span<std::byte>> buffers;  // candidates for registration (index = buf_index)
  // io_uring: a Wait that sees no completion for this long fails (the engine is then broken),
  // so a lost completion is an error rather than a hang.
  uint32_t stall_timeout_ms = 30000;
};

class IoEngine {
 public:
  virtual ~IoEngine() = default;

  // "io_uring" or "pread/pwrite".
  virtual std::string_view name() const = 0;
  virtual IoBackend backend() const = 0;
  uint32_t queue_depth() const { return queue_depth_; }
  // Whether IoRequest::buf_index is honoured (buffers registered with the kernel).
  bool registered_buffers() const { return registered_; }
  // Why the engine is not the best one asked for (io_uring or registration refused); empty if
  // it is.
  const std::string& note() const { return note_; }

  // Queues a request. Precondition: outstanding() < queue_depth().
  virtual void Queue(const IoRequest& request) = 0;
  // Starts what is queued without waiting (io_uring); the pread engine runs requests in Wait.
  virtual void Submit() = 0;
  // Submits what is queued and appends at least min(min_complete, outstanding()) completions to
  // *out. Non-OK only when the engine itself failed (a submit or wait refused with a hard
  // error, or nothing completed within stall_timeout_ms); per-request errors are in
  // IoCompletion::result. A failure is final: every later Wait fails the same way and the
  // requests still outstanding never complete through this engine, so the caller drops it.
  virtual Status Wait(uint32_t min_complete, std::vector<IoCompletion>* out) = 0;
  virtual uint32_t outstanding() const = 0;

 protected:
  uint32_t queue_depth_ = 0;
  bool registered_ = false;
  std::string note_;
};

// Makes the engine options ask for, falling back to pread/pwrite (kAuto) with a note.
// InvalidArgument for queue_depth 0 or > 4096 or stall_timeout_ms 0; Unavailable when kUring was
// required and io_uring cannot be set up.
Result<std::unique_ptr<IoEngine>> MakeIoEngine(const IoEngineOptions& options);

}  // namespace kvtier::disk

#endif  // KVTIER_TIERS_DISK_IO_ENGINE_H_
