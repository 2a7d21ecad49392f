// CircuitBreaker: stops calling a remote node that keeps failing, and probes it again with
// exponential backoff.
//
//   closed     calls go through; `failure_threshold` failures in a row open the breaker.
//   open       calls fail fast until the backoff has passed; then one call may probe.
//   half-open  one probe is in flight; its success closes the breaker, its failure reopens it
//              with the backoff doubled (capped at max_backoff), plus up to 25% jitter.
//
// Time is passed in (steady nanoseconds), so tests drive it without sleeping.
// Thread-safety: not thread-safe; the owner serialises calls (RemoteTier holds a node mutex).
#ifndef KVTIER_TIERS_REMOTE_CIRCUIT_BREAKER_H_
#define KVTIER_TIERS_REMOTE_CIRCUIT_BREAKER_H_

#include <cstdint>

#include "kvtier/status.h"

namespace kvtier::remote {

struct CircuitBreakerOptions {
  int failure_threshold = 3;                 // failures in a row that open the breaker, >= 1
  int64_t initial_backoff_ns = 100'000'000;  // 100 ms
  int64_t max_backoff_ns = 5'000'000'000;    // 5 s

  Status Validate() const;
};

class CircuitBreaker {
 public:
  enum class State : uint8_t { kClosed, kOpen, kHalfOpen };

  explicit CircuitBreaker(CircuitBreakerOptions options = {}, uint64_t jitter_seed = 1);

  // True when a call may go out now. In the open state after the backoff it returns true once
  // (the probe) and moves to half-open; further calls are refused until the probe reports.
  bool Allow(int64_t now_ns);
  void RecordSuccess();
  void RecordFailure(int64_t now_ns);

  State state() const { return state_; }
  // When an open breaker lets the next probe through.
  int64_t retry_at_ns() const { return retry_at_ns_; }
  uint64_t opens() const { return opens_; }

 private:
  void Open(int64_t now_ns);

  CircuitBreakerOptions options_;
  State state_ = State::kClosed;
  int failures_ = 0;
  int64_t backoff_ns_ = 0;
  int64_t retry_at_ns_ = 0;
  uint64_t opens_ = 0;
  uint64_t rng_;
};

}  // namespace kvtier::remote

#endif  // KVTIER_TIERS_REMOTE_CIRCUIT_BREAKER_H_
