// The library's one clock: std::chrono::steady_clock (monotonic, never jumps), for latency
// stats, policy hints, deadlines and rate limits alike. Code in src/ reads time through these
// functions, never steady_clock::now() directly, so there is one place to swap the clock (a
// test clock, per STYLE.md's seams) when one is needed.
//
// The one exception is wall-clock time that leaves the process (a disk segment's creation
// stamp, doc/disk_format.md): that is std::chrono::system_clock, read where it is written.
//
// Thread-safety: pure functions.
#ifndef KVTIER_SRC_COMMON_CLOCK_H_
#define KVTIER_SRC_COMMON_CLOCK_H_

#include <chrono>
#include <cstdint>

namespace kvtier {

using MonotonicClock = std::chrono::steady_clock;

// Now, as a time point: for deadlines (`MonotonicNow() + timeout`) and condition-variable waits.
inline MonotonicClock::time_point MonotonicNow() { return MonotonicClock::now(); }

// Now, in nanoseconds since the clock's epoch: for latency histograms.
inline uint64_t MonotonicNs() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(MonotonicNow().time_since_epoch())
          .count());
}

// Now, in seconds since the clock's epoch: for policy hints (AccessHint::now_s).
inline double MonotonicSeconds() { return static_cast<double>(MonotonicNs()) * 1e-9; }

}  // namespace kvtier

#endif  // KVTIER_SRC_COMMON_CLOCK_H_
