// LogLimiter: lets one message through per interval, for errors that would otherwise repeat on
// every call (a full disk, a dead server) and drown the log.
//
// Thread-safety: Allow() may be called from any thread.
#ifndef KVTIER_COMMON_LOG_LIMITER_H_
#define KVTIER_COMMON_LOG_LIMITER_H_

#include <atomic>
#include <chrono>
#include <cstdint>

#include "common/clock.h"

namespace kvtier {

class LogLimiter {
 public:
  static constexpr int64_t kIntervalS = 10;

  // True for the first call and then at most once every kIntervalS seconds.
  bool Allow() {
    const int64_t now =
        std::chrono::duration_cast<std::chrono::seconds>(MonotonicNow().time_since_epoch()).count();
    int64_t last = last_s_.load(std::memory_order_relaxed);
    return (last == kNever || now - last >= kIntervalS) &&
           last_s_.compare_exchange_strong(last, now, std::memory_order_relaxed);
  }

 private:
  static constexpr int64_t kNever = INT64_MIN;
  std::atomic<int64_t> last_s_{kNever};
};

}  // namespace kvtier

#endif  // KVTIER_COMMON_LOG_LIMITER_H_
