#include "kvtier/status.h"

#include <gtest/gtest.h>

#include <memory>

namespace kvtier {
namespace {

Result<int> Half(int x) {
  if (x % 2) return Status::InvalidArgument("odd: " + std::to_string(x));
  return x / 2;
}

Result<int> Quarter(int x) {
  KVTIER_ASSIGN_OR_RETURN(int h, Half(x));
  KVTIER_ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

Status CheckPositive(int x) {
  if (x <= 0) return Status::InvalidArgument("not positive");
  return Status::Ok();
}

Status Both(int a, int b) {
  KVTIER_RETURN_IF_ERROR(CheckPositive(a));
  KVTIER_RETURN_IF_ERROR(CheckPositive(b));
  return Status::Ok();
}

TEST(StatusTest, CodesAndMessages) {
  EXPECT_TRUE(Status::Ok().ok());
  EXPECT_TRUE(Status().message().empty());
  Status s = Status::Corruption("segment 3 offset 4096: checksum mismatch");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
  EXPECT_EQ(s.ToString(), "Corruption: segment 3 offset 4096: checksum mismatch");
  EXPECT_TRUE(Status::Unavailable("x").IsRetryable());
  EXPECT_FALSE(Status::Corruption("x").IsRetryable());
  EXPECT_TRUE(Status::NotFound("x").IsNotFound());
  EXPECT_EQ(Status::NotFound("k").WithContext("host").ToString(), "NotFound: host: k");
  EXPECT_TRUE(Status::Ok().WithContext("ignored").ok());
}

TEST(StatusTest, ResultValueAndError) {
  Result<int> good = Quarter(12);
  ASSERT_TRUE(good.ok());
  EXPECT_EQ(*good, 3);
  Result<int> bad = Quarter(6);  // 6 -> 3 -> odd
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(), "odd: 3");
  EXPECT_TRUE(Both(1, 2).ok());
  EXPECT_EQ(Both(1, -2).message(), "not positive");
}

TEST(StatusTest, ResultHoldsMoveOnlyTypes) {
  Result<std::unique_ptr<int>> r = std::make_unique<int>(7);
  ASSERT_TRUE(r.ok());
  std::unique_ptr<int> p = std::move(r).value();
  EXPECT_EQ(*p, 7);
  Result<std::unique_ptr<int>> copy_target = Status::NotFound("none");
  copy_target = std::make_unique<int>(9);
  EXPECT_EQ(**copy_target, 9);
}

TEST(StatusTest, ResultFromOkStatusIsAnError) {
  Result<int> r = Status::Ok();
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInternal);
}

TEST(StatusDeathTest, ValueOfErrorAborts) {
  Result<int> r = Status::NotFound("gone");
  EXPECT_DEATH((void)r.value(), "NotFound: gone");
}

}  // namespace
}  // namespace kvtier
