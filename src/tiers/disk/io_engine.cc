#include "tiers/disk/io_engine.h"

#include <liburing.h>
#include <sys/resource.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>

#include <fmt/format.h>

#include "common/clock.h"
#include "tiers/disk/format.h"

namespace kvtier::disk {

AlignedBuffer::AlignedBuffer(size_t bytes) : size_(AlignUp(bytes)) {
  void* p = nullptr;
  if (size_ == 0 || posix_memalign(&p, kPageBytes, size_) != 0) {
    if (size_ != 0) std::abort();
  }
  data_ = static_cast<std::byte*>(p);
}
AlignedBuffer::AlignedBuffer(AlignedBuffer&& other) noexcept
    : data_(other.data_), size_(other.size_) {
  other.data_ = nullptr;
  other.size_ = 0;
}
AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& other) noexcept {
  if (this != &other) {
    std::free(data_);
    data_ = other.data_;
    size_ = other.size_;
    other.data_ = nullptr;
    other.size_ = 0;
  }
  return *this;
}
AlignedBuffer::~AlignedBuffer() { std::free(data_); }

std::string_view IoBackendName(IoBackend backend) {
  switch (backend) {
    case IoBackend::kAuto:
      return "auto";
    case IoBackend::kUring:
      return "io_uring";
    case IoBackend::kSync:
      return "pread/pwrite";
  }
  return "unknown";
}

namespace {

class SyncEngine final : public IoEngine {
 public:
  explicit SyncEngine(uint32_t queue_depth, std::string note) {
    queue_depth_ = queue_depth;
    note_ = std::move(note);
  }
  std::string_view name() const override { return "pread/pwrite"; }
  IoBackend backend() const override { return IoBackend::kSync; }
  void Queue(const IoRequest& request) override { queued_.push_back(request); }
  void Submit() override {}
  uint32_t outstanding() const override { return static_cast<uint32_t>(queued_.size()); }

  Status Wait(uint32_t min_complete, std::vector<IoCompletion>* out) override {
    // Runs everything queued: a synchronous engine has no reason to hold requests back.
    (void)min_complete;
    for (const IoRequest& r : queued_) out->push_back({r.tag, Run(r)});
    queued_.clear();
    return Status::Ok();
  }

 private:
  static int64_t Run(const IoRequest& r) {
    if (r.iov != nullptr) return RunVectored(r);
    uint64_t done = 0;
    while (done < r.len) {
      const ssize_t n = r.write ? ::pwrite(r.fd, r.buf + done, r.len - done, r.offset + done)
                                : ::pread(r.fd, r.buf + done, r.len - done, r.offset + done);
      if (n < 0) {
        if (errno == EINTR) continue;
        return -errno;
      }
      if (n == 0) break;  // end of file on a read
      done += static_cast<uint64_t>(n);
    }
    return static_cast<int64_t>(done);
  }
  static int64_t RunVectored(const IoRequest& r) {
    std::vector<iovec> iov(r.iov, r.iov + r.iovcnt);
    size_t first = 0;
    uint64_t done = 0;
    while (first < iov.size()) {
      const ssize_t n =
          r.write ? ::pwritev(r.fd, iov.data() + first, static_cast<int>(iov.size() - first),
                              static_cast<off_t>(r.offset + done))
                  : ::preadv(r.fd, iov.data() + first, static_cast<int>(iov.size() - first),
                             static_cast<off_t>(r.offset + done));
      if (n < 0) {
        if (errno == EINTR) continue;
        return -errno;
      }
      if (n == 0) break;
      done += static_cast<uint64_t>(n);
      // Skips what was transferred; a partial piece continues where it stopped.
      size_t left = static_cast<size_t>(n);
      while (first < iov.size() && left >= iov[first].iov_len) left -= iov[first++].iov_len;
      if (first < iov.size()) {
        iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + left;
        iov[first].iov_len -= left;
      }
    }
    return static_cast<int64_t>(done);
  }
  std::vector<IoRequest> queued_;
};

class UringEngine final : public IoEngine {
 public:
  ~UringEngine() override {
    if (initialised_) io_uring_queue_exit(&ring_);
  }

  // Sets up the ring; returns -errno on failure. Registration failure is not fatal.
  int Init(const IoEngineOptions& options) {
    queue_depth_ = options.queue_depth;
    stall_timeout_ = std::chrono::milliseconds(options.stall_timeout_ms);
    const int rc = io_uring_queue_init(options.queue_depth, &ring_, 0);
    if (rc < 0) return rc;
    initialised_ = true;
    if (options.register_buffers && !options.buffers.empty()) {
      std::vector<iovec> iov;
      for (auto b : options.buffers) iov.push_back({b.data(), b.size()});
      const int reg =
          io_uring_register_buffers(&ring_, iov.data(), static_cast<unsigned>(iov.size()));
      if (reg == 0) {
        registered_ = true;
      } else {
        uint64_t total = 0;
        for (auto b : options.buffers) total += b.size();
        rlimit lim{};
        getrlimit(RLIMIT_MEMLOCK, &lim);
        note_ = fmt::format(
            "io_uring buffer registration of {} bytes refused ({}; RLIMIT_MEMLOCK {}): using "
            "unregistered buffers",
            total, std::strerror(-reg),
            lim.rlim_cur == RLIM_INFINITY ? std::string("unlimited")
                                          : fmt::format("{} bytes", lim.rlim_cur));
      }
    }
    return 0;
  }

  std::string_view name() const override { return "io_uring"; }
  IoBackend backend() const override { return IoBackend::kUring; }
  uint32_t outstanding() const override { return outstanding_; }

  void Submit() override {
    if (!failed_.ok() || io_uring_sq_ready(&ring_) == 0) return;
    const int rc = io_uring_submit(&ring_);
    if (rc < 0 && !Transient(rc)) Fail(fmt::format("io_uring_submit: {}", std::strerror(-rc)));
  }

  void Queue(const IoRequest& r) override {
    ++outstanding_;
    io_uring_sqe* sqe = failed_.ok() ? io_uring_get_sqe(&ring_) : nullptr;
    if (sqe == nullptr && failed_.ok()) {
      // The SQ holds queue_depth entries and outstanding() < queue_depth, so this only happens
      // when completions are pending; submitting frees the slots.
      Submit();
      sqe = failed_.ok() ? io_uring_get_sqe(&ring_) : nullptr;
      if (sqe == nullptr && failed_.ok()) Fail("io_uring: no free submission slot");
    }
    if (sqe == nullptr) return;  // broken: the next Wait reports it
    if (r.iov != nullptr) {
      if (r.write) {
        io_uring_prep_writev(sqe, r.fd, r.iov, static_cast<unsigned>(r.iovcnt), r.offset);
      } else {
        io_uring_prep_readv(sqe, r.fd, r.iov, static_cast<unsigned>(r.iovcnt), r.offset);
      }
    } else if (r.write) {
      if (registered_ && r.buf_index >= 0) {
        io_uring_prep_write_fixed(sqe, r.fd, r.buf, r.len, r.offset, r.buf_index);
      } else {
        io_uring_prep_write(sqe, r.fd, r.buf, r.len, r.offset);
      }
    } else {
      if (registered_ && r.buf_index >= 0) {
        io_uring_prep_read_fixed(sqe, r.fd, r.buf, r.len, r.offset, r.buf_index);
      } else {
        io_uring_prep_read(sqe, r.fd, r.buf, r.len, r.offset);
      }
    }
    io_uring_sqe_set_data64(sqe, r.tag);
  }

  Status Wait(uint32_t min_complete, std::vector<IoCompletion>* out) override {
    if (!failed_.ok()) return failed_;
    const uint32_t want = std::min(min_complete, outstanding_);
    uint32_t got = 0;
    auto deadline = MonotonicNow() + stall_timeout_;
    for (;;) {
      // Reap what is there without blocking.
      io_uring_cqe* cqe = nullptr;
      bool progress = false;
      while (io_uring_peek_cqe(&ring_, &cqe) == 0 && cqe != nullptr) {
        out->push_back({io_uring_cqe_get_data64(cqe), cqe->res});
        io_uring_cqe_seen(&ring_, cqe);
        --outstanding_;
        ++got;
        progress = true;
      }
      const auto now = MonotonicNow();
      if (progress) deadline = now + stall_timeout_;
      if (got >= want && io_uring_sq_ready(&ring_) == 0) return Status::Ok();
      if (now >= deadline) {
        // A completion that never arrives: the ring (or the device under it) is stuck.
        Fail(fmt::format("io_uring: no progress in {} ms with {} requests outstanding",
                         stall_timeout_.count(), outstanding_));
        return failed_;
      }
      if (got >= want) {
        Submit();
        if (!failed_.ok()) return failed_;
        continue;
      }
      const auto left =
          std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - now).count();
      __kernel_timespec ts{left / 1000000000, left % 1000000000};
      const int rc = io_uring_submit_and_wait_timeout(&ring_, &cqe, want - got, &ts, nullptr);
      if (rc < 0 && rc != -ETIME && !Transient(rc)) {
        Fail(fmt::format("io_uring_submit_and_wait: {}", std::strerror(-rc)));
        return failed_;
      }
    }
  }

 private:
  static bool Transient(int rc) { return rc == -EINTR || rc == -EAGAIN || rc == -EBUSY; }
  void Fail(std::string what) { failed_ = Status::Internal(std::move(what)); }

  io_uring ring_{};
  bool initialised_ = false;
  uint32_t outstanding_ = 0;  // queued, submitted or not, completion not yet reaped
  std::chrono::milliseconds stall_timeout_{30000};
  Status failed_;  // latched: a broken ring is never used again
};

}  // namespace

Result<std::unique_ptr<IoEngine>> MakeIoEngine(const IoEngineOptions& options) {
  if (options.queue_depth == 0 || options.queue_depth > 4096) {
    return Status::InvalidArgument(
        fmt::format("queue_depth: {} is out of range [1, 4096]", options.queue_depth));
  }
  if (options.stall_timeout_ms == 0)
    return Status::InvalidArgument("stall_timeout_ms: must be > 0");
  if (options.backend == IoBackend::kSync) {
    return std::unique_ptr<IoEngine>(new SyncEngine(options.queue_depth, ""));
  }
  auto uring = std::make_unique<UringEngine>();
  const int rc = uring->Init(options);
  if (rc == 0) return std::unique_ptr<IoEngine>(std::move(uring));
  if (options.backend == IoBackend::kUring) {
    return Status::Unavailable(fmt::format("io_uring_queue_init: {}", std::strerror(-rc)));
  }
  return std::unique_ptr<IoEngine>(new SyncEngine(
      options.queue_depth,
      fmt::format("io_uring unavailable ({}): using pread/pwrite", std::strerror(-rc))));
}

}  // namespace kvtier::disk
