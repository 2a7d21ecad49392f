// libFuzzer target for the `kvtier serve` protocol decoder: a byte stream cut into frames the
// way the daemon reads them (header, then that many payload bytes), each payload decoded as its
// type. Nothing may read out of bounds, abort or allocate without bound.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>

#include "serve/protocol.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const std::byte> in(reinterpret_cast<const std::byte*>(data), size);
  while (in.size() >= kvtier::serve::kHeaderBytes) {
    kvtier::serve::FrameHeader h;
    if (!kvtier::serve::DecodeHeader(in.first(kvtier::serve::kHeaderBytes), &h).ok()) {
      // A mutated header still exercises the payload decoders: decode the rest as its type.
      (void)kvtier::serve::DecodeRequest(static_cast<uint16_t>(data[0] % 13),
                                         in.subspan(kvtier::serve::kHeaderBytes));
      return 0;
    }
    in = in.subspan(kvtier::serve::kHeaderBytes);
    const size_t n = std::min<size_t>(h.payload_bytes, in.size());
    (void)kvtier::serve::DecodeRequest(h.type, in.first(n));
    // Replies too (what a client decodes).
    kvtier::serve::Reader r(in.first(n));
    kvtier::serve::LookupReply lr;
    (void)kvtier::serve::DecodeLookupReply(&r, &lr);
    kvtier::serve::Reader r2(in.first(n));
    kvtier::CacheStats cs;
    kvtier::ServeCounters sc;
    (void)kvtier::serve::DecodeStatsReply(&r2, &cs, &sc);
    kvtier::serve::Reader r3(in.first(n));
    kvtier::serve::ReserveReply rr;
    (void)kvtier::serve::DecodeReserveReply(&r3, &rr);
    in = in.subspan(n);
  }
  return 0;
}
