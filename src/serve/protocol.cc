#include "serve/protocol.h"

#include <bit>
#include <cstddef>
#include <iterator>

#include "obs/stats_schema.h"

namespace kvtier::serve {

std::string_view MsgTypeName(uint16_t type) {
  // By MsgType's value, from 1.
  static constexpr std::string_view kNames[] = {
      "hello", "lookup", "load",  "release",     "reserve",  "commit",    "session",
      "stats", "ping",   "flush", "drop-tenant", "prefetch", "bad-block", "declined"};
  static_assert(std::size(kNames) == static_cast<size_t>(MsgType::kDeclined), "a name per type");
  const unsigned t = type & ~kReplyBit;
  return t >= 1 && t <= std::size(kNames) ? kNames[t - 1] : "unknown";
}

void EncodeHeader(const FrameHeader& h, std::byte out[kHeaderBytes]) {
  Writer w;
  w.U32(kMagic);
  w.U32(h.payload_bytes);
  w.U16(h.type);
  w.U16(h.flags);
  w.U32(h.request_id);
  std::memcpy(out, w.buffer().data(), kHeaderBytes);
}

Status DecodeHeader(std::span<const std::byte> in, FrameHeader* h) {
  Reader r(in);
  uint32_t magic = 0;
  if (!r.U32(&magic) || !r.U32(&h->payload_bytes) || !r.U16(&h->type) || !r.U16(&h->flags) ||
      !r.U32(&h->request_id))
    return Status::InvalidArgument("truncated frame header");
  if (magic != kMagic)
    return Status::InvalidArgument("bad frame magic " + std::to_string(magic) + " (want " +
                                   std::to_string(kMagic) + ", \"KVTS\")");
  if (h->payload_bytes > kMaxPayload)
    return Status::InvalidArgument("frame payload of " + std::to_string(h->payload_bytes) +
                                   " bytes exceeds the limit of " + std::to_string(kMaxPayload));
  return Status::Ok();
}

void Writer::Begin(uint16_t type, uint16_t flags, uint32_t request_id) {
  buf_.clear();
  buf_.resize(kHeaderBytes);
  h_ = FrameHeader{0, type, flags, request_id};
}

std::span<const std::byte> Writer::Finish() {
  h_.payload_bytes = static_cast<uint32_t>(buf_.size() - kHeaderBytes);
  EncodeHeader(h_, buf_.data());
  return buf_;
}

bool Reader::Str(std::string* s, size_t max) {
  uint32_t n = 0;
  if (!U32(&n)) return false;
  if (n > max || n > left()) return ok_ = false;
  s->assign(reinterpret_cast<const char*>(in_.data() + at_), n);
  at_ += n;
  return true;
}

bool Reader::Count(uint32_t* n, size_t item_bytes) {
  if (!U32(n)) return false;
  if (uint64_t{*n} * item_bytes > left()) return ok_ = false;
  return true;
}

bool Reader::StatusField(Status* s) {
  uint8_t code = 0;
  std::string msg;
  if (!U8(&code) || !Str(&msg, 1 << 16)) return false;
  if (code > static_cast<uint8_t>(StatusCode::kInternal)) return ok_ = false;
  *s = code == 0 ? Status::Ok() : Status(static_cast<StatusCode>(code), std::move(msg));
  return true;
}

Status Reader::Done(std::string_view what) const {
  if (!ok_) return Status::InvalidArgument(std::string(what) + ": truncated or malformed payload");
  if (left() != 0)
    return Status::InvalidArgument(std::string(what) + ": " + std::to_string(left()) +
                                   " trailing bytes");
  return Status::Ok();
}

namespace {

void EncodeLayout(const KvLayout& l, Writer* w) {
  w->U32(l.num_layers);
  w->U32(l.num_kv_heads);
  w->U32(l.head_dim);
  w->U8(static_cast<uint8_t>(l.dtype));
  w->U32(l.block_tokens);
  w->U8(static_cast<uint8_t>(l.attention));
  w->U32(static_cast<uint32_t>(l.groups.size()));
  for (const KvLayoutGroup& g : l.groups) {
    w->U8(static_cast<uint8_t>(g.kind));
    w->U32(g.num_layers);
    w->U32(g.num_kv_heads);
    w->U32(g.head_dim);
    w->U8(static_cast<uint8_t>(g.dtype));
    w->U32(g.window);
    w->U32(g.page_tokens);
    w->U64(g.state_bytes);
  }
}

// False on a short payload, an unknown enum value or more than 64 groups (Validate's bound).
bool DecodeLayout(Reader* r, KvLayout* l) {
  uint8_t dtype = 0, att = 0;
  uint32_t groups = 0;
  if (!r->U32(&l->num_layers) || !r->U32(&l->num_kv_heads) || !r->U32(&l->head_dim) ||
      !r->U8(&dtype) || !r->U32(&l->block_tokens) || !r->U8(&att) || !r->U32(&groups) ||
      dtype > static_cast<uint8_t>(DType::kFp32) ||
      att > static_cast<uint8_t>(AttentionKind::kMla) || groups > 64)
    return false;
  l->dtype = static_cast<DType>(dtype);
  l->attention = static_cast<AttentionKind>(att);
  l->groups.assign(groups, KvLayoutGroup{});
  for (KvLayoutGroup& g : l->groups) {
    uint8_t kind = 0, gdtype = 0;
    if (!r->U8(&kind) || !r->U32(&g.num_layers) || !r->U32(&g.num_kv_heads) ||
        !r->U32(&g.head_dim) || !r->U8(&gdtype) || !r->U32(&g.window) || !r->U32(&g.page_tokens) ||
        !r->U64(&g.state_bytes) || kind > static_cast<uint8_t>(KvGroupKind::kState) ||
        gdtype > static_cast<uint8_t>(DType::kFp32))
      return false;
    g.kind = static_cast<KvGroupKind>(kind);
    g.dtype = static_cast<DType>(gdtype);
  }
  return true;
}

void EncodeScope(const Scope& s, Writer* w) {
  w->Str(s.tenant);
  w->Str(s.lora_id);
}
bool DecodeScope(Reader* r, Scope* s) { return r->Str(&s->tenant) && r->Str(&s->lora_id); }

// A key travels as u64 hi, u64 lo, little-endian: BlockKey's own layout on this (little-endian)
// target, so a chain is one copy.
static_assert(sizeof(BlockKey) == 16 && offsetof(BlockKey, hi) == 0 && offsetof(BlockKey, lo) == 8);
static_assert(std::endian::native == std::endian::little);

bool DecodeKeys(Reader* r, std::vector<BlockKey>* keys) {
  uint32_t n = 0;
  if (!r->Count(&n, 16)) return false;
  keys->resize(n);
  return r->Raw(keys->data(), uint64_t{n} * 16);
}

void EncodeKeys(std::span<const BlockKey> keys, Writer* w) {
  w->U32(static_cast<uint32_t>(keys.size()));
  w->Raw(keys.data(), keys.size() * sizeof(BlockKey));
}

bool DecodeU64s(Reader* r, std::vector<uint64_t>* v) {
  uint32_t n = 0;
  if (!r->Count(&n, 8)) return false;
  v->resize(n);
  return r->Raw(v->data(), n * 8ull);
}

void EncodeU64s(std::span<const uint64_t> v, Writer* w) {
  w->U32(static_cast<uint32_t>(v.size()));
  w->Raw(v.data(), v.size() * 8);
}

bool DecodeBytes(Reader* r, std::vector<uint8_t>* v) {
  uint32_t n = 0;
  if (!r->Count(&n, 1)) return false;
  v->resize(n);
  return r->Raw(v->data(), n);
}

void EncodeBytes(std::span<const uint8_t> v, Writer* w) {
  w->U32(static_cast<uint32_t>(v.size()));
  w->Raw(v.data(), v.size());
}

}  // namespace

void EncodeHello(const Hello& m, Writer* w) {
  w->U32(m.version);
  EncodeLayout(m.layout, w);
  w->Str(m.model_id);
  w->Str(m.model_revision);
  w->Str(m.tenant);
  w->Str(m.lora_id);
  w->Str(m.token);
}

Status DecodeHello(std::span<const std::byte> in, Hello* m) {
  Reader r(in);
  // The version first and alone: a peer of another version may lay out the rest differently.
  if (!r.U32(&m->version)) return Status::InvalidArgument("hello: truncated");
  if (m->version != kProtocolVersion) return Status::Ok();
  if (!DecodeLayout(&r, &m->layout))
    return Status::InvalidArgument(
        r.ok() ? "hello: layout: unknown dtype, attention or group kind, or more than 64 groups"
               : "hello: truncated or malformed payload");
  // No shape (no layers, heads, head size or groups): an operator hello, which doc/protocol.md
  // documents as an all-zero layout. It stands for KvLayout{}, whose block_tokens (64) the
  // wire's zeros need not repeat: the daemon compared against KvLayout{} and refused them.
  const KvLayout& l = m->layout;
  if (l.num_layers == 0 && l.num_kv_heads == 0 && l.head_dim == 0 && l.groups.empty())
    m->layout = KvLayout{};
  r.Str(&m->model_id);
  r.Str(&m->model_revision);
  r.Str(&m->tenant);
  r.Str(&m->lora_id);
  r.Str(&m->token);
  return r.Done("hello");
}

void EncodeHelloReply(const HelloReply& m, Writer* w) {
  w->U32(m.version);
  w->U64(m.arena_bytes);
  w->U64(m.block_bytes);
  w->U32(m.lease_ms);
  w->Key(m.root);
  w->Str(m.tenant);
  w->U8(m.events ? 1 : 0);
  EncodeU64s(m.warm, w);
}

Status DecodeHelloReply(Reader* r, HelloReply* m) {
  r->U32(&m->version);
  r->U64(&m->arena_bytes);
  r->U64(&m->block_bytes);
  r->U32(&m->lease_ms);
  r->Key(&m->root);
  r->Str(&m->tenant);
  uint8_t events = 0;
  r->U8(&events);
  m->events = events != 0;
  DecodeU64s(r, &m->warm);
  return r->Done("hello reply");
}

void EncodeKeyLookup(std::string_view tenant, std::string_view lora_id, uint64_t session_id,
                     std::span<const BlockKey> keys, Writer* w) {
  w->Str(tenant);
  w->Str(lora_id);
  w->U64(session_id);
  w->U8(0);
  EncodeKeys(keys, w);
}

void EncodeLookup(const LookupReq& m, Writer* w) {
  if (!m.tokens) return EncodeKeyLookup(m.scope.tenant, m.scope.lora_id, m.session_id, m.keys, w);
  EncodeScope(m.scope, w);
  w->U64(m.session_id);
  w->U8(1);
  w->U32(static_cast<uint32_t>(m.token_ids.size()));
  w->Raw(m.token_ids.data(), m.token_ids.size() * 4);
}

Status DecodeLookup(std::span<const std::byte> in, LookupReq* m) {
  Reader r(in);
  uint8_t tokens = 0;
  DecodeScope(&r, &m->scope);
  r.U64(&m->session_id);
  r.U8(&tokens);
  if (tokens > 1)
    return Status::InvalidArgument("lookup: bad chain kind " + std::to_string(tokens));
  m->tokens = tokens == 1;
  if (m->tokens) {
    uint32_t n = 0;
    if (r.Count(&n, 4)) {
      m->token_ids.resize(n);
      r.Raw(m->token_ids.data(), n * 4ull);
    }
  } else {
    DecodeKeys(&r, &m->keys);
  }
  return r.Done("lookup");
}

void EncodeLookupReply(const LookupReply& m, Writer* w) {
  EncodeLookupReply(m.lease_id, m.total_blocks, m.source, m.offsets, m.checksums, w);
}

void EncodeLookupReply(uint64_t lease_id, uint32_t total_blocks, std::span<const int8_t> source,
                       std::span<const uint64_t> offsets, std::span<const uint64_t> checksums,
                       Writer* w) {
  w->U64(lease_id);
  w->U32(total_blocks);
  w->U32(static_cast<uint32_t>(offsets.size()));
  w->Raw(source.data(), offsets.size());
  w->Raw(offsets.data(), offsets.size() * 8);
  w->Raw(checksums.data(), offsets.size() * 8);
}

Status DecodeLookupReply(Reader* r, LookupReply* m) {
  uint32_t n = 0;
  r->U64(&m->lease_id);
  r->U32(&m->total_blocks);
  if (r->Count(&n, 17)) {
    m->source.resize(n);
    m->offsets.resize(n);
    m->checksums.resize(n);
    r->Raw(m->source.data(), n);
    r->Raw(m->offsets.data(), n * 8ull);
    r->Raw(m->checksums.data(), n * 8ull);
  }
  if (r->ok() && n > m->total_blocks)
    return Status::InvalidArgument("lookup reply: more hits than blocks");
  return r->Done("lookup reply");
}

void EncodeLoad(const LoadReq& m, Writer* w) {
  w->U64(m.lease_id);
  w->U32(m.blocks);
}

Status DecodeLoad(std::span<const std::byte> in, LoadReq* m) {
  Reader r(in);
  r.U64(&m->lease_id);
  r.U32(&m->blocks);
  return r.Done("load");
}

void EncodeLoadReply(const LoadReply& m, Writer* w) {
  EncodeU64s(m.offsets, w);
  EncodeU64s(m.checksums, w);
}

Status DecodeLoadReply(Reader* r, LoadReply* m) {
  DecodeU64s(r, &m->offsets);
  DecodeU64s(r, &m->checksums);
  if (r->ok() && m->checksums.size() != m->offsets.size())
    return Status::InvalidArgument("load reply: checksums do not match offsets");
  return r->Done("load reply");
}

void EncodeReserve(const ReserveReq& m, std::span<const EngineBlockHashes> engine, Writer* w) {
  EncodeScope(m.scope, w);
  w->U64(m.session_id);
  w->U32(m.first_block);
  EncodeKeys(m.keys, w);
  EncodeEngineHashes(engine, w);
}

Status DecodeReserve(std::span<const std::byte> in, ReserveReq* m) {
  Reader r(in);
  DecodeScope(&r, &m->scope);
  r.U64(&m->session_id);
  r.U32(&m->first_block);
  DecodeKeys(&r, &m->keys);
  DecodeEngineHashes(&r, &m->engine);
  if (r.ok() && !m->engine.empty() && m->engine.size() != m->keys.size())
    return Status::InvalidArgument("reserve: " + std::to_string(m->engine.size()) +
                                   " engine hash entries for " + std::to_string(m->keys.size()) +
                                   " keys");
  return r.Done("reserve");
}

void EncodeReserveReply(const ReserveReply& m, Writer* w) {
  w->U64(m.reservation_id);
  EncodeBytes(m.state, w);
  EncodeU64s(m.offsets, w);
  EncodeU64s(m.warm, w);
}

Status DecodeReserveReply(Reader* r, ReserveReply* m) {
  r->U64(&m->reservation_id);
  DecodeBytes(r, &m->state);
  DecodeU64s(r, &m->offsets);
  DecodeU64s(r, &m->warm);
  if (r->ok() && m->state.size() != m->offsets.size())
    return Status::InvalidArgument("reserve reply: states and offsets differ in count");
  return r->Done("reserve reply");
}

void EncodeCommit(const CommitReq& m, Writer* w) {
  w->U64(m.reservation_id);
  EncodeBytes(m.written, w);
  EncodeU64s(m.checksums, w);
}

Status DecodeCommit(std::span<const std::byte> in, CommitReq* m) {
  Reader r(in);
  r.U64(&m->reservation_id);
  DecodeBytes(&r, &m->written);
  DecodeU64s(&r, &m->checksums);
  if (r.ok() && m->written.size() != m->checksums.size())
    return Status::InvalidArgument("commit: flags and checksums differ in count");
  return r.Done("commit");
}

void EncodeCommitReply(const CommitReply& m, Writer* w) {
  w->U32(m.stored);
  w->U32(m.present);
  w->U32(m.failed);
  w->StatusField(m.first_error);
}

Status DecodeCommitReply(Reader* r, CommitReply* m) {
  r->U32(&m->stored);
  r->U32(&m->present);
  r->U32(&m->failed);
  r->StatusField(&m->first_error);
  return r->Done("commit reply");
}

void EncodeSession(const SessionReq& m, Writer* w) {
  w->U64(m.session_id);
  w->U8(m.event);
}

Status DecodeSession(std::span<const std::byte> in, SessionReq* m) {
  Reader r(in);
  r.U64(&m->session_id);
  r.U8(&m->event);
  return r.Done("session");
}

Status DecodeU64(std::span<const std::byte> in, uint64_t* v, std::string_view what) {
  Reader r(in);
  r.U64(v);
  return r.Done(what);
}

// Every field and histogram travels by name, from the stats schema, so that one added to it is
// on the wire at once and a reader skips the names it does not know (doc/protocol.md).
namespace {

constexpr uint32_t kMaxStatFields = 1024;
constexpr uint32_t kMaxStatTiers = 64;
constexpr size_t kMaxStatName = 64;

void EncodeFields(StatScope scope, const auto& from, Writer* w) {
  uint32_t n = 0;
  for (const StatField& f : StatFields()) n += f.scope == scope;
  w->U32(n);
  for (const StatField& f : StatFields()) {
    if (f.scope != scope) continue;
    w->Str(f.name);
    w->U64(StatValue(f, from));
  }
}

// Reads a {name, value} list into the fields of `scope` through `at`; unknown names are skipped.
template <typename T>
bool DecodeFields(Reader* r, StatScope scope, T* into, uint64_t* (*StatField::*at)(T*)) {
  uint32_t n = 0;
  if (!r->Count(&n, 4 + 8) || n > kMaxStatFields) return false;
  for (uint32_t i = 0; i < n; ++i) {
    std::string name;
    uint64_t v = 0;
    if (!r->Str(&name, kMaxStatName) || !r->U64(&v)) return false;
    if (const StatField* f = FindStatField(scope, name)) *(f->*at)(into) = v;
  }
  return true;
}

// {str name, u64 count, u64 sum, u64 max, u32 n, n x {u16 bucket, u64 count}} per histogram of
// `scope`, only the buckets that counted something.
void EncodeHistograms(StatScope scope, const auto& from, Writer* w) {
  uint32_t n = 0;
  for (const StatHistogram& h : StatHistograms()) n += h.scope == scope;
  w->U32(n);
  for (const StatHistogram& h : StatHistograms()) {
    if (h.scope != scope) continue;
    const Histogram::Snapshot& v = HistogramValue(h, from);
    w->Str(h.name);
    w->U64(v.count);
    w->U64(v.sum);
    w->U64(v.max);
    uint32_t used = 0;
    for (uint64_t c : v.counts) used += c != 0;
    w->U32(used);
    for (int b = 0; b < Histogram::kBuckets; ++b) {
      if (v.counts[b] == 0) continue;
      w->U16(static_cast<uint16_t>(b));
      w->U64(v.counts[b]);
    }
  }
}

template <typename T>
bool DecodeHistograms(Reader* r, StatScope scope, T* into,
                      Histogram::Snapshot* (*StatHistogram::*at)(T*)) {
  uint32_t n = 0;
  if (!r->Count(&n, 4 + 3 * 8 + 4) || n > kMaxStatFields) return false;
  for (uint32_t i = 0; i < n; ++i) {
    std::string name;
    Histogram::Snapshot v;
    uint32_t used = 0;
    if (!r->Str(&name, kMaxStatName) || !r->U64(&v.count) || !r->U64(&v.sum) || !r->U64(&v.max) ||
        !r->Count(&used, 2 + 8))
      return false;
    for (uint32_t j = 0; j < used; ++j) {
      uint16_t b = 0;
      if (!r->U16(&b) || b >= Histogram::kBuckets || !r->U64(&v.counts[b])) return false;
    }
    if (const StatHistogram* h = FindStatHistogram(scope, name)) *(h->*at)(into) = v;
  }
  return true;
}

bool ValidCounterName(std::string_view name) {
  if (name.empty()) return false;
  for (char c : name)
    if (!(c == '_' || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'))) return false;
  return true;
}

}  // namespace

void EncodeStatsReply(const CacheStats& s, const ServeCounters& c, Writer* w) {
  EncodeFields(StatScope::kServe, c, w);
  EncodeFields(StatScope::kCache, s, w);
  EncodeHistograms(StatScope::kCache, s, w);
  w->U32(static_cast<uint32_t>(s.tiers.size()));
  for (const auto& t : s.tiers) {
    w->Str(t.name);
    w->U8(static_cast<uint8_t>(t.kind));
    EncodeFields(StatScope::kTier, t, w);
    w->U32(static_cast<uint32_t>(t.tier.counters.size()));
    for (const auto& k : t.tier.counters) {
      w->Str(k.name);
      w->Str(k.help);
      w->U8(k.gauge ? 1 : 0);
      w->U64(k.value);
    }
    EncodeHistograms(StatScope::kTier, t, w);
  }
}

namespace {

// One tier of a stats reply; false when malformed, an error when refused.
Status DecodeStatsTier(Reader* r, CacheStats::PerTier* t, bool* ok) {
  uint8_t kind = 0;
  *ok = r->Str(&t->name) && r->U8(&kind);
  if (!*ok) return Status::Ok();
  // A kind this client does not know (a newer daemon's, or one since removed) is refused rather
  // than shown as another.
  if (kind >= kNumTierKinds)
    return Status::InvalidArgument("stats reply: tier '" + t->name + "' has unknown kind " +
                                   std::to_string(kind) + " (known: 0.." +
                                   std::to_string(kNumTierKinds - 1) + ")");
  t->kind = static_cast<TierKind>(kind);
  uint32_t n = 0;
  *ok = DecodeFields(r, StatScope::kTier, t, &StatField::tier) && r->Count(&n, 4 + 4 + 1 + 8) &&
        n <= kMaxStatFields;
  for (uint32_t i = 0; *ok && i < n; ++i) {
    TierStats::Counter c;
    uint8_t gauge = 0;
    *ok = r->Str(&c.name, kMaxStatName) && r->Str(&c.help) && r->U8(&gauge) && r->U64(&c.value);
    if (*ok && !ValidCounterName(c.name))
      return Status::InvalidArgument("stats reply: tier '" + t->name + "' has a counter named '" +
                                     c.name + "' (want [a-z0-9_]+)");
    c.gauge = gauge != 0;
    t->tier.counters.push_back(std::move(c));
  }
  *ok = *ok && DecodeHistograms(r, StatScope::kTier, t, &StatHistogram::tier);
  return Status::Ok();
}

}  // namespace

Status DecodeStatsReply(Reader* r, CacheStats* s, ServeCounters* c) {
  uint32_t n = 0;
  bool ok = DecodeFields(r, StatScope::kServe, c, &StatField::serve) &&
            DecodeFields(r, StatScope::kCache, s, &StatField::cache) &&
            DecodeHistograms(r, StatScope::kCache, s, &StatHistogram::cache) &&
            r->Count(&n, 4 + 1 + 4 + 4 + 4);
  if (ok && n > kMaxStatTiers)
    return Status::InvalidArgument("stats reply: " + std::to_string(n) + " tiers (at most " +
                                   std::to_string(kMaxStatTiers) + ")");
  if (ok) s->tiers.resize(n);
  for (uint32_t i = 0; ok && i < n; ++i)
    KVTIER_RETURN_IF_ERROR(DecodeStatsTier(r, &s->tiers[i], &ok));
  if (!ok) return Status::InvalidArgument("stats reply: truncated or malformed payload");
  return r->Done("stats reply");
}

Status DecodeBadBlock(std::span<const std::byte> in, uint64_t* lease, uint32_t* block) {
  Reader r(in);
  r.U64(lease);
  r.U32(block);
  return r.Done("bad-block");
}

void EncodeDeclined(std::span<const uint32_t> blocks_by_tier, Writer* w) {
  w->U32(static_cast<uint32_t>(blocks_by_tier.size()));
  for (uint32_t b : blocks_by_tier) w->U32(b);
}

Status DecodeDeclined(std::span<const std::byte> in, std::vector<uint32_t>* blocks_by_tier) {
  Reader r(in);
  uint32_t n = 0;
  r.U32(&n);
  if (n > kMaxStatTiers) {
    return Status::InvalidArgument("declined: " + std::to_string(n) + " tiers (at most " +
                                   std::to_string(kMaxStatTiers) + ")");
  }
  blocks_by_tier->assign(n, 0);
  for (uint32_t i = 0; i < n; ++i) r.U32(&(*blocks_by_tier)[i]);
  return r.Done("declined");
}

void EncodeDropTenant(std::string_view tenant, Writer* w) { w->Str(tenant); }

Status DecodeDropTenant(std::span<const std::byte> in, std::string* tenant) {
  Reader r(in);
  r.Str(tenant);
  return r.Done("drop-tenant");
}

void EncodeDropTenantReply(const DropTenantReply& m, Writer* w) {
  w->U64(m.dropped);
  w->U64(m.pinned);
}

Status DecodeDropTenantReply(Reader* r, DropTenantReply* m) {
  r->U64(&m->dropped);
  r->U64(&m->pinned);
  return r->Done("drop-tenant reply");
}

Status DecodeRequest(uint16_t type, std::span<const std::byte> payload) {
  switch (static_cast<MsgType>(type)) {
    case MsgType::kHello: {
      Hello m;
      return DecodeHello(payload, &m);
    }
    case MsgType::kLookup:
    case MsgType::kPrefetch: {
      LookupReq m;
      return DecodeLookup(payload, &m);
    }
    case MsgType::kLoad: {
      LoadReq m;
      return DecodeLoad(payload, &m);
    }
    case MsgType::kReserve: {
      ReserveReq m;
      return DecodeReserve(payload, &m);
    }
    case MsgType::kCommit: {
      CommitReq m;
      return DecodeCommit(payload, &m);
    }
    case MsgType::kSession: {
      SessionReq m;
      return DecodeSession(payload, &m);
    }
    case MsgType::kRelease: {
      uint64_t v = 0;
      return DecodeU64(payload, &v, "release");
    }
    case MsgType::kBadBlock: {
      uint64_t lease = 0;
      uint32_t block = 0;
      return DecodeBadBlock(payload, &lease, &block);
    }
    case MsgType::kDeclined: {
      std::vector<uint32_t> v;
      return DecodeDeclined(payload, &v);
    }
    case MsgType::kDropTenant: {
      std::string t;
      return DecodeDropTenant(payload, &t);
    }
    case MsgType::kStats:
    case MsgType::kPing:
    case MsgType::kFlush:
      return Reader(payload).Done(MsgTypeName(type));
  }
  return Status::InvalidArgument("unknown message type " + std::to_string(type));
}

}  // namespace kvtier::serve
