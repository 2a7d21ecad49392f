// Fuzzes the remote tier's parsers of bytes from outside the process: the streaming RESP
// reader (with sinks, fed in arbitrary chunks), CLUSTER SLOTS replies (built by hiredis's own
// reader), MOVED/ASK redirects, redis:// URLs and the stored value header.
#include <hiredis/hiredis.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <vector>

#include "tiers/remote/cluster_slots.h"
#include "tiers/remote/redis_url.h"
#include "tiers/remote/resp_reader.h"
#include "tiers/remote/value_format.h"

using namespace kvtier::remote;

namespace {

void FuzzResp(const uint8_t* data, size_t size) {
  if (size < 2) return;
  const size_t chunk = 1 + data[0] % 64;
  const size_t sink_body = data[1] * 8;
  data += 2;
  size -= 2;
  RespReader reader(256, 128);
  std::array<std::byte, kValueHeaderBytes> head{};
  std::vector<std::byte> body(sink_body);
  for (int i = 0; i < 8; ++i) {
    if (i % 2 == 0) {
      reader.Expect(BulkSink{head, body});
    } else {
      reader.Expect();
    }
  }
  std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  while (!bytes.empty()) {
    size_t n = std::min(chunk, bytes.size());
    if (!reader.Feed(bytes.first(n)).ok()) break;
    bytes = bytes.subspan(n);
    RespReply reply;
    while (reader.Next(&reply)) {
      if (reply.in_sink && reply.bulk_bytes != head.size() + body.size()) std::abort();
      if (!reply.in_sink && !reply.dropped && reply.type == RespReply::Type::kBulk &&
          reply.text.size() != reply.bulk_bytes) {
        std::abort();
      }
    }
  }
}

// hiredis 0.14 allocates an array reply's declared element count before reading any element
// (hiredis 1.0 bounds it with maxelements), so "*300000000" alone asks for gigabytes. That is
// the library's limit, documented in doc/remote.md; the harness keeps to replies it can hold.
bool DeclaresHugeAggregate(const uint8_t* data, size_t size) {
  for (size_t i = 0; i < size; ++i) {
    if (data[i] != '*') continue;
    uint64_t n = 0;
    for (size_t j = i + 1; j < size && data[j] >= '0' && data[j] <= '9' && n < (1u << 20); ++j)
      n = n * 10 + (data[j] - '0');
    if (n >= 100000) return true;
  }
  return false;
}

void FuzzClusterSlots(const uint8_t* data, size_t size) {
  if (DeclaresHugeAggregate(data, size)) return;
  redisReader* r = redisReaderCreate();
  redisReaderFeed(r, reinterpret_cast<const char*>(data), size);
  void* out = nullptr;
  if (redisReaderGetReply(r, &out) == REDIS_OK && out != nullptr) {
    auto ranges = ParseClusterSlots(static_cast<redisReply*>(out), "127.0.0.1");
    if (ranges.ok()) {
      for (const SlotRange& s : *ranges) {
        if (s.first < 0 || s.last >= kClusterSlots || s.first > s.last) std::abort();
        if (s.master.port < 1 || s.master.port > 65535) std::abort();
      }
    }
    freeReplyObject(out);
  }
  redisReaderFree(r);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t mode = data[0] % 5;
  ++data;
  --size;
  std::string_view text(reinterpret_cast<const char*>(data), size);
  switch (mode) {
    case 0:
      FuzzResp(data, size);
      break;
    case 1:
      FuzzClusterSlots(data, size);
      break;
    case 2:
      if (auto r = ParseRedirect(text, "h"); r && (r->slot < 0 || r->slot >= kClusterSlots)) {
        std::abort();
      }
      (void)KeyHashSlot(text);
      break;
    case 3:
      if (auto u = ParseRedisUrl(text); u.ok() && u->seeds.empty()) std::abort();
      break;
    case 4: {
      std::span<const std::byte> b(reinterpret_cast<const std::byte*>(data), size);
      auto h = DecodeValueHeader(b);
      if (size >= kValueHeaderBytes + kValueTrailerBytes) {
        const size_t payload = size - kValueHeaderBytes - kValueTrailerBytes;
        (void)VerifyValue(b.first(kValueHeaderBytes), b.subspan(kValueHeaderBytes, payload),
                          b.last(kValueTrailerBytes), kvtier::BlockKey{1, 2}, 3);
      }
      if (h.ok()) {
        // What decodes re-encodes to the same bytes.
        ValueHeaderBytes again = EncodeValueHeader(*h);
        if (std::memcmp(again.data(), data, kValueHeaderBytes) != 0) std::abort();
      }
      break;
    }
  }
  return 0;
}
