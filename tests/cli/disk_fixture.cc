// Writes disk tier directories for cli_test.sh to run `kvtier disk verify` over, each with one
// known defect, using the tier's own writer (so headers and checksums are real).
// Usage: disk_fixture DIR clean|sealed-tail|superseded
//   clean        two segments: keys 0..4 sealed in segment 1, keys 5..9 in segment 2
//   sealed-tail  clean, then segment 1's last record header no longer parses
//   superseded   key 0 written in segment 1 and again in segment 2, the old copy's payload
//                flipped (dead bytes: the tier never serves them)
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "tiers/disk/disk_store.h"
#include "tiers/disk/format.h"

namespace {

using namespace kvtier;
using namespace kvtier::disk;

constexpr uint64_t kBlock = 8192;

bool Put(DiskStore& s, uint64_t first, uint64_t count, uint8_t fill) {
  std::vector<BlockKey> keys;
  std::vector<std::vector<std::byte>> data;
  std::vector<std::span<const std::byte>> blocks;
  for (uint64_t n = first; n < first + count; ++n) {
    keys.push_back(BlockKey{n + 1, n * 7 + 3});
    data.emplace_back(kBlock, std::byte{static_cast<uint8_t>(fill + n)});
  }
  for (auto& d : data) blocks.emplace_back(d);
  std::vector<Status> results(keys.size());
  s.Put(keys, blocks, results);
  return std::all_of(results.begin(), results.end(), [](const Status& r) { return r.ok(); });
}

bool Session(const DiskOptions& o, uint64_t first, uint64_t count, uint8_t fill) {
  auto s = DiskStore::Open(o);
  if (!s.ok()) {
    std::fprintf(stderr, "disk_fixture: %s\n", s.status().ToString().c_str());
    return false;
  }
  return Put(**s, first, count, fill);
}

bool FlipByte(const std::string& file, uint64_t offset) {
  const int fd = ::open(file.c_str(), O_RDWR);
  if (fd < 0) return false;
  unsigned char c = 0;
  bool ok = ::pread(fd, &c, 1, static_cast<off_t>(offset)) == 1;
  c ^= 0x40;
  ok = ok && ::pwrite(fd, &c, 1, static_cast<off_t>(offset)) == 1;
  ::close(fd);
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: disk_fixture DIR clean|sealed-tail|superseded\n");
    return 2;
  }
  const std::string dir = argv[1], kind = argv[2];
  DiskOptions o;
  o.path = dir;
  o.block_bytes = kBlock;
  o.layout_fingerprint = 0x1234;
  o.capacity_bytes = 8 << 20;
  o.segment_bytes = 1 << 20;
  o.io = IoBackend::kSync;
  o.buffer_bytes = 1 << 20;
  const uint64_t rec = o.record_bytes();
  const std::string seg1 = dir + "/" + SegmentFileName(1);
  bool ok = false;
  if (kind == "clean" || kind == "sealed-tail") {
    ok = Session(o, 0, 5, 0) && Session(o, 5, 5, 0);
    if (ok && kind == "sealed-tail") ok = FlipByte(seg1, kPageBytes + 4 * rec + 20);
  } else if (kind == "superseded") {
    ok = Session(o, 0, 5, 0) && Session(o, 0, 1, 100) &&
         FlipByte(seg1, kPageBytes + kPageBytes + 100);  // key 0's first payload
  }
  if (!ok)
    std::fprintf(stderr, "disk_fixture: could not build '%s' in %s\n", kind.c_str(), dir.c_str());
  return ok ? 0 : 1;
}
