// The disk tier's io_uring engine: a lost completion fails the wait instead of hanging, and a
// refused buffer registration falls back and says why.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#include "testing/disk_store_util.h"
#include "tiers/disk/io_engine.h"

namespace kvtier::disk {
namespace {

// A completion that never arrives (here: a read of an empty pipe) used to block Wait forever.
// Now Wait fails after stall_timeout_ms, and the engine stays failed. Run in a child that an
// alarm kills if Wait hangs.
TEST(DiskIoEngineTest, LostCompletionFailsTheWaitInsteadOfHanging) {
  if (!UringAvailable()) GTEST_SKIP() << "io_uring unavailable here";
  const int rc = InChild([] {
    int fds[2];
    if (::pipe(fds) != 0) return 10;
    AlignedBuffer buf(4096);
    IoEngineOptions o;
    o.backend = IoBackend::kUring;
    o.queue_depth = 4;
    o.stall_timeout_ms = 200;
    auto engine = MakeIoEngine(o);
    if (!engine.ok()) return 11;
    (*engine)->Queue(IoRequest{false, fds[0], buf.data(), 4096, 0, -1, 7});
    std::vector<IoCompletion> done;
    const auto t0 = std::chrono::steady_clock::now();
    const Status st = (*engine)->Wait(1, &done);
    if (st.ok()) return 12;
    if (std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(150)) return 13;
    if (st.message().find("no progress") == std::string::npos) return 14;
    (*engine)->Queue(IoRequest{false, fds[0], buf.data(), 4096, 0, -1, 8});
    if ((*engine)->Wait(1, &done).ok() || !done.empty()) return 15;  // failed for good
    (*engine).reset();  // the ring goes before its buffer
    return 0;
  });
  ASSERT_NE(rc, -SIGALRM) << "Wait hung";
  EXPECT_EQ(rc, 0) << "child check " << rc << " failed";
}

// io_uring pins registered buffers against RLIMIT_MEMLOCK (8 MiB for non-root here): a refused
// registration must fall back to plain buffers and say why. Run in a child whose limit is
// lowered (and, as root, which drops to nobody, since CAP_IPC_LOCK ignores the limit).
TEST(DiskIoEngineTest, RefusedBufferRegistrationFallsBackAndSaysWhy) {
  if (!UringAvailable()) GTEST_SKIP() << "io_uring unavailable here";
  const int rc = InChild([] {
    rlimit lim{1 << 20, 1 << 20};
    if (::setrlimit(RLIMIT_MEMLOCK, &lim) != 0) return 10;
    if (::geteuid() == 0 && ::setresuid(65534, 65534, 65534) != 0) return 11;
    AlignedBuffer buf(4 << 20);
    IoEngineOptions o;
    o.backend = IoBackend::kUring;
    o.queue_depth = 4;
    o.buffers = {buf.span()};
    auto engine = MakeIoEngine(o);
    if (!engine.ok()) return 12;
    if ((*engine)->registered_buffers()) return 13;
    if ((*engine)->note().find("RLIMIT_MEMLOCK") == std::string::npos) return 14;
    // Still usable without registration.
    AlignedBuffer data(4096);
    std::memset(data.data(), 0x5a, 4096);
    FILE* f = std::tmpfile();
    if (f == nullptr) return 15;
    (*engine)->Queue(IoRequest{true, ::fileno(f), data.data(), 4096, 0, 0, 1});
    std::vector<IoCompletion> done;
    if (!(*engine)->Wait(1, &done).ok() || done.size() != 1 || done[0].result != 4096) return 16;
    return 0;
  });
  if (rc == 13) GTEST_SKIP() << "the kernel registered past RLIMIT_MEMLOCK";
  EXPECT_EQ(rc, 0) << "child check " << rc << " failed";
}

}  // namespace
}  // namespace kvtier::disk
