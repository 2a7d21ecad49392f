// kvtier bench disk --dir DIR [--json]: the disk tier's write and read GB/s for 2 MiB blocks at
// queue depths 1, 8 and 32, each beside a same-run baseline: a plain O_DIRECT sequential
// pwrite/pread loop over the same total bytes with the same block size, from and into the same
// buffers as the tier.
//
// The machine's disk is shared and noisy, so tier and baseline run interleaved in chunks
// (--chunks, default 8), in the order baseline, tier, tier, baseline, baseline, tier, ...: on
// a virtual disk whatever runs second in a pair pays for the first one's write-back, and the
// alternation charges that to both alike. Each figure is total bytes over the summed time of
// its chunks, so a slow spell also hits both alike.
// Everything is O_DIRECT (the page cache is no warm tier). The tier writes with sync=none and
// the write figures of both include one final fdatasync (tier: Sync()).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "command.h"
#include "common/clock.h"
#include "kvtier/layout.h"
#include "tiers/disk/disk_store.h"
#include "tiers/disk/format.h"
#include "tiers/disk/io_engine.h"

namespace kvtier::cli {
namespace {

struct BenchArgs {
  std::string dir;
  bool json = false;
  std::string total = "1GiB";
  std::string block = "2MiB";
  std::vector<uint32_t> qds = {1, 8, 32};
  uint32_t chunks = 8;
  bool register_buffers = true;
  bool unaligned = false;  // caller buffers off page alignment: the tier's bounce-copy path
};

struct Row {
  std::string op;
  uint64_t block_bytes;
  uint32_t qd;
  double gbps;
  double baseline_gbps;
};

// The baseline: blocks [first, first + count) of a file, one pwrite/pread of one block at a
// time, from or into bufs[i % bufs.size()]: the same memory the tier is given, since a virtual
// disk moves a buffer it has just moved faster than a fresh one. Returns seconds, or a negative
// value on failure.
double BaselineChunk(int fd, bool write, uint64_t first, uint64_t count, uint64_t block,
                     std::span<const std::span<std::byte>> bufs) {
  const double t0 = MonotonicSeconds();
  for (uint64_t i = first; i < first + count; ++i) {
    const off_t off = static_cast<off_t>(i * block);
    std::byte* buf = bufs[i % bufs.size()].data();
    const ssize_t n = write ? ::pwrite(fd, buf, block, off) : ::pread(fd, buf, block, off);
    if (n != static_cast<ssize_t>(block)) {
      std::fprintf(stderr, "kvtier bench disk: baseline %s at %llu: %s\n",
                   write ? "pwrite" : "pread", static_cast<unsigned long long>(off),
                   n < 0 ? std::strerror(errno) : "short");
      return -1;
    }
  }
  return MonotonicSeconds() - t0;
}

int Fail(const std::string& what) {
  std::fprintf(stderr, "kvtier bench disk: %s\n", what.c_str());
  return 1;
}

int Run(const BenchArgs& a) {
  auto total_r = ParseByteSize(a.total);
  auto block_r = ParseByteSize(a.block);
  if (!total_r.ok() || !block_r.ok() || *block_r == 0 || *block_r % disk::kPageBytes != 0 ||
      a.chunks == 0 || a.qds.empty()) {
    std::fprintf(stderr,
                 "kvtier bench disk: --bytes and --block-bytes must be sizes, the block "
                 "a multiple of 4096; --chunks and --qd non-empty\n");
    return 2;
  }
  const uint64_t block = *block_r;
  const uint64_t per_chunk = std::max<uint64_t>(1, *total_r / block / a.chunks);
  const uint64_t nblocks = per_chunk * a.chunks;
  const uint64_t total = nblocks * block;
  std::string tmpl = a.dir + "/kvtier_bench_disk_XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) {
    std::fprintf(stderr, "kvtier bench disk: mkdtemp under %s: %s\n", a.dir.c_str(),
                 std::strerror(errno));
    return 2;
  }
  const std::string work = tmpl;
  struct Cleanup {
    std::string dir;
    ~Cleanup() { std::filesystem::remove_all(dir); }
  } cleanup{work};

  // Source blocks: distinct random buffers reused round-robin (pre-faulted), page-aligned like
  // a host arena's slots unless --unaligned.
  const uint32_t pool = static_cast<uint32_t>(std::min<uint64_t>(per_chunk, 32));
  const size_t skew = a.unaligned ? 64 : 0;
  std::vector<disk::AlignedBuffer> src_mem, out_mem;
  std::vector<std::span<const std::byte>> src;
  std::vector<std::span<std::byte>> outs;
  std::mt19937_64 rng(42);
  for (uint32_t p = 0; p < pool; ++p) {
    src_mem.emplace_back(block + disk::kPageBytes);
    for (size_t i = 0; i + 8 <= block; i += 8) {
      const uint64_t x = rng();
      std::memcpy(src_mem.back().data() + skew + i, &x, 8);
    }
    src.emplace_back(src_mem.back().data() + skew, block);
  }
  for (uint64_t k = 0; k < per_chunk; ++k) {
    out_mem.emplace_back(block + disk::kPageBytes);
    std::memset(out_mem.back().data(), 0, out_mem.back().size());  // pre-faulted
    outs.emplace_back(out_mem.back().data() + skew, block);
  }
  // The baseline's O_DIRECT needs page-aligned memory: the same buffers at their aligned start.
  std::vector<std::span<std::byte>> base_src, base_out;
  for (auto& m : src_mem) base_src.emplace_back(m.data(), block);
  for (auto& m : out_mem) base_out.emplace_back(m.data(), block);

  std::vector<Row> rows;
  std::string backend, notes;
  bool registered = false;
  double best_ratio_w = 0, best_ratio_r = 0;
  Progress progress("bench disk");
  std::vector<BlockKey> keys(per_chunk);
  std::vector<std::span<const std::byte>> blocks(per_chunk);
  std::vector<Status> results(per_chunk);
  for (size_t q = 0; q < a.qds.size(); ++q) {
    progress.Update(static_cast<double>(q), static_cast<double>(a.qds.size()));
    const std::string file = work + "/baseline.dat";
    const int bfd = ::open(file.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_DIRECT, 0644);
    if (bfd < 0) return Fail(file + ": " + std::strerror(errno));
    disk::DiskOptions o;
    o.path = work + "/tier_qd" + std::to_string(a.qds[q]);
    o.block_bytes = block;
    o.layout_fingerprint = 0xb3ac4d15cULL;
    o.segment_bytes = std::max<uint64_t>(256ull << 20, disk::kPageBytes + o.record_bytes());
    o.capacity_bytes = (nblocks * o.record_bytes() / o.segment_bytes + 3) * o.segment_bytes;
    o.queue_depth = a.qds[q];
    o.sync = disk::SyncPolicy::kNone;
    o.register_buffers = a.register_buffers;
    o.buffer_bytes = o.record_bytes() * a.qds[q];
    auto opened = disk::DiskStore::Open(o);
    if (!opened.ok()) return Fail(opened.status().ToString());
    disk::DiskStore& store = **opened;
    const disk::DiskStats st0 = store.stats();
    backend = st0.io_backend;
    registered = st0.registered_buffers;
    notes = st0.notes;

    // Writes, interleaved chunk by chunk.
    double tb = 0, tt = 0;
    for (uint32_t c = 0; c < a.chunks; ++c) {
      for (uint64_t k = 0; k < per_chunk; ++k) {
        keys[k] = BlockKey{c * per_chunk + k + 1, 0x5eed};
        blocks[k] = src[(c * per_chunk + k) % pool];
      }
      auto baseline = [&] {
        const double b = BaselineChunk(bfd, true, c * per_chunk, per_chunk, block, base_src);
        tb += b;
        return b >= 0;
      };
      if (c % 2 == 0 && !baseline()) return 1;
      const double t0 = MonotonicSeconds();
      store.Put(keys, blocks, results);
      tt += MonotonicSeconds() - t0;
      if (c % 2 == 1 && !baseline()) return 1;
      for (const Status& s : results) {
        if (!s.ok()) return Fail("put: " + s.ToString());
      }
    }
    double t0 = MonotonicSeconds();
    ::fdatasync(bfd);
    tb += MonotonicSeconds() - t0;
    t0 = MonotonicSeconds();
    if (Status s = store.Sync(); !s.ok()) return Fail("sync: " + s.ToString());
    tt += MonotonicSeconds() - t0;
    rows.push_back({"write", block, a.qds[q], total / tt / 1e9, total / tb / 1e9});

    // Reads, interleaved the same way, checking the bytes that came back.
    tb = tt = 0;
    for (uint32_t c = 0; c < a.chunks; ++c) {
      for (uint64_t k = 0; k < per_chunk; ++k) keys[k] = BlockKey{c * per_chunk + k + 1, 0x5eed};
      auto baseline = [&] {
        const double b = BaselineChunk(bfd, false, c * per_chunk, per_chunk, block, base_out);
        tb += b;
        return b >= 0;
      };
      if (c % 2 == 0 && !baseline()) return 1;
      t0 = MonotonicSeconds();
      store.Get(keys, outs, results);
      tt += MonotonicSeconds() - t0;
      if (c % 2 == 1 && !baseline()) return 1;
      for (const Status& s : results) {
        if (!s.ok()) return Fail("get: " + s.ToString());
      }
      const uint64_t k = c % per_chunk;
      if (std::memcmp(outs[k].data(), src[(c * per_chunk + k) % pool].data(), block) != 0) {
        return Fail("read back different bytes");
      }
    }
    rows.push_back({"read", block, a.qds[q], total / tt / 1e9, total / tb / 1e9});
    ::close(bfd);
    std::filesystem::remove(file);
    opened = Status::Internal("closed");
    std::filesystem::remove_all(o.path);
  }
  // For the record, the loop as it would run reusing one buffer for every block (no tier can:
  // its blocks come from many slots). Not interleaved, so only indicative.
  double one_buf_w = 0, one_buf_r = 0;
  {
    const std::string file = work + "/one_buffer.dat";
    const int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_DIRECT, 0644);
    if (fd < 0) return Fail(file + ": " + std::strerror(errno));
    const std::span<std::byte> one[1] = {base_src[0]};
    double t = BaselineChunk(fd, true, 0, nblocks, block, one);
    const double t0 = MonotonicSeconds();
    ::fdatasync(fd);
    t += MonotonicSeconds() - t0;
    const double tr = BaselineChunk(fd, false, 0, nblocks, block, one);
    ::close(fd);
    std::filesystem::remove(file);
    if (t < 0 || tr < 0) return 1;
    one_buf_w = total / t / 1e9;
    one_buf_r = total / tr / 1e9;
  }
  for (const Row& r : rows) {
    double& best = r.op == "write" ? best_ratio_w : best_ratio_r;
    best = std::max(best, r.gbps / r.baseline_gbps);
  }
  if (a.json) {
    nlohmann::json j;
    j["disk"] = nlohmann::json::array();
    for (const Row& r : rows) {
      j["disk"].push_back({{"op", r.op},
                           {"block_bytes", r.block_bytes},
                           {"qd", r.qd},
                           {"gbps", r.gbps},
                           {"baseline_gbps", r.baseline_gbps},
                           {"ratio", r.gbps / r.baseline_gbps}});
    }
    j["config"] = {
        {"total_bytes", total},
        {"chunks", a.chunks},
        {"io_backend", backend},
        {"registered_buffers", registered},
        {"notes", notes},
        {"caller_buffers", a.unaligned ? "unaligned (bounce copy)" : "page-aligned (zero copy)"},
        {"one_buffer_loop_gbps", {{"write", one_buf_w}, {"read", one_buf_r}}}};
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf(
        "disk tier vs plain O_DIRECT sequential loop, interleaved in %u chunks: %s in %s "
        "blocks, %s%s, %s caller buffers%s\n",
        a.chunks, FormatBytes(total).c_str(), FormatBytes(block).c_str(), backend.c_str(),
        registered ? " (registered buffers)" : "", a.unaligned ? "unaligned" : "aligned",
        notes.empty() ? "" : (" [" + notes + "]").c_str());
    std::printf("%-6s %4s %10s %14s %7s\n", "op", "qd", "GB/s", "baseline GB/s", "ratio");
    for (const Row& r : rows) {
      std::printf("%-6s %4u %10.3f %14.3f %7.2f\n", r.op.c_str(), r.qd, r.gbps, r.baseline_gbps,
                  r.gbps / r.baseline_gbps);
    }
    std::printf("best of queue depths: write %.2fx, read %.2fx the baseline (bar 0.90x)\n",
                best_ratio_w, best_ratio_r);
    std::printf(
        "(the loop reusing one buffer for every block, not interleaved: write %.3f, read %.3f "
        "GB/s)\n",
        one_buf_w, one_buf_r);
  }
  return 0;
}

}  // namespace
}  // namespace kvtier::cli

KVTIER_REGISTER_COMMAND(
    bench_disk, ({"bench", "disk"}),
    "Disk tier write/read GB/s at queue depths 1/8/32 beside a same-run O_DIRECT loop",
    [](CLI::App* app) -> kvtier::cli::RunFn {
      auto a = std::make_shared<kvtier::cli::BenchArgs>();
      app->add_option("--dir", a->dir,
                      "Directory on the disk to measure (a temp dir is made in it)")
          ->required();
      app->add_flag("--json", a->json, "JSON output");
      app->add_option("--bytes", a->total, "Total bytes per queue depth and op (default 1GiB)");
      app->add_option("--block-bytes", a->block, "Block size (default 2MiB)");
      app->add_option("--qd", a->qds, "Queue depths (default 1 8 32)");
      app->add_option("--chunks", a->chunks,
                      "Baseline/tier alternations per figure (default 8); one Put/Get per chunk");
      app->add_flag("!--no-register-buffers", a->register_buffers,
                    "Do not register io_uring buffers");
      app->add_flag("--unaligned", a->unaligned,
                    "Caller buffers off page alignment (measures the bounce-copy path)");
      return [a] { return kvtier::cli::Run(*a); };
    });
