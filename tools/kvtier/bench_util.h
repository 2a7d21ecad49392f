// Pieces the `kvtier bench` commands share: the median they report and a pre-faulted buffer.
#ifndef KVTIER_TOOLS_KVTIER_BENCH_UTIL_H_
#define KVTIER_TOOLS_KVTIER_BENCH_UTIL_H_

#include <sys/mman.h>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace kvtier::cli {

// The median; of an even count, the mean of the middle two.
inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0 : n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// A pre-faulted buffer: a fresh page costs far more than the copy being measured. The caller
// fills it.
struct PrefaultedBuffer {
  std::byte* p = nullptr;
  size_t n = 0;
  explicit PrefaultedBuffer(size_t bytes) : n(bytes) {
    void* m =
        mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (m == MAP_FAILED) {
      std::perror("mmap");
      std::exit(1);
    }
    p = static_cast<std::byte*>(m);
  }
  ~PrefaultedBuffer() { munmap(p, n); }
  PrefaultedBuffer(const PrefaultedBuffer&) = delete;
  PrefaultedBuffer& operator=(const PrefaultedBuffer&) = delete;
};

}  // namespace kvtier::cli

#endif  // KVTIER_TOOLS_KVTIER_BENCH_UTIL_H_
