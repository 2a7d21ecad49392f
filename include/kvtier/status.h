// Status and Result<T>: kvtier's one error model. No exception crosses the API.
//
// A code says what the caller does next:
//   kOk                 success.
//   kNotFound           a miss: the block is not there. Not an error; recompute it.
//   kInvalidArgument    the caller's input is wrong; retrying the same call fails again.
//   kUnavailable        transient (a tier is down or timed out); retry later or degrade.
//   kResourceExhausted  out of capacity (tier full, all candidates pinned, server at maxmemory).
//   kCorruption         the stored bytes failed verification: drop the block and recompute.
//   kInternal           a bug or an unexpected system failure.
//
// Thread-safety: Status and Result are values; distinct objects may be used concurrently.
// An OK Status holds no heap memory.
#ifndef KVTIER_STATUS_H_
#define KVTIER_STATUS_H_

#include <cstdint>
#include <new>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace kvtier {

enum class StatusCode : uint8_t {
  kOk = 0,
  kNotFound,
  kInvalidArgument,
  kUnavailable,
  kResourceExhausted,
  kCorruption,
  kInternal,
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  static Status NotFound(std::string msg) { return {StatusCode::kNotFound, std::move(msg)}; }
  static Status InvalidArgument(std::string msg) {
    return {StatusCode::kInvalidArgument, std::move(msg)};
  }
  static Status Unavailable(std::string msg) { return {StatusCode::kUnavailable, std::move(msg)}; }
  static Status ResourceExhausted(std::string msg) {
    return {StatusCode::kResourceExhausted, std::move(msg)};
  }
  static Status Corruption(std::string msg) { return {StatusCode::kCorruption, std::move(msg)}; }
  static Status Internal(std::string msg) { return {StatusCode::kInternal, std::move(msg)}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  bool IsNotFound() const { return code_ == StatusCode::kNotFound; }
  bool IsRetryable() const { return code_ == StatusCode::kUnavailable; }

  // "Corruption: segment 3 offset 4096: checksum mismatch".
  std::string ToString() const;

  // Prefixes context to the message of a non-OK status; OK stays OK.
  Status WithContext(std::string_view context) const;

  friend bool operator==(const Status& a, const Status& b) {
    return a.code_ == b.code_ && a.message_ == b.message_;
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// Result<T> holds a T or a non-OK Status (an expected-style type for C++20).
// Accessing value() of a failed Result is a precondition violation (it aborts).
template <typename T>
class [[nodiscard]] Result {
 public:
  static_assert(!std::is_same_v<std::remove_cv_t<T>, Status>, "use Status directly");

  Result(T value) : has_value_(true) { new (&value_) T(std::move(value)); }  // NOLINT
  Result(Status status) : status_(std::move(status)) {                       // NOLINT
    if (status_.ok()) status_ = Status::Internal("Result built from an OK Status without a value");
  }
  Result(const Result& other) : status_(other.status_), has_value_(other.has_value_) {
    if (has_value_) new (&value_) T(other.value_);
  }
  Result(Result&& other) noexcept(std::is_nothrow_move_constructible_v<T>)
      : status_(std::move(other.status_)), has_value_(other.has_value_) {
    if (has_value_) new (&value_) T(std::move(other.value_));
  }
  Result& operator=(Result other) {
    Reset();
    status_ = std::move(other.status_);
    has_value_ = other.has_value_;
    if (has_value_) new (&value_) T(std::move(other.value_));
    return *this;
  }
  ~Result() { Reset(); }

  bool ok() const { return has_value_; }
  explicit operator bool() const { return has_value_; }
  // OK when a value is present.
  const Status& status() const { return status_; }

  T& value() & {
    CheckValue();
    return value_;
  }
  const T& value() const& {
    CheckValue();
    return value_;
  }
  T&& value() && {
    CheckValue();
    return std::move(value_);
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  void Reset() {
    if (has_value_) value_.~T();
    has_value_ = false;
  }
  void CheckValue() const {
    if (!has_value_) AbortOnBadAccess(status_);
  }
  [[noreturn]] static void AbortOnBadAccess(const Status& s);

  Status status_;
  bool has_value_ = false;
  union {
    T value_;
  };
};

[[noreturn]] void AbortWithStatus(const char* what, const Status& s);

template <typename T>
void Result<T>::AbortOnBadAccess(const Status& s) {
  AbortWithStatus("Result::value() on an error", s);
}

}  // namespace kvtier

// Returns from the enclosing function when `expr` (a Status) is not OK.
#define KVTIER_RETURN_IF_ERROR(expr)         \
  do {                                       \
    ::kvtier::Status _kvtier_st = (expr);    \
    if (!_kvtier_st.ok()) return _kvtier_st; \
  } while (0)

#define KVTIER_CONCAT_INNER_(a, b) a##b
#define KVTIER_CONCAT_(a, b) KVTIER_CONCAT_INNER_(a, b)
// KVTIER_ASSIGN_OR_RETURN(auto x, MakeX()); returns the Status when the Result failed.
#define KVTIER_ASSIGN_OR_RETURN(lhs, expr) \
  KVTIER_ASSIGN_OR_RETURN_IMPL_(KVTIER_CONCAT_(_kvtier_res_, __LINE__), lhs, expr)
#define KVTIER_ASSIGN_OR_RETURN_IMPL_(res, lhs, expr) \
  auto res = (expr);                                  \
  if (!res.ok()) return res.status();                 \
  lhs = std::move(res).value()

#endif  // KVTIER_STATUS_H_
