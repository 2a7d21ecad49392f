// XXH3-64 of block payloads on the widest vector unit the CPU has: AVX2 when present (chosen
// once at run time), else the baseline build. Values are XXH3-64 with seed 0 either way. The
// block checksums of the Cache, the disk records and the remote values all come from here: a
// baseline-only streaming update was a third of a remote Get's client CPU.
#ifndef KVTIER_SRC_HASH_XXH3_WIDE_H_
#define KVTIER_SRC_HASH_XXH3_WIDE_H_

#include <cstddef>
#include <cstdint>

#include "hash/xxh.h"

namespace kvtier {

#if defined(__x86_64__)
uint64_t Xxh3Avx2(const void* data, size_t len);                         // xxh3_avx2.cc
void Xxh3UpdateAvx2(XXH3_state_t* state, const void* data, size_t len);  // xxh3_avx2.cc

inline bool HaveAvx2() {
  static const bool kAvx2 = __builtin_cpu_supports("avx2");
  return kAvx2;
}
#endif

// Short inputs (headers) stay on the inline baseline code: the call would cost more.
inline uint64_t WideXxh3(const void* data, size_t len) {
#if defined(__x86_64__)
  if (len >= 1024 && HaveAvx2()) return Xxh3Avx2(data, len);
#endif
  return XXH3_64bits(data, len);
}

inline void WideXxh3Update(XXH3_state_t* state, const void* data, size_t len) {
#if defined(__x86_64__)
  if (len >= 1024 && HaveAvx2()) {
    Xxh3UpdateAvx2(state, data, len);
    return;
  }
#endif
  (void)XXH3_64bits_update(state, data, len);
}

}  // namespace kvtier

#endif  // KVTIER_SRC_HASH_XXH3_WIDE_H_
