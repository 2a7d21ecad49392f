// The value format of a block stored in Redis: a fixed 48-byte header, the block bytes, and an
// 8-byte trailer holding the block's checksum (last, so a writer can checksum each run of bytes
// just before it sends it, with no pass of its own over the block).
// Every read verifies the header against the key asked for, the tier's layout and the block's
// checksum, so a value that another process or a bug corrupted, truncated or wrote under the
// wrong key is never served. See doc/remote.md for the byte layout.
//
// Thread-safety: pure functions over caller-owned bytes.
#ifndef KVTIER_TIERS_REMOTE_VALUE_FORMAT_H_
#define KVTIER_TIERS_REMOTE_VALUE_FORMAT_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "kvtier/block_key.h"
#include "kvtier/status.h"

namespace kvtier::remote {

inline constexpr uint32_t kValueMagic = 0x5254564B;  // "KVTR" in little-endian byte order
inline constexpr uint16_t kValueVersion = 1;
inline constexpr size_t kValueHeaderBytes = 48;
inline constexpr size_t kValueTrailerBytes = 8;

using ValueHeaderBytes = std::array<std::byte, kValueHeaderBytes>;
using ValueTrailerBytes = std::array<std::byte, kValueTrailerBytes>;

struct ValueHeader {
  BlockKey key;
  uint64_t layout_fingerprint = 0;
  uint64_t payload_bytes = 0;
};

// Serialises `header` (little-endian, magic and version first; bytes 40..47 reserved, zero).
ValueHeaderBytes EncodeValueHeader(const ValueHeader& header);
// The trailer: Checksum64 of the payload, little-endian.
ValueTrailerBytes EncodeValueTrailer(uint64_t payload_checksum);

// Parses a header. Corruption (naming what is wrong) for bad magic, version, header size or
// non-zero reserved bytes.
Result<ValueHeader> DecodeValueHeader(std::span<const std::byte> bytes);

// Checks a value read back for `key`: its header must name `key`, `layout_fingerprint` and
// payload.size() bytes, and the trailer must hold the payload's checksum. OK or Corruption.
Status VerifyValue(std::span<const std::byte> header_bytes, std::span<const std::byte> payload,
                   std::span<const std::byte> trailer_bytes, const BlockKey& key,
                   uint64_t layout_fingerprint);

// As VerifyValue, for a payload of payload_bytes whose Checksum64 the caller already computed
// (while the bytes arrived).
Status VerifyValueDigest(std::span<const std::byte> header_bytes, uint64_t payload_bytes,
                         std::span<const std::byte> trailer_bytes, uint64_t payload_checksum,
                         const BlockKey& key, uint64_t layout_fingerprint);

// The Redis key of a block: prefix + 32 lower-case hex digits.
std::string RedisKeyOf(std::string_view prefix, const BlockKey& key);

}  // namespace kvtier::remote

#endif  // KVTIER_TIERS_REMOTE_VALUE_FORMAT_H_
