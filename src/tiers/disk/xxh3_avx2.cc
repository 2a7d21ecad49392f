// XXH3-64 compiled for AVX2, chosen at run time by Xxh3() when the CPU has it: the same
// function and values as the baseline (SSE2) build, about twice as fast on 2 MiB blocks here.
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>  // the AVX2 types, which xxhash.h includes only under __AVX2__
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2")
#endif
#define XXH_INLINE_ALL
#define XXH_VECTOR 2  // XXH_AVX2
#include <xxhash.h>

namespace kvtier::disk {
uint64_t Xxh3Avx2(const void* data, size_t len) { return XXH3_64bits(data, len); }
}  // namespace kvtier::disk

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif  // __x86_64__
