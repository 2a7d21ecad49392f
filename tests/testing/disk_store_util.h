// Helpers shared by the DiskStore tests (disk_*_test.cc): a small store's options,
// deterministic keys and blocks, Put/Get shorthands, file surgery on segments, an engine wrapper
// to watch or break I/O, a fixture run over both I/O backends, and a forked-child runner for checks
// that change process limits.
#ifndef KVTIER_TESTS_TESTING_DISK_STORE_UTIL_H_
#define KVTIER_TESTS_TESTING_DISK_STORE_UTIL_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "testing/test_util.h"
#include "tiers/disk/disk_store.h"
#include "tiers/disk/io_engine.h"

namespace kvtier::disk {

inline constexpr uint64_t kBlock = 16 * 1024 + 512;  // not page-aligned on purpose
inline constexpr uint64_t kFingerprint = 0x5eed5eed12345678ULL;

using ::kvtier::testing::Key;

// Deterministic block contents for (key n, version v).
std::vector<std::byte> Payload(uint64_t n, uint64_t v = 0, uint64_t bytes = kBlock);

// A small store at dir: 8 MiB in 1 MiB segments, blocks of kBlock bytes.
DiskOptions Options(const std::string& dir, IoBackend io = IoBackend::kAuto);

// The opened store; nullptr (and a failed expectation) when the open fails.
std::unique_ptr<DiskStore> OpenOrDie(const DiskOptions& o, DiskStore::RemovalFn fn = nullptr);

// Puts keys first..first+count-1 at `version`, asserting every block is stored.
void PutMany(DiskStore& s, uint64_t first, uint64_t count, uint64_t version = 0);

// Per-block statuses of one Put of keys first..first+count-1.
std::vector<Status> PutStatuses(DiskStore& s, uint64_t first, uint64_t count);

// Status of reading key n, checking the bytes against version v when OK.
Status GetOne(DiskStore& s, uint64_t n, uint64_t v = 0);

// The segment files in dir, oldest first.
std::vector<std::string> SegmentFiles(const std::string& dir);

// Flips one bit of the byte at offset in file.
void FlipByte(const std::string& file, uint64_t offset);

// Whether this kernel and process may make an io_uring ring.
bool UringAvailable();

// Runs checks in a forked child (for limits and ids the test process must keep) that an alarm
// kills after 10 s. Returns the child's result (0: every check passed, else the failed check's
// number), or -signal when a signal ended it.
int InChild(int (*checks)());

// An IoEngine over a real one, forwarding every call: tests override what they watch or break.
class ForwardingEngine : public IoEngine {
 public:
  explicit ForwardingEngine(std::unique_ptr<IoEngine> inner) : inner_(std::move(inner)) {
    queue_depth_ = inner_->queue_depth();
    registered_ = inner_->registered_buffers();
  }
  std::string_view name() const override { return inner_->name(); }
  IoBackend backend() const override { return inner_->backend(); }
  void Queue(const IoRequest& request) override { inner_->Queue(request); }
  void Submit() override { inner_->Submit(); }
  uint32_t outstanding() const override { return inner_->outstanding(); }
  Status Wait(uint32_t min_complete, std::vector<IoCompletion>* out) override {
    return inner_->Wait(min_complete, out);
  }

 protected:
  std::unique_ptr<IoEngine> inner_;
};

// Runs each test over io_uring (skipped where unavailable) and over pread/pwrite.
class DiskStoreTest : public ::testing::TestWithParam<IoBackend> {
 protected:
  void SetUp() override;
  ::kvtier::testing::TempDir dir_;
};

// "Uring" or "Sync", for INSTANTIATE_TEST_SUITE_P.
std::string BackendName(const ::testing::TestParamInfo<IoBackend>& info);

}  // namespace kvtier::disk

#endif  // KVTIER_TESTS_TESTING_DISK_STORE_UTIL_H_
