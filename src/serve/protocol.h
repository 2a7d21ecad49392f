// The `kvtier serve` wire protocol (doc/protocol.md): length-prefixed binary frames over a Unix
// stream socket, little-endian, versioned by the hello exchange. Block bytes never cross it:
// they live in the shared arena, named by offsets.
//
// Frame: a 16-byte header {u32 magic, u32 payload_bytes, u16 type, u16 flags, u32 request_id}
// then the payload. A reply has type | kReplyBit, the request's id, and a payload that opens
// with {u8 status code, str message}.
//
// Thread-safety: Writer and Reader are values used by one thread. DecodeHeader and the
// Decode* functions are pure and never read past their input (a libFuzzer target checks them).
#ifndef KVTIER_SRC_SERVE_PROTOCOL_H_
#define KVTIER_SRC_SERVE_PROTOCOL_H_

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/block_key.h"
#include "kvtier/client.h"
#include "kvtier/kv_cache.h"
#include "kvtier/layout.h"
#include "kvtier/status.h"

namespace kvtier::serve {

// 2: lookup and load replies carry each block's checksum (the client verifies what it reads);
//    reserve carries the storing request's session id.
// 3: declined (the engine's planner recomputed hit blocks rather than load them).
// 5: hello's layout carries its groups (grouped layouts: hybrid, sliding-window, MLA).
inline constexpr uint32_t kProtocolVersion = 6;
inline constexpr uint32_t kMagic = 0x5354564b;  // "KVTS"
inline constexpr size_t kHeaderBytes = 16;
inline constexpr uint32_t kMaxPayload = 32u << 20;
inline constexpr uint32_t kMaxHelloPayload = 64u << 10;  // any frame before hello
inline constexpr uint16_t kReplyBit = 0x8000;
inline constexpr uint16_t kFlagNoReply = 1;  // one-way request (release, session events)
inline constexpr uint64_t kNoOffset = UINT64_MAX;

enum class MsgType : uint16_t {
  kHello = 1,
  kLookup = 2,
  kLoad = 3,     // stage a lease's blocks into the arena, return their offsets
  kRelease = 4,  // one-way: end a lease
  kReserve = 5,
  kCommit = 6,
  kSession = 7,  // one-way
  kStats = 8,
  kPing = 9,  // empty request, empty reply: the round-trip floor
  kFlush = 10,
  kDropTenant = 11,
  kPrefetch = 12,  // a lookup payload: stage the hit prefix into the arena, no lease
  kBadBlock = 13,  // one-way {u64 lease, u32 block}: that block failed its checksum at load
  kDeclined = 14,  // one-way {u32 n, n x u32}: hit blocks per tier the engine recomputed
};
std::string_view MsgTypeName(uint16_t type);

struct FrameHeader {
  uint32_t payload_bytes = 0;
  uint16_t type = 0;
  uint16_t flags = 0;
  uint32_t request_id = 0;
};
void EncodeHeader(const FrameHeader& h, std::byte out[kHeaderBytes]);
// InvalidArgument naming what is wrong (bad magic, payload too large).
Status DecodeHeader(std::span<const std::byte> in, FrameHeader* h);

class Writer {
 public:
  void U8(uint8_t v) { Raw(&v, 1); }
  void U16(uint16_t v) { Raw(&v, 2); }
  void U32(uint32_t v) { Raw(&v, 4); }
  void U64(uint64_t v) { Raw(&v, 8); }
  void Str(std::string_view s) {
    U32(static_cast<uint32_t>(s.size()));
    Raw(s.data(), s.size());
  }
  void Key(const BlockKey& k) {
    U64(k.hi);
    U64(k.lo);
  }
  void Raw(const void* p, size_t n) {
    const size_t at = buf_.size();
    buf_.resize(at + n);
    if (n) std::memcpy(buf_.data() + at, p, n);
  }
  void StatusField(const Status& s) {
    U8(static_cast<uint8_t>(s.code()));
    Str(s.message());
  }
  // Starts a frame: reserves its header, filled by Finish.
  void Begin(uint16_t type, uint16_t flags, uint32_t request_id);
  // Fills the header's length; returns the frame.
  std::span<const std::byte> Finish();
  std::vector<std::byte>& buffer() { return buf_; }

 private:
  std::vector<std::byte> buf_;
  FrameHeader h_;
};

// Bounds-checked reads; after the first short read every read fails and ok() is false.
class Reader {
 public:
  explicit Reader(std::span<const std::byte> in) : in_(in) {}
  bool U8(uint8_t* v) { return Raw(v, 1); }
  bool U16(uint16_t* v) { return Raw(v, 2); }
  bool U32(uint32_t* v) { return Raw(v, 4); }
  bool U64(uint64_t* v) { return Raw(v, 8); }
  bool Str(std::string* s, size_t max = 4096);
  bool Key(BlockKey* k) { return U64(&k->hi) && U64(&k->lo); }
  bool Raw(void* p, size_t n) {
    if (!ok_ || in_.size() - at_ < n) return ok_ = false;
    if (n) std::memcpy(p, in_.data() + at_, n);
    at_ += n;
    return true;
  }
  // A count of items of `item_bytes` each that must fit in what is left.
  bool Count(uint32_t* n, size_t item_bytes);
  bool StatusField(Status* s);
  bool ok() const { return ok_; }
  size_t left() const { return in_.size() - at_; }
  // OK when everything was read; else InvalidArgument naming `what`.
  Status Done(std::string_view what) const;

 private:
  std::span<const std::byte> in_;
  size_t at_ = 0;
  bool ok_ = true;
};

// --- Message bodies (payloads) ---

struct Hello {
  uint32_t version = kProtocolVersion;
  KvLayout layout;
  std::string model_id, model_revision, tenant, lora_id, token;
};
struct HelloReply {
  uint32_t version = kProtocolVersion;
  uint64_t arena_bytes = 0;
  uint64_t block_bytes = 0;
  uint32_t lease_ms = 0;
  BlockKey root;  // the connection's namespace root (client-side key chains start here)
  std::string tenant;
  bool events = false;  // the daemon publishes KV events: reserves may carry engine hashes
  // Offsets of free slots this connection's tenant is handed next (serve.warm_ahead): the
  // client faults their pages in ahead of its stores. Also in reserve replies.
  std::vector<uint64_t> warm;
};

struct Scope {  // a request's namespace; empty = the connection's
  std::string tenant, lora_id;
};

struct LookupReq {
  Scope scope;
  uint64_t session_id = 0;
  bool tokens = false;  // token ids (hashed by the daemon) or a key chain
  std::vector<TokenId> token_ids;
  std::vector<BlockKey> keys;
};
struct LookupReply {
  uint64_t lease_id = 0;  // 0 = nothing pinned
  uint32_t total_blocks = 0;
  std::vector<int8_t> source;       // per hit block
  std::vector<uint64_t> offsets;    // per hit block; kNoOffset = not staged in the arena yet
  std::vector<uint64_t> checksums;  // per hit block: XXH3-64 recorded at commit (0: none)
};

struct LoadReq {
  uint64_t lease_id = 0;
  uint32_t blocks = 0;
};
struct LoadReply {
  std::vector<uint64_t> offsets;    // per block; kNoOffset = could not be staged (recompute)
  std::vector<uint64_t> checksums;  // per block, as in LookupReply
};

struct ReserveReq {
  Scope scope;
  uint64_t session_id = 0;  // the storing request's session (0: none), for the policy
  uint32_t first_block = 0;
  std::vector<BlockKey> keys;
  std::vector<EngineBlockHashes> engine;  // none, or keys[i]'s engine hashes (events)
};
enum class SlotState : uint8_t { kReserved = 0, kPresent = 1, kNoRoom = 2 };
struct ReserveReply {
  uint64_t reservation_id = 0;  // 0 = nothing reserved
  std::vector<uint8_t> state;   // SlotState per key
  std::vector<uint64_t> offsets;
  std::vector<uint64_t> warm;  // as HelloReply::warm
};

struct CommitReq {
  uint64_t reservation_id = 0;
  std::vector<uint8_t> written;     // per reserved block, in reservation order
  std::vector<uint64_t> checksums;  // XXH3-64 of each written block
};
struct CommitReply {
  uint32_t stored = 0, present = 0, failed = 0;
  Status first_error;
};

struct SessionReq {
  uint64_t session_id = 0;
  uint8_t event = 0;
};

struct DropTenantReply {
  uint64_t dropped = 0;  // blocks dropped from at least one tier
  uint64_t pinned = 0;   // blocks kept in a memory tier because a lease pins them
};

void EncodeHello(const Hello& m, Writer* w);
Status DecodeHello(std::span<const std::byte> in, Hello* m);
void EncodeHelloReply(const HelloReply& m, Writer* w);
Status DecodeHelloReply(Reader* r, HelloReply* m);
void EncodeLookup(const LookupReq& m, Writer* w);
// EncodeLookup of a key chain (lookup and prefetch), without copying the chain into a LookupReq.
void EncodeKeyLookup(std::string_view tenant, std::string_view lora_id, uint64_t session_id,
                     std::span<const BlockKey> keys, Writer* w);
Status DecodeLookup(std::span<const std::byte> in, LookupReq* m);
void EncodeLookupReply(const LookupReply& m, Writer* w);
// The same reply from its parts (source.size() >= offsets.size(); the first offsets.size()
// sources are sent), without building a LookupReply.
void EncodeLookupReply(uint64_t lease_id, uint32_t total_blocks, std::span<const int8_t> source,
                       std::span<const uint64_t> offsets, std::span<const uint64_t> checksums,
                       Writer* w);
Status DecodeLookupReply(Reader* r, LookupReply* m);
void EncodeLoad(const LoadReq& m, Writer* w);
Status DecodeLoad(std::span<const std::byte> in, LoadReq* m);
void EncodeLoadReply(const LoadReply& m, Writer* w);
Status DecodeLoadReply(Reader* r, LoadReply* m);
// ReserveReq::engine: a count, then per block its hashes, parent, tokens and LoRA name. Decode
// bounds each hash (64 bytes) and name (256) and fails on a short payload.
void EncodeEngineHashes(std::span<const EngineBlockHashes> v, Writer* w);
bool DecodeEngineHashes(Reader* r, std::vector<EngineBlockHashes>* v);
// m's fields with engine in place of m.engine (a client encodes its caller's hashes uncopied).
void EncodeReserve(const ReserveReq& m, std::span<const EngineBlockHashes> engine, Writer* w);
inline void EncodeReserve(const ReserveReq& m, Writer* w) { EncodeReserve(m, m.engine, w); }
Status DecodeReserve(std::span<const std::byte> in, ReserveReq* m);
void EncodeReserveReply(const ReserveReply& m, Writer* w);
Status DecodeReserveReply(Reader* r, ReserveReply* m);
void EncodeCommit(const CommitReq& m, Writer* w);
Status DecodeCommit(std::span<const std::byte> in, CommitReq* m);
void EncodeCommitReply(const CommitReply& m, Writer* w);
Status DecodeCommitReply(Reader* r, CommitReply* m);
void EncodeSession(const SessionReq& m, Writer* w);
Status DecodeSession(std::span<const std::byte> in, SessionReq* m);
void EncodeStatsReply(const CacheStats& s, const ServeCounters& c, Writer* w);
Status DecodeStatsReply(Reader* r, CacheStats* s, ServeCounters* c);
void EncodeDropTenant(std::string_view tenant, Writer* w);
Status DecodeDropTenant(std::span<const std::byte> in, std::string* tenant);
void EncodeDropTenantReply(const DropTenantReply& m, Writer* w);
Status DecodeDropTenantReply(Reader* r, DropTenantReply* m);
Status DecodeU64(std::span<const std::byte> in, uint64_t* v, std::string_view what);

// Decodes any request payload of `type` (what the daemon does first); for the fuzz target.
Status DecodeBadBlock(std::span<const std::byte> in, uint64_t* lease, uint32_t* block);
void EncodeDeclined(std::span<const uint32_t> blocks_by_tier, Writer* w);
// At most 64 entries (more is InvalidArgument).
Status DecodeDeclined(std::span<const std::byte> in, std::vector<uint32_t>* blocks_by_tier);
Status DecodeRequest(uint16_t type, std::span<const std::byte> payload);

}  // namespace kvtier::serve

#endif  // KVTIER_SRC_SERVE_PROTOCOL_H_
