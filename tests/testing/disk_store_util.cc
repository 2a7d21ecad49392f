#include "testing/disk_store_util.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "tiers/disk/format.h"

namespace kvtier::disk {

std::vector<std::byte> Payload(uint64_t n, uint64_t v, uint64_t bytes) {
  std::vector<std::byte> out(bytes);
  uint64_t x = n * 0x2545f4914f6cdd1dULL + v * 0x9e3779b97f4a7c15ULL + 7;
  for (uint64_t i = 0; i < bytes; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    out[i] = static_cast<std::byte>(x);
  }
  return out;
}

DiskOptions Options(const std::string& dir, IoBackend io) {
  DiskOptions o;
  o.path = dir;
  o.block_bytes = kBlock;
  o.layout_fingerprint = kFingerprint;
  o.capacity_bytes = 8 << 20;
  o.segment_bytes = 1 << 20;
  o.queue_depth = 8;
  o.io = io;
  o.buffer_bytes = 1 << 20;
  return o;
}

std::unique_ptr<DiskStore> OpenOrDie(const DiskOptions& o, DiskStore::RemovalFn fn) {
  auto r = DiskStore::Open(o, std::move(fn));
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? std::move(r).value() : nullptr;
}

void PutMany(DiskStore& s, uint64_t first, uint64_t count, uint64_t version) {
  std::vector<BlockKey> keys;
  std::vector<std::vector<std::byte>> data;
  std::vector<std::span<const std::byte>> blocks;
  for (uint64_t n = first; n < first + count; ++n) {
    keys.push_back(Key(n));
    data.push_back(Payload(n, version));
  }
  for (auto& d : data) blocks.emplace_back(d);
  std::vector<Status> results(keys.size());
  s.Put(keys, blocks, results);
  for (size_t i = 0; i < results.size(); ++i) {
    ASSERT_TRUE(results[i].ok()) << "key " << first + i << ": " << results[i].ToString();
  }
}

// Per-block statuses of one Put of keys first..first+count-1.
std::vector<Status> PutStatuses(DiskStore& s, uint64_t first, uint64_t count) {
  std::vector<BlockKey> keys;
  std::vector<std::vector<std::byte>> data;
  std::vector<std::span<const std::byte>> blocks;
  for (uint64_t n = first; n < first + count; ++n) {
    keys.push_back(Key(n));
    data.push_back(Payload(n));
  }
  for (auto& d : data) blocks.emplace_back(d);
  std::vector<Status> results(keys.size());
  s.Put(keys, blocks, results);
  return results;
}

Status GetOne(DiskStore& s, uint64_t n, uint64_t v) {
  std::vector<std::byte> buf(kBlock);
  std::span<std::byte> out(buf);
  BlockKey key = Key(n);
  Status st;
  s.Get({&key, 1}, {&out, 1}, {&st, 1});
  if (st.ok() && buf != Payload(n, v)) return Status::Internal("served wrong bytes");
  return st;
}

std::vector<std::string> SegmentFiles(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (ParseSegmentFileName(e.path().filename().string())) out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

void FlipByte(const std::string& file, uint64_t offset) {
  const int fd = ::open(file.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  unsigned char c = 0;
  ASSERT_EQ(::pread(fd, &c, 1, static_cast<off_t>(offset)), 1);
  c ^= 0x40;
  ASSERT_EQ(::pwrite(fd, &c, 1, static_cast<off_t>(offset)), 1);
  ::close(fd);
}

bool UringAvailable() {
  IoEngineOptions probe;
  probe.backend = IoBackend::kUring;
  return MakeIoEngine(probe).ok();
}

int InChild(int (*checks)()) {
  const pid_t pid = ::fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    ::alarm(10);
    _exit(checks());
  }
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
}

void DiskStoreTest::SetUp() {
  ASSERT_FALSE(dir_.path().empty()) << "mkdtemp failed";
  if (GetParam() == IoBackend::kUring) {
    IoEngineOptions eo;
    eo.backend = IoBackend::kUring;
    auto probe = MakeIoEngine(eo);
    if (!probe.ok()) GTEST_SKIP() << "io_uring unavailable here: " << probe.status().ToString();
  }
}

std::string BackendName(const ::testing::TestParamInfo<IoBackend>& info) {
  return info.param == IoBackend::kSync ? std::string("Sync") : std::string("Uring");
}

}  // namespace kvtier::disk
