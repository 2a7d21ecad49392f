// XXH3 compiled inline into this library: ~4x faster than calling Debian's libxxhash
// (ANCHORS.md), and the call sites are hot (hashing, checksums).
#ifndef KVTIER_SRC_HASH_XXH_H_
#define KVTIER_SRC_HASH_XXH_H_

// GCC 12 misreads XXH3's overlapping reads of short inputs as out of bounds once inlined.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Warray-bounds"
#pragma GCC diagnostic ignored "-Wstringop-overread"
#endif
#ifndef XXH_INLINE_ALL
#define XXH_INLINE_ALL
#endif
#include <xxhash.h>

#endif  // KVTIER_SRC_HASH_XXH_H_
