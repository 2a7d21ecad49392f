// The daemon's request handlers: one per request type, each writing its reply body.
#include "serve/server_impl.h"

namespace kvtier::serve {

std::optional<TenantBinding> Server::Impl::Binding(const std::string& tenant) const {
  MutexLock lock(&mu_);
  for (const TenantBinding& b : options_.tenants)
    if (b.name == tenant) return b;
  return std::nullopt;
}

Status Server::Impl::CheckTenant(const Conn& c, const std::string& tenant,
                                 const std::string& token) const {
  const std::optional<TenantBinding> b = Binding(tenant);
  if (!b) return Status::Ok();
  bool ok = !b->token.empty() && token == b->token;
  for (uint32_t u : b->uids) ok |= u == c.peer.uid;
  if (!ok)
    return Status::InvalidArgument(
        "tenant '" + tenant + "' is bound to " +
        (b->uids.empty() ? std::string("a token") : "uids/token in serve.tenants") + "; " +
        c.Name() + " may not declare it");
  return Status::Ok();
}

Result<BlockKey> Server::Impl::RootFor(const Conn& c, const Scope& scope) const {
  if (!c.data_plane) return Status::InvalidArgument("this connection declared no layout");
  // A connection maps one tenant's arena partition: a request may not name another tenant.
  if (!scope.tenant.empty() && scope.tenant != c.hello.tenant)
    return Status::InvalidArgument("this connection serves tenant '" + c.hello.tenant +
                                   "'; a request may not name tenant '" + scope.tenant +
                                   "' (open one client per tenant)");
  Namespace ns{c.hello.model_id, c.hello.model_revision, c.hello.layout.fingerprint(), c.tenant,
               scope.lora_id.empty() ? c.hello.lora_id : scope.lora_id};
  return ns.Root();
}

std::string Server::Impl::EffectiveTenant(const Conn& c, const std::string& declared) const {
  return Binding(declared) ? declared : declared + "@uid" + std::to_string(c.peer.uid);
}

Result<int> Server::Impl::PartitionFor(const Conn& c) {
  const std::optional<TenantBinding> bound = Binding(c.hello.tenant);
  uint32_t per_uid = 0;
  double default_share = 1.0;
  {
    MutexLock lock(&mu_);
    per_uid = options_.max_tenants_per_uid;
    default_share = options_.default_max_share;
  }
  {
    MutexLock lock(&tenants_mu_);
    if (!tenants_seen_.count(c.tenant)) {
      if (!bound) {
        uint32_t mine = 0;
        for (const auto& [name, t] : tenants_seen_) mine += t.uid == c.peer.uid;
        if (mine >= per_uid)
          return Status::ResourceExhausted(
              c.Name() + " opened " + std::to_string(mine) +
              " unlisted tenants already (serve.max_tenants_per_uid); tenant '" + c.hello.tenant +
              "' refused");
      }
      tenants_seen_.emplace(
          c.tenant, TenantSeen{c.hello.tenant, bound ? static_cast<uid_t>(-1) : c.peer.uid, -1});
    }
  }
  KVTIER_ASSIGN_OR_RETURN(int p, host_->AddPartition(c.tenant_tag, c.tenant));
  {
    MutexLock lock(&tenants_mu_);
    tenants_seen_[c.tenant].partition = p;
  }
  const double max_share = bound ? bound->max_share : default_share;
  const double reserved = bound ? bound->reserved_share : 0.0;
  const auto slots = static_cast<double>(host_->slots());
  host_->SetBounds(
      p, HostTier::Bounds{max_share >= 1.0 ? UINT64_MAX : static_cast<uint64_t>(max_share * slots),
                          static_cast<uint64_t>(reserved * slots)});
  return p;
}

Status Server::Impl::OnHello(Conn* c, std::span<const std::byte> in, Writer* w, bool* pass_fd) {
  Hello h;
  KVTIER_RETURN_IF_ERROR(DecodeHello(in, &h));
  if (h.version != kProtocolVersion)
    return Status::InvalidArgument("protocol version mismatch: the client speaks version " +
                                   std::to_string(h.version) + ", this daemon speaks version " +
                                   std::to_string(kProtocolVersion));
  const KvLayout& mine = cache_->layout();
  c->data_plane = !(h.layout == KvLayout{});
  if (c->data_plane && !(h.layout == mine))
    return Status::InvalidArgument("layout mismatch: the client declared " + h.layout.ToString() +
                                   ", this daemon serves " + mine.ToString());
  KVTIER_RETURN_IF_ERROR(CheckTenant(*c, h.tenant, h.token));
  if (c->data_plane || !OperatorPeer(*c)) {
    uint32_t clients = 0, max = 0;
    {
      MutexLock lock(&mu_);
      max = options_.max_clients;
      for (const auto& [id, o] : conns_) clients += o.get() != c && o->said_hello && !o->done;
    }
    if (clients >= max)
      return Status::ResourceExhausted("too many clients (" + std::to_string(clients) +
                                       ", serve.max_clients " + std::to_string(max) + ")");
  }
  c->hello = h;
  c->tenant = EffectiveTenant(*c, h.tenant);
  c->tenant_tag = TenantTag(c->tenant);
  if (c->data_plane) {
    KVTIER_ASSIGN_OR_RETURN(c->partition, PartitionFor(*c));
  }
  HelloReply r;
  r.block_bytes = c->data_plane ? mine.bytes_per_block() : 0;
  r.arena_bytes = c->data_plane ? host_->arena_bytes() : 0;
  r.lease_ms = lease_ms_;
  if (c->data_plane) {
    KVTIER_ASSIGN_OR_RETURN(r.root, RootFor(*c, Scope{}));
  }
  r.tenant = c->tenant;
  r.events = cache_->WantsEngineHashes();
  if (c->data_plane) ClaimAhead(*c, &r.warm);
  EncodeHelloReply(r, w);
  *pass_fd = c->data_plane;
  spdlog::info("{}: hello: model '{}' rev '{}', tenant '{}', lora '{}'{}", c->Name(), h.model_id,
               h.model_revision, h.tenant, h.lora_id, c->data_plane ? "" : " (operator)");
  if (c->data_plane && h.model_revision.empty() && no_revision_log_.Allow()) {
    // Only the revision keeps two checkpoints served under one model id apart.
    spdlog::warn(
        "{}: model '{}' declares no revision: any other weights served as '{}' share "
        "its blocks; give model_revision (a hash of the weights or a revision string; said at most "
        "every 10 s)",
        c->Name(), h.model_id, h.model_id);
  }
  return Status::Ok();
}

// A lookup or prefetch request: its chain keyed under the connection's root, looked up (pinned).
Result<LookupResult> Server::Impl::LookupRequest(Conn* c) {
  LookupReq& m = c->lookup;
  KVTIER_ASSIGN_OR_RETURN(BlockKey root, RootFor(*c, m.scope));
  if (m.tokens) HashPrefix(root, cache_->layout().block_tokens, m.token_ids, &m.keys);
  for (BlockKey& k : m.keys) k = InternalKey(k, root, c->tenant_tag);
  RequestOptions ro;
  ro.session_id = m.session_id;
  return CacheHooks::LookupKeys(*cache_, m.keys, ro, &c->checksums);
}

Status Server::Impl::OnLookup(Conn* c, Writer* w) {
  KVTIER_ASSIGN_OR_RETURN(LookupResult lr, LookupRequest(c));
  const uint32_t total = static_cast<uint32_t>(lr.keys.size());
  const uint32_t hit = lr.hit_blocks;
  c->offsets.resize(hit);
  host_->Offsets(std::span<const BlockKey>(lr.keys).first(hit), c->offsets);
  // Encoded before lr moves into the lease (the reply reads its sources).
  const uint64_t lease_id = hit > 0 ? next_id_++ : 0;
  EncodeLookupReply(lease_id, total, lr.source, c->offsets, c->checksums, w);
  if (hit > 0) {
    MutexLock cl(&c->mu);
    c->leases.emplace(lease_id, Lease{std::move(lr), MonotonicNs() + LeaseNs()});
    ++leases_now_;
  }
  return Status::Ok();
}

void Server::Impl::Stage(const LookupResult& lr, uint32_t n, std::span<uint64_t> offsets) {
  std::span<const BlockKey> keys = std::span<const BlockKey>(lr.keys).first(n);
  host_->Offsets(keys, offsets);
  // Chunks of at most 64 blocks, so the scratch stays small whatever the prefix.
  constexpr uint32_t kChunk = 64;
  const uint64_t bb = cache_->layout().bytes_per_block();
  std::vector<std::byte> scratch;
  for (uint32_t begin = 0; begin < n; begin += kChunk) {
    const uint32_t end = std::min(n, begin + kChunk);
    bool missing = false;
    for (uint32_t i = begin; i < end; ++i) missing |= offsets[i] == kNoOffset;
    if (!missing) continue;
    // Load promotes into the arena (tier 0), where lr's pins keep the blocks.
    LookupResult part;
    part.keys.assign(lr.keys.begin() + begin, lr.keys.begin() + end);
    part.source.assign(lr.source.begin() + begin, lr.source.begin() + end);
    part.hit_blocks = end - begin;
    part.block_tokens = lr.block_tokens;
    scratch.resize(uint64_t{end - begin} * bb);
    std::vector<MutableBlock> dst;
    for (uint32_t i = 0; i < end - begin; ++i) dst.emplace_back(scratch.data() + i * bb, bb);
    auto loaded = CacheHooks::LoadIntoHost(*cache_, part, dst);
    host_->Offsets(keys.subspan(begin, end - begin), offsets.subspan(begin, end - begin));
    const uint32_t ok = loaded.ok() ? loaded->loaded_blocks : 0;
    if (ok < end - begin) {  // the rest of the prefix would be recomputed anyway
      for (uint32_t i = begin + ok; i < n; ++i) offsets[i] = kNoOffset;
      return;
    }
  }
}

Status Server::Impl::OnPrefetch(Conn* c, Writer* w) {
  KVTIER_ASSIGN_OR_RETURN(LookupResult lr, LookupRequest(c));
  std::vector<uint64_t> offsets(lr.hit_blocks);
  Stage(lr, lr.hit_blocks, offsets);
  uint32_t staged = 0;
  while (staged < offsets.size() && offsets[staged] != kNoOffset) ++staged;
  w->U32(staged);  // lr's pins end here: prefetched blocks stay by recency, not by lease
  return Status::Ok();
}

Status Server::Impl::OnLoad(Conn* c, std::span<const std::byte> in, Writer* w) {
  LoadReq m;
  KVTIER_RETURN_IF_ERROR(DecodeLoad(in, &m));
  // The lease leaves the table while staging runs (outside the lock), then comes back.
  Lease lease;
  {
    MutexLock cl(&c->mu);
    auto it = c->leases.find(m.lease_id);
    if (it == c->leases.end())
      return Status::NotFound("lease " + std::to_string(m.lease_id) + " expired or unknown");
    lease = std::move(it->second);
    c->leases.erase(it);
  }
  const uint32_t n = std::min(m.blocks, lease.lookup.hit_blocks);
  LoadReply r;
  r.offsets.resize(n);
  r.checksums.resize(n);
  Stage(lease.lookup, n, r.offsets);
  CacheHooks::Checksums(*cache_, std::span<const BlockKey>(lease.lookup.keys).first(n),
                        r.checksums);
  {
    MutexLock cl(&c->mu);
    lease.expires_ns = MonotonicNs() + LeaseNs();
    c->leases.emplace(m.lease_id, std::move(lease));
  }
  EncodeLoadReply(r, w);
  return Status::Ok();
}

void Server::Impl::ClaimAhead(const Conn& c, std::vector<uint64_t>* warm) {
  const uint64_t bytes = warm_ahead_bytes_.load(std::memory_order_relaxed);
  if (bytes == 0 || c.partition <= 0) return;
  const size_t got = host_->ClaimAhead(c.partition, bytes / host_->SlotOffset(1), warm);
  if (got > 0) warm_claimed_blocks_.fetch_add(got, std::memory_order_relaxed);
}

Status Server::Impl::OnReserve(Conn* c, std::span<const std::byte> in, Writer* w) {
  ReserveReq m;
  KVTIER_RETURN_IF_ERROR(DecodeReserve(in, &m));
  KVTIER_ASSIGN_OR_RETURN(BlockKey root, RootFor(*c, m.scope));
  for (BlockKey& k : m.keys) k = InternalKey(k, root, c->tenant_tag);
  ReserveReply r;
  r.state.assign(m.keys.size(), static_cast<uint8_t>(SlotState::kNoRoom));
  r.offsets.assign(m.keys.size(), kNoOffset);
  std::vector<uint64_t> present(m.keys.size());
  host_->Offsets(m.keys, present);
  std::vector<uint32_t> need, at;
  std::vector<BlockKey> there;
  for (uint32_t i = 0; i < m.keys.size(); ++i) {
    if (present[i] != kNoOffset) {
      r.state[i] = static_cast<uint8_t>(SlotState::kPresent);
      there.push_back(m.keys[i]);
      at.push_back(m.first_block + i);
    } else if (cache_->num_tiers() > 1 || m.first_block + uint64_t{i} < host_->capacity_blocks()) {
      // As in process (Cache::Impl::ChainRoom): a position past the arena's capacity is
      // refused rather than evicting the prefix it extends. With tiers below, it is taken:
      // its bytes reach them only through an arena slot.
      need.push_back(i);
    }
  }
  // What the store finds present is touched before room is made, as in process: untouched,
  // it could be evicted for the request's own new blocks.
  if (!there.empty()) CacheHooks::Touch(*cache_, there, at, m.session_id);
  Reservation res;
  res.first_block = m.first_block;
  res.session_id = m.session_id;
  if (!need.empty()) {
    const size_t got = CacheHooks::Reserve(*cache_, c->partition, need.size(), &res.slots);
    if (!m.engine.empty()) res.engine.reserve(got);
    // The chain's head first: a later block is useless without the ones before it.
    for (size_t j = 0; j < got; ++j) {
      r.state[need[j]] = static_cast<uint8_t>(SlotState::kReserved);
      r.offsets[need[j]] = host_->SlotOffset(res.slots[j]);
      res.keys.push_back(m.keys[need[j]]);
      if (!m.engine.empty()) res.engine.push_back(std::move(m.engine[need[j]]));
    }
  }
  if (!res.slots.empty()) {
    r.reservation_id = next_id_++;
    res.expires_ns = MonotonicNs() + LeaseNs();
    MutexLock cl(&c->mu);
    c->reservations.emplace(r.reservation_id, std::move(res));
    ++reservations_now_;
  }
  ClaimAhead(*c, &r.warm);
  EncodeReserveReply(r, w);
  return Status::Ok();
}

Status Server::Impl::OnCommit(Conn* c, std::span<const std::byte> in, Writer* w) {
  CommitReq m;
  KVTIER_RETURN_IF_ERROR(DecodeCommit(in, &m));
  Reservation res;
  {
    MutexLock cl(&c->mu);
    auto it = c->reservations.find(m.reservation_id);
    if (it == c->reservations.end())
      return Status::NotFound("reservation " + std::to_string(m.reservation_id) +
                              " expired or unknown");
    res = std::move(it->second);
    c->reservations.erase(it);
    --reservations_now_;
  }
  CommitReply r;
  if (m.written.size() != res.slots.size()) {
    CacheHooks::Unreserve(*cache_, res.slots);
    return Status::InvalidArgument("commit: " + std::to_string(m.written.size()) +
                                   " flags for a reservation of " +
                                   std::to_string(res.slots.size()) + " slots");
  }
  std::vector<BlockKey> keys;
  std::vector<uint32_t> slots, dropped;
  std::vector<uint64_t> sums;
  std::vector<EngineBlockHashes> engine;
  if (!res.engine.empty()) engine.reserve(res.engine.size());
  const uint64_t bb = cache_->layout().bytes_per_block();
  const bool verify = verify_commit_;
  for (size_t j = 0; j < res.slots.size(); ++j) {
    if (!m.written[j]) {
      dropped.push_back(res.slots[j]);
      continue;
    }
    if (verify) {
      const ConstBlock b(host_->SlotPtr(res.slots[j]), bb);
      if (Checksum64(b) != m.checksums[j]) {
        ++r.failed;
        if (r.first_error.ok())
          r.first_error = Status::Corruption("commit: block " + res.keys[j].ToHex() +
                                             " does not match its checksum; dropped");
        dropped.push_back(res.slots[j]);
        continue;
      }
    }
    keys.push_back(res.keys[j]);
    slots.push_back(res.slots[j]);
    sums.push_back(m.checksums[j]);
    if (!res.engine.empty()) engine.push_back(std::move(res.engine[j]));
  }
  if (!dropped.empty()) CacheHooks::Unreserve(*cache_, dropped);
  if (!keys.empty()) {
    StoreResult s =
        CacheHooks::Commit(*cache_, keys, slots, sums, res.first_block, res.session_id, engine);
    r.stored = s.stored_blocks;
    r.present = s.present_blocks;
  }
  EncodeCommitReply(r, w);
  return Status::Ok();
}

Status Server::Impl::OnDropTenant(Conn* c, std::span<const std::byte> in, Writer* w) {
  std::string tenant;
  KVTIER_RETURN_IF_ERROR(DecodeDropTenant(in, &tenant));
  if (!OperatorPeer(*c))
    return Status::InvalidArgument("drop-tenant: only uid " + std::to_string(getuid()) +
                                   " or root may drop a tenant; " + c->Name() + " may not");
  // The tenant's own tag (listed) and the tags of every uid that declared the name (unlisted).
  std::vector<uint32_t> tags{TenantTag(tenant)};
  {
    MutexLock lock(&tenants_mu_);
    for (const auto& [name, t] : tenants_seen_)
      if (t.declared == tenant) tags.push_back(TenantTag(name));
  }
  DropTenantReply r;
  r.dropped = CacheHooks::DropMatching(
      *cache_,
      [&tags](const BlockKey& k) {
        for (uint32_t t : tags)
          if (HasTenantTag(k, t)) return true;
        return false;
      },
      &r.pinned);
  spdlog::info("{}: drop tenant '{}': {} blocks dropped, {} pinned kept", c->Name(), tenant,
               r.dropped, r.pinned);
  EncodeDropTenantReply(r, w);
  return Status::Ok();
}

Status Server::Impl::Handle(Conn* c, MsgType type, std::span<const std::byte> payload, Writer* w,
                            bool* said_hello, bool* pass_fd) {
  switch (type) {
    case MsgType::kHello: {
      Status st =
          *said_hello ? Status::InvalidArgument("a second hello") : OnHello(c, payload, w, pass_fd);
      if (!st.ok()) ++refused_;
      *said_hello = st.ok();
      return st;
    }
    case MsgType::kLookup:
      return OnLookup(c, w);
    case MsgType::kLoad:
      return OnLoad(c, payload, w);
    case MsgType::kReserve:
      return OnReserve(c, payload, w);
    case MsgType::kCommit:
      return OnCommit(c, payload, w);
    case MsgType::kPrefetch:
      return OnPrefetch(c, w);
    case MsgType::kRelease:
      return OnRelease(c, payload);
    case MsgType::kBadBlock:
      return OnBadBlock(c, payload);
    case MsgType::kDeclined: {
      std::vector<uint32_t> by_tier;
      KVTIER_RETURN_IF_ERROR(DecodeDeclined(payload, &by_tier));
      cache_->NoteDeclined(by_tier);
      return Status::Ok();
    }
    case MsgType::kSession:
      return OnSession(payload);
    case MsgType::kStats:
      EncodeStatsReply(cache_->stats(), Counters(), w);
      return Status::Ok();
    case MsgType::kPing:
      return Status::Ok();
    case MsgType::kFlush:
      return OnFlush(c, w);
    case MsgType::kDropTenant:
      return OnDropTenant(c, payload, w);
  }
  return Status::InvalidArgument("unknown request type");
}

Status Server::Impl::OnRelease(Conn* c, std::span<const std::byte> in) {
  uint64_t id = 0;
  KVTIER_RETURN_IF_ERROR(DecodeU64(in, &id, "release"));
  MutexLock cl(&c->mu);
  if (c->leases.erase(id)) --leases_now_;
  return Status::Ok();
}

Status Server::Impl::OnBadBlock(Conn* c, std::span<const std::byte> in) {
  uint64_t id = 0;
  uint32_t block = 0;
  KVTIER_RETURN_IF_ERROR(DecodeBadBlock(in, &id, &block));
  Lease lease;
  {
    MutexLock cl(&c->mu);
    auto it = c->leases.find(id);
    if (it == c->leases.end() || block >= it->second.lookup.hit_blocks) return Status::Ok();
    lease = std::move(it->second);  // the client recomputes from here: its pins end now
    c->leases.erase(it);
    --leases_now_;
  }
  // The client's word is checked, not taken: only bytes that fail their checksum here go.
  const BlockKey key = lease.lookup.keys[block];
  const std::byte* at = nullptr;
  uint64_t want = 0;
  host_->Pointers(std::span<const BlockKey>(&key, 1), std::span<const std::byte*>(&at, 1));
  CacheHooks::Checksums(*cache_, std::span<const BlockKey>(&key, 1), std::span<uint64_t>(&want, 1));
  lease = Lease{};
  if (at == nullptr || want == 0 ||
      Checksum64(ConstBlock(at, cache_->layout().bytes_per_block())) == want)
    return Status::Ok();
  ++corrupt_loads_;
  uint64_t pinned = 0;
  CacheHooks::DropMatching(
      *cache_, [&key](const BlockKey& k) { return k == key; }, &pinned);
  spdlog::warn("{}: block {} changed in the arena after its commit; dropped{}", c->Name(),
               key.ToHex(),
               pinned ? " from the lower tiers (another lease pins its arena copy)" : "");
  return Status::Ok();
}

Status Server::Impl::OnSession(std::span<const std::byte> in) {
  SessionReq m;
  KVTIER_RETURN_IF_ERROR(DecodeSession(in, &m));
  cache_->NotifySession(m.session_id, static_cast<SessionEvent>(m.event));
  return Status::Ok();
}

Status Server::Impl::OnFlush(Conn* c, Writer* w) {
  if (!OperatorPeer(*c)) {
    return Status::InvalidArgument("flush: only uid " + std::to_string(getuid()) +
                                   " or root may flush; " + c->Name() + " may not");
  }
  const uint64_t n = CacheHooks::ClearManaged(*cache_);
  spdlog::info("{}: flush dropped {} blocks", c->Name(), n);
  w->U64(n);
  return Status::Ok();
}

}  // namespace kvtier::serve
