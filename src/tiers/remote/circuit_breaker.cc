#include "tiers/remote/circuit_breaker.h"

#include <algorithm>
#include <string>

namespace kvtier::remote {

Status CircuitBreakerOptions::Validate() const {
  if (failure_threshold < 1) {
    return Status::InvalidArgument("breaker_failures: must be >= 1, got " +
                                   std::to_string(failure_threshold));
  }
  if (initial_backoff_ns <= 0) return Status::InvalidArgument("breaker_backoff_ms: must be > 0");
  if (max_backoff_ns < initial_backoff_ns) {
    return Status::InvalidArgument("breaker_max_backoff_ms: must be >= breaker_backoff_ms");
  }
  return Status::Ok();
}

CircuitBreaker::CircuitBreaker(CircuitBreakerOptions options, uint64_t jitter_seed)
    : options_(options), backoff_ns_(options.initial_backoff_ns), rng_(jitter_seed | 1) {}

bool CircuitBreaker::Allow(int64_t now_ns) {
  switch (state_) {
    case State::kClosed:
      return true;
    case State::kOpen:
      if (now_ns < retry_at_ns_) return false;
      state_ = State::kHalfOpen;
      return true;
    case State::kHalfOpen:
      return false;
  }
  return false;
}

void CircuitBreaker::RecordSuccess() {
  state_ = State::kClosed;
  failures_ = 0;
  backoff_ns_ = options_.initial_backoff_ns;
}

void CircuitBreaker::RecordFailure(int64_t now_ns) {
  if (state_ == State::kHalfOpen) {
    backoff_ns_ = std::min(backoff_ns_ * 2, options_.max_backoff_ns);
    Open(now_ns);
    return;
  }
  if (state_ == State::kOpen) return;  // a call that was already in flight when it opened
  if (++failures_ >= options_.failure_threshold) Open(now_ns);
}

void CircuitBreaker::Open(int64_t now_ns) {
  state_ = State::kOpen;
  ++opens_;
  // xorshift64: jitter spreads the probes of many replicas so they do not arrive together.
  rng_ ^= rng_ << 13;
  rng_ ^= rng_ >> 7;
  rng_ ^= rng_ << 17;
  int64_t jitter = static_cast<int64_t>(rng_ % static_cast<uint64_t>(backoff_ns_ / 4 + 1));
  retry_at_ns_ = now_ns + backoff_ns_ + jitter;
}

}  // namespace kvtier::remote
