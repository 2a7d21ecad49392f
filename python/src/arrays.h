// Shared by the binding's files: CPU arrays seen as bytes, and raising kvtier errors.
#ifndef KVTIER_PYTHON_SRC_ARRAYS_H_
#define KVTIER_PYTHON_SRC_ARRAYS_H_

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

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

// Splits one buffer (n whole blocks) or a list of buffers (one block each) into block spans.
template <typename Array, typename Span>
std::vector<Span> Blocks(nanobind::handle buffers, uint64_t block_bytes, const char* what) {
  std::vector<Span> out;
  Array one;
  if (nanobind::try_cast(buffers, one, false)) {
    auto bytes = BytesOf(one, what);
    if (bytes.size() % block_bytes != 0)
      RaiseInvalidArgument(std::string(what) + ": a buffer of " + std::to_string(bytes.size()) +
                           " bytes is not a whole number of " + std::to_string(block_bytes) +
                           "-byte blocks");
    for (size_t off = 0; off < bytes.size(); off += block_bytes)
      out.push_back(Span(bytes.data() + off, block_bytes));
    return out;
  }
  if (!nanobind::isinstance<nanobind::sequence>(buffers) ||
      nanobind::isinstance<nanobind::str>(buffers))
    RaiseInvalidArgument(std::string(what) + ": expected an array or a list of arrays");
  size_t i = 0;
  for (nanobind::handle item : buffers) {
    Array a;
    if (!nanobind::try_cast(item, a, false))
      RaiseInvalidArgument(std::string(what) + "[" + std::to_string(i) +
                           "]: not a writable CPU array (numpy, or torch through DLPack)");
    auto bytes = BytesOf(a, what);
    if (bytes.size() != block_bytes)
      RaiseInvalidArgument(std::string(what) + "[" + std::to_string(i) +
                           "]: " + std::to_string(bytes.size()) + " bytes, a block is " +
                           std::to_string(block_bytes));
    out.push_back(Span(bytes.data(), bytes.size()));
    ++i;
  }
  return out;
}

}  // namespace kvtier

#endif  // KVTIER_PYTHON_SRC_ARRAYS_H_
