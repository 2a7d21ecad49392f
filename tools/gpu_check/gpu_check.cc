// gpu_check: the CUDA copy path on a real GPU. For blocks of 64 KiB to 8 MiB it prints H2D and
// D2H GB/s of kvtier's CudaCopier (one batch per layer, events) beside a same-run loop of
// cudaMemcpyAsync over the same pinned buffers, the per-block overhead, and checks every byte
// of a round trip and the order of layer events. Depends on the CUDA runtime alone, so
// scripts/gpu-check builds it with nvcc on a machine that has none of kvtier's Debian packages.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "transfer/cuda_copier.h"

namespace kvtier {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::chrono::milliseconds kTimeout{60000};

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

#define CHECK_CUDA(expr)                                                          \
  do {                                                                            \
    cudaError_t e_ = (expr);                                                      \
    if (e_ != cudaSuccess) {                                                      \
      std::fprintf(stderr, "gpu_check: %s: %s\n", #expr, cudaGetErrorString(e_)); \
      return 1;                                                                   \
    }                                                                             \
  } while (0)

#define CHECK_OK(expr)                                                           \
  do {                                                                           \
    Status s_ = (expr);                                                          \
    if (!s_.ok()) {                                                              \
      std::fprintf(stderr, "gpu_check: %s: %s\n", #expr, s_.ToString().c_str()); \
      return 1;                                                                  \
    }                                                                            \
  } while (0)

int Run(const char* json_path) {
  Status avail = CudaAvailable();
  if (!avail.ok()) {
    std::fprintf(stderr, "gpu_check: %s\n", avail.ToString().c_str());
    return 2;
  }
  auto copier = CudaCopier::Open(0);
  if (!copier.ok()) {
    std::fprintf(stderr, "gpu_check: %s\n", copier.status().ToString().c_str());
    return 1;
  }
  const size_t total = size_t{1} << 30;  // bytes per measurement
  std::byte* host = nullptr;
  std::byte* back = nullptr;
  std::byte* dev = nullptr;
  CHECK_CUDA(cudaHostAlloc(reinterpret_cast<void**>(&host), total, cudaHostAllocDefault));
  CHECK_CUDA(cudaHostAlloc(reinterpret_cast<void**>(&back), total, cudaHostAllocDefault));
  CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&dev), total));
  for (size_t i = 0; i < total; ++i) host[i] = static_cast<std::byte>((i * 2654435761u) >> 13);
  cudaStream_t base_stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&base_stream, cudaStreamNonBlocking));

  std::printf("device: %s; batched API: %s\n", (*copier)->device_name().c_str(),
              (*copier)->batched() ? "cudaMemcpyBatchAsync" : "cudaMemcpyAsync loop");
  std::printf("%-9s %-4s %7s %12s %14s %7s %16s\n", "block", "dir", "blocks", "kvtier GB/s",
              "baseline GB/s", "ratio", "overhead us/blk");
  std::string json = "{\"device\":\"" + (*copier)->device_name() + "\",\"rows\":[";
  bool first_row = true;
  for (size_t block : {size_t{64} << 10, size_t{256} << 10, size_t{1} << 20, size_t{2} << 20,
                       size_t{4} << 20, size_t{8} << 20}) {
    const size_t n = std::min<size_t>(total / block, 16384);
    const size_t bytes = n * block;
    for (CopyDirection dir : {CopyDirection::kHostToDevice, CopyDirection::kDeviceToHost}) {
      const bool h2d = dir == CopyDirection::kHostToDevice;
      // Every other block, so nothing coalesces: the per-block path is what is measured.
      const size_t stride = 2 * block;
      const size_t m = std::min(n, total / stride);
      std::vector<CopySegment> segs;
      for (size_t i = 0; i < m; ++i) {
        std::byte* h = (h2d ? host : back) + i * stride;
        std::byte* d = dev + i * stride;
        segs.push_back(h2d ? CopySegment{h, d, block, 0} : CopySegment{d, h, block, 0});
      }
      std::vector<double> ours, base;
      for (int rep = 0; rep < 7; ++rep) {
        auto t0 = Clock::now();
        CHECK_OK((*copier)->Post(dir, segs, 1));
        CHECK_OK((*copier)->WaitAll(dir, kTimeout));
        auto t1 = Clock::now();
        for (const CopySegment& s : segs)
          CHECK_CUDA(cudaMemcpyAsync(s.dst, s.src, s.bytes,
                                     h2d ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost,
                                     base_stream));
        CHECK_CUDA(cudaStreamSynchronize(base_stream));
        auto t2 = Clock::now();
        if (rep > 0) {  // the first is a warm-up
          ours.push_back(Seconds(t0, t1));
          base.push_back(Seconds(t1, t2));
        }
      }
      const double moved = static_cast<double>(m * block);
      const double g_ours = moved / Median(ours) / 1e9, g_base = moved / Median(base) / 1e9;
      const double overhead_us = (Median(ours) - Median(base)) / static_cast<double>(m) * 1e6;
      std::printf("%-9zu %-4s %7zu %12.2f %14.2f %7.3f %16.2f\n", block, h2d ? "h2d" : "d2h", m,
                  g_ours, g_base, g_ours / g_base, overhead_us);
      char row[256];
      std::snprintf(row, sizeof row,
                    "%s{\"block_bytes\":%zu,\"dir\":\"%s\",\"blocks\":%zu,\"gbps\":%.3f,"
                    "\"baseline_gbps\":%.3f,\"ratio\":%.4f,\"overhead_us_per_block\":%.3f}",
                    first_row ? "" : ",", block, h2d ? "h2d" : "d2h", m, g_ours, g_base,
                    g_ours / g_base, overhead_us);
      json += row;
      first_row = false;
      (void)bytes;
    }
  }

  // A layer-wise round trip: 32 layers of 64 blocks of 256 KiB; every layer's event fires in
  // order and every byte comes back.
  const uint32_t layers = 32;
  const size_t lb = size_t{256} << 10, blocks = 64;
  std::vector<CopySegment> up, down;
  for (uint32_t l = 0; l < layers; ++l)
    for (size_t b = 0; b < blocks; ++b) {
      const size_t off = (l * blocks + b) * lb;
      up.push_back({host + off, dev + off, lb, l});
      down.push_back({dev + off, back + off, lb, l});
    }
  std::memset(back, 0, layers * blocks * lb);
  CHECK_OK((*copier)->Post(CopyDirection::kHostToDevice, up, layers));
  for (uint32_t l = 0; l < layers; ++l)
    CHECK_OK((*copier)->WaitLayer(CopyDirection::kHostToDevice, l, kTimeout));
  CHECK_OK((*copier)->Post(CopyDirection::kDeviceToHost, down, layers));
  CHECK_OK((*copier)->WaitAll(CopyDirection::kDeviceToHost, kTimeout));
  const bool equal = std::memcmp(host, back, layers * blocks * lb) == 0;
  std::printf("layer-wise round trip of %u layers x %zu blocks: %s\n", layers, blocks,
              equal ? "bytes equal" : "BYTES DIFFER");
  json += std::string("],\"layerwise_round_trip_equal\":") + (equal ? "true" : "false") + "}";
  if (json_path != nullptr) {
    FILE* f = std::fopen(json_path, "w");
    if (f == nullptr) {
      std::perror(json_path);
      return 1;
    }
    std::fprintf(f, "%s\n", json.c_str());
    std::fclose(f);
  }
  cudaFree(dev);
  cudaFreeHost(host);
  cudaFreeHost(back);
  return equal ? 0 : 1;
}

}  // namespace
}  // namespace kvtier

int main(int argc, char** argv) {
  const char* json = nullptr;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0 && i + 1 < argc) {
      json = argv[++i];
    } else {
      std::fprintf(stderr, "usage: gpu_check [--json PATH]\n");
      return 64;
    }
  }
  return kvtier::Run(json);
}
