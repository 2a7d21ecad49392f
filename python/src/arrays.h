// Shared by the binding's files: CPU arrays seen as bytes, and raising kvtier errors.
#ifndef KVTIER_PYTHON_SRC_ARRAYS_H_
#define KVTIER_PYTHON_SRC_ARRAYS_H_

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "kvtier/status.h"

namespace kvtier {

// Raises kvtier.<Code> carrying the status's message (module.cc).
[[noreturn]] void RaiseStatus(const Status& s);
[[noreturn]] inline void RaiseInvalidArgument(const std::string& message) {
  RaiseStatus(Status::InvalidArgument(message));
}

// Any CPU ndarray, any dtype; contiguity and size are checked where used, so a wrong buffer is
// a ValueError naming it, never a write past its end.
using AnyArray = nanobind::ndarray<nanobind::device::cpu>;
using AnyConstArray = nanobind::ndarray<nanobind::ro, nanobind::device::cpu>;

template <typename Array>
std::span<std::byte> BytesOf(const Array& a, const char* what) {
  int64_t expect = 1;
  for (size_t d = a.ndim(); d-- > 0;) {
    if (a.shape(d) != 1 && a.stride(d) != expect)
      RaiseInvalidArgument(std::string(what) + ": the buffer is not C-contiguous");
    expect *= static_cast<int64_t>(a.shape(d));
  }
  auto* p = static_cast<std::byte*>(const_cast<void*>(static_cast<const void*>(a.data())));
  return {p, a.nbytes()};
}

}  // namespace kvtier

#endif  // KVTIER_PYTHON_SRC_ARRAYS_H_
