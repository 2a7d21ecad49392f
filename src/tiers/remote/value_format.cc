#include "tiers/remote/value_format.h"

#include <cstring>

namespace kvtier::remote {
namespace {

void Put16(std::byte* p, uint16_t v) {
  for (int i = 0; i < 2; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
void Put32(std::byte* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
void Put64(std::byte* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
uint64_t Get(const std::byte* p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= uint64_t{std::to_integer<uint8_t>(p[i])} << (8 * i);
  return v;
}

}  // namespace

ValueHeaderBytes EncodeValueHeader(const ValueHeader& header) {
  ValueHeaderBytes out{};
  std::byte* p = out.data();
  Put32(p + 0, kValueMagic);
  Put16(p + 4, kValueVersion);
  Put16(p + 6, static_cast<uint16_t>(kValueHeaderBytes));
  Put64(p + 8, header.key.hi);
  Put64(p + 16, header.key.lo);
  Put64(p + 24, header.layout_fingerprint);
  Put64(p + 32, header.payload_bytes);
  Put64(p + 40, 0);  // reserved
  return out;
}

ValueTrailerBytes EncodeValueTrailer(uint64_t payload_checksum) {
  ValueTrailerBytes out{};
  Put64(out.data(), payload_checksum);
  return out;
}

Result<ValueHeader> DecodeValueHeader(std::span<const std::byte> bytes) {
  if (bytes.size() < kValueHeaderBytes) {
    return Status::Corruption("remote value: " + std::to_string(bytes.size()) +
                              " bytes, shorter than its 48-byte header");
  }
  const std::byte* p = bytes.data();
  if (Get(p, 4) != kValueMagic) return Status::Corruption("remote value: bad magic");
  if (Get(p + 4, 2) != kValueVersion) {
    return Status::Corruption("remote value: unknown version " + std::to_string(Get(p + 4, 2)));
  }
  if (Get(p + 6, 2) != kValueHeaderBytes) {
    return Status::Corruption("remote value: header size " + std::to_string(Get(p + 6, 2)) +
                              ", expected 48");
  }
  ValueHeader h;
  h.key.hi = Get(p + 8, 8);
  h.key.lo = Get(p + 16, 8);
  h.layout_fingerprint = Get(p + 24, 8);
  h.payload_bytes = Get(p + 32, 8);
  if (Get(p + 40, 8) != 0) return Status::Corruption("remote value: reserved header bytes set");
  return h;
}

Status VerifyValue(std::span<const std::byte> header_bytes, std::span<const std::byte> payload,
                   std::span<const std::byte> trailer_bytes, const BlockKey& key,
                   uint64_t layout_fingerprint) {
  return VerifyValueDigest(header_bytes, payload.size(), trailer_bytes, Checksum64(payload), key,
                           layout_fingerprint);
}

Status VerifyValueDigest(std::span<const std::byte> header_bytes, uint64_t payload_bytes,
                         std::span<const std::byte> trailer_bytes, uint64_t payload_checksum,
                         const BlockKey& key, uint64_t layout_fingerprint) {
  Result<ValueHeader> h = DecodeValueHeader(header_bytes);
  if (!h.ok()) return h.status();
  if (h->key != key) {
    return Status::Corruption("remote value: header names key " + h->key.ToHex() + ", not " +
                              key.ToHex());
  }
  if (h->layout_fingerprint != layout_fingerprint) {
    return Status::Corruption("remote value of " + key.ToHex() + ": layout fingerprint differs");
  }
  if (h->payload_bytes != payload_bytes) {
    return Status::Corruption("remote value of " + key.ToHex() + ": header says " +
                              std::to_string(h->payload_bytes) + " payload bytes, block is " +
                              std::to_string(payload_bytes));
  }
  if (trailer_bytes.size() != kValueTrailerBytes ||
      payload_checksum != Get(trailer_bytes.data(), 8)) {
    return Status::Corruption("remote value of " + key.ToHex() + ": checksum mismatch");
  }
  return Status::Ok();
}

std::string RedisKeyOf(std::string_view prefix, const BlockKey& key) {
  std::string out(prefix);
  out += key.ToHex();
  return out;
}

}  // namespace kvtier::remote
