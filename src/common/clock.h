// Monotonic time for latency stats and policy hints.
#ifndef KVTIER_SRC_COMMON_CLOCK_H_
#define KVTIER_SRC_COMMON_CLOCK_H_

#include <chrono>
#include <cstdint>

namespace kvtier {

inline uint64_t MonotonicNs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

inline double MonotonicSeconds() { return static_cast<double>(MonotonicNs()) * 1e-9; }

}  // namespace kvtier

#endif  // KVTIER_SRC_COMMON_CLOCK_H_
