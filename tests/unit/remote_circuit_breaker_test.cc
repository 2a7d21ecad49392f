// The remote tier's circuit breaker (circuit_breaker.h): opens after the threshold, probes
// with backoff, and validates its options. No server needed.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <string>
#include <vector>

#include "tiers/remote/circuit_breaker.h"

namespace kvtier::remote {
namespace {

TEST(CircuitBreakerTest, OpensAfterThresholdAndProbesWithBackoff) {
  CircuitBreakerOptions o;
  o.failure_threshold = 3;
  o.initial_backoff_ns = 100;
  o.max_backoff_ns = 400;
  ASSERT_TRUE(o.Validate().ok());
  CircuitBreaker b(o, 42);
  int64_t t = 1000;
  EXPECT_TRUE(b.Allow(t));
  b.RecordFailure(t);
  b.RecordFailure(t);
  EXPECT_EQ(b.state(), CircuitBreaker::State::kClosed);
  b.RecordSuccess();  // a success resets the count
  b.RecordFailure(t);
  b.RecordFailure(t);
  EXPECT_EQ(b.state(), CircuitBreaker::State::kClosed);
  b.RecordFailure(t);
  EXPECT_EQ(b.state(), CircuitBreaker::State::kOpen);
  EXPECT_FALSE(b.Allow(t + 99));
  int64_t first_retry = b.retry_at_ns();
  EXPECT_GE(first_retry, t + 100);
  EXPECT_LE(first_retry, t + 125);    // at most 25% jitter
  EXPECT_TRUE(b.Allow(first_retry));  // the probe
  EXPECT_EQ(b.state(), CircuitBreaker::State::kHalfOpen);
  EXPECT_FALSE(b.Allow(first_retry));  // one probe at a time
  b.RecordFailure(first_retry);        // the probe failed: backoff doubles
  EXPECT_EQ(b.state(), CircuitBreaker::State::kOpen);
  EXPECT_GE(b.retry_at_ns(), first_retry + 200);
  EXPECT_LE(b.retry_at_ns(), first_retry + 250);
  // Repeated failed probes cap at max_backoff.
  for (int i = 0; i < 5; ++i) {
    int64_t at = b.retry_at_ns();
    ASSERT_TRUE(b.Allow(at));
    b.RecordFailure(at);
    EXPECT_LE(b.retry_at_ns() - at, 400 + 100);
  }
  ASSERT_TRUE(b.Allow(b.retry_at_ns()));
  b.RecordSuccess();
  EXPECT_EQ(b.state(), CircuitBreaker::State::kClosed);
  EXPECT_TRUE(b.Allow(0));
  EXPECT_EQ(b.opens(), 7u);
}

TEST(CircuitBreakerTest, ValidateNamesTheField) {
  CircuitBreakerOptions o;
  o.failure_threshold = 0;
  EXPECT_NE(o.Validate().message().find("breaker_failures"), std::string::npos);
  o = {};
  o.max_backoff_ns = o.initial_backoff_ns - 1;
  EXPECT_NE(o.Validate().message().find("breaker_max_backoff_ms"), std::string::npos);
}

}  // namespace
}  // namespace kvtier::remote
