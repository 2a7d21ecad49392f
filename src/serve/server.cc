#include "serve/server.h"

#include <grp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <thread>

#include <spdlog/spdlog.h>

#include "cache/cache_hooks.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "config/tier_params.h"
#include "hash/xxh.h"
#include "kvtier/client.h"
#include "serve/socket_io.h"
#include "tiers/host/host_tier.h"

namespace kvtier::serve {

uint32_t TenantTag(std::string_view tenant) {
  return static_cast<uint32_t>(XXH3_64bits(tenant.data(), tenant.size()));
}

BlockKey InternalKey(const BlockKey& client_key, const BlockKey& root, uint32_t tenant_tag) {
  // XXH3-128 of the 16-byte key seeded by the root: its short-input path, ~2x cheaper than
  // chaining 24 bytes, and still a hash (not a bijection a client could invert). 96 of its bits
  // stay; 32 carry the tenant.
  const uint64_t k[2] = {client_key.hi, client_key.lo};
  const XXH128_hash_t h =
      XXH3_128bits_withSeed(k, sizeof(k), root.hi ^ (root.lo * 0x9E3779B97F4A7C15ull));
  return BlockKey{h.high64, (h.low64 & 0xffffffffull) | (uint64_t{tenant_tag} << 32)};
}

namespace {

// A lookup's pins, held for the client until release, expiry or disconnect.
struct Lease {
  LookupResult lookup;  // internal keys; its PinHandle keeps the blocks resident
  uint64_t expires_ns = 0;
};

// Slots a client is writing; freed unless committed in time.
struct Reservation {
  std::vector<BlockKey> keys;  // internal keys of the reserved slots, in order
  std::vector<uint32_t> slots;
  uint32_t first_block = 0;
  uint64_t expires_ns = 0;
};

struct Peer {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};

}  // namespace

class Server::Impl {
 public:
  struct Conn {
    uint64_t id = 0;
    int fd = -1;
    Peer peer;
    std::thread thread;
    std::atomic<bool> done{false};
    // Set by hello.
    bool data_plane = false;
    Hello hello;
    std::string tenant;  // effective tenant
    uint32_t tenant_tag = 0;
    Mutex mu;  // leases and reservations: the connection's thread and the sweeper
    std::map<uint64_t, Lease> leases KVTIER_GUARDED_BY(mu);
    std::map<uint64_t, Reservation> reservations KVTIER_GUARDED_BY(mu);
    // The connection thread's own scratch, kept between requests so a long chain allocates
    // nothing: the lookup or prefetch being served (decoded once) and its reply's offsets.
    LookupReq lookup;
    std::vector<uint64_t> offsets;
    std::string Name() const {
      return "client #" + std::to_string(id) + " (pid " + std::to_string(peer.pid) + ", uid " +
             std::to_string(peer.uid) + ")";
    }
  };

  Impl(std::unique_ptr<Cache> cache, ServeOptions options)
      : cache_(std::move(cache)), host_(&CacheHooks::SharedHost(*cache_)), options_(options) {}

  Status Bind() KVTIER_REQUIRES(mu_);
  void Run();
  void Stop();
  void Serve(Conn* c);
  void Sweep();
  std::vector<std::string> Reload(const CacheOptions& cache, const ServeOptions& options);
  ServeCounters Counters() const;

  // Handlers: write the reply body into *w; a non-OK status becomes an error reply.
  Status OnHello(Conn* c, std::span<const std::byte> in, Writer* w, bool* pass_fd);
  // The decoded c->lookup, keyed under the connection's root (in place) and looked up.
  Result<LookupResult> LookupRequest(Conn* c);
  Status OnLookup(Conn* c, Writer* w);
  Status OnLoad(Conn* c, std::span<const std::byte> in, Writer* w);
  Status OnReserve(Conn* c, std::span<const std::byte> in, Writer* w);
  Status OnCommit(Conn* c, std::span<const std::byte> in, Writer* w);
  Status OnPrefetch(Conn* c, Writer* w);
  // Offsets of lr's first n blocks, staging those below the arena into it first; from the
  // first block that cannot be staged on, kNoOffset.
  void Stage(const LookupResult& lr, uint32_t n, std::span<uint64_t> offsets);
  void EndAll(Conn* c);
  // The namespace root for a request's scope; InvalidArgument when the peer may not use it.
  Result<BlockKey> RootFor(const Conn& c, const Scope& scope) const;
  static uint32_t TagFor(const Conn& c, const Scope& scope) {
    return scope.tenant.empty() ? c.tenant_tag : TenantTag(scope.tenant);
  }
  Status OnDropTenant(Conn* c, std::span<const std::byte> in, Writer* w);
  Status CheckTenant(const Conn& c, const std::string& tenant, const std::string& token) const;
  // Operator commands (flush, drop-tenant): the daemon's own user or root only.
  static bool OperatorPeer(const Conn& c) { return c.peer.uid == getuid() || c.peer.uid == 0; }
  uint64_t LeaseNs() const { return uint64_t{lease_ms_.load()} * 1000000; }

  std::unique_ptr<Cache> cache_;
  HostTier* host_;
  std::string socket_path_;
  int listen_fd_ = -1;
  int wake_fd_ = -1;
  std::thread acceptor_, sweeper_;
  std::atomic<bool> stopping_{false};
  std::atomic<uint32_t> lease_ms_{30000};
  std::atomic<bool> verify_commit_{false};
  std::atomic<uint64_t> next_id_{1};
  std::atomic<uint64_t> refused_{0}, bad_frames_{0}, leases_now_{0}, reservations_now_{0};

  mutable Mutex mu_;  // options_ and conns_
  ServeOptions options_ KVTIER_GUARDED_BY(mu_);
  std::map<uint64_t, std::unique_ptr<Conn>> conns_ KVTIER_GUARDED_BY(mu_);
  Mutex stop_mu_;
  bool stopped_ KVTIER_GUARDED_BY(stop_mu_) = false;
};

Status Server::Impl::Bind() {
  socket_path_ = options_.socket_path.empty() ? DefaultSocketPath() : options_.socket_path;
  lease_ms_ = options_.lease_ms;
  verify_commit_ = options_.verify_commit;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socket_path_.size() >= sizeof(addr.sun_path))
    return Status::InvalidArgument("serve.socket: path too long: " + socket_path_);
  // The folder: created 0750 when missing (systemd's RuntimeDirectory makes it otherwise).
  const auto slash = socket_path_.rfind('/');
  if (slash != std::string::npos && slash > 0) {
    const std::string dir = socket_path_.substr(0, slash);
    if (mkdir(dir.c_str(), 0750) != 0 && errno != EEXIST)
      return Status::Unavailable("serve.socket: cannot create " + dir + ": " +
                                 std::strerror(errno));
  }
  // A socket file left by a dead daemon is removed; one a live daemon answers on is not.
  auto probe = ConnectUnix(socket_path_);
  if (probe.ok()) {
    close(*probe);
    return Status::Unavailable(socket_path_ + ": another daemon is serving on this socket");
  }
  unlink(socket_path_.c_str());
  std::memcpy(addr.sun_path, socket_path_.c_str(), socket_path_.size() + 1);
  listen_fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (listen_fd_ < 0) return Status::Unavailable(std::string("socket: ") + std::strerror(errno));
  // Created with no access, then given its mode and group: never briefly open to all.
  const mode_t old = umask(0777);
  const int rc = bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  umask(old);
  if (rc != 0) return Status::Unavailable(socket_path_ + ": bind: " + std::strerror(errno));
  if (!options_.group.empty()) {
    gid_t gid = 0;
    if (group* g = getgrnam(options_.group.c_str())) {
      gid = g->gr_gid;
    } else {
      char* end = nullptr;
      gid = static_cast<gid_t>(std::strtoul(options_.group.c_str(), &end, 10));
      if (!end || *end != '\0')
        return Status::InvalidArgument("serve.group: no group '" + options_.group + "'");
    }
    if (chown(socket_path_.c_str(), static_cast<uid_t>(-1), gid) != 0)
      return Status::Unavailable(socket_path_ + ": chown to group " + options_.group + ": " +
                                 std::strerror(errno));
  }
  if (chmod(socket_path_.c_str(), options_.socket_mode) != 0)
    return Status::Unavailable(socket_path_ + ": chmod: " + std::strerror(errno));
  if (listen(listen_fd_, SOMAXCONN) != 0)
    return Status::Unavailable(socket_path_ + ": listen: " + std::strerror(errno));
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) return Status::Unavailable(std::string("eventfd: ") + std::strerror(errno));
  return Status::Ok();
}

void Server::Impl::Run() {
  // spdlog builds its registry on first use; build it here, before any connection thread, so
  // that the first log lines of two connections do not race to construct it.
  spdlog::default_logger_raw();
  acceptor_ = std::thread([this] {
    for (;;) {
      pollfd p[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
      if (poll(p, 2, -1) < 0 && errno != EINTR) break;
      if (stopping_) break;
      if (!(p[0].revents & POLLIN)) continue;
      const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) continue;
      auto c = std::make_unique<Conn>();
      c->id = next_id_++;
      c->fd = fd;
      ucred cred{};
      socklen_t len = sizeof(cred);
      if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
        c->peer = Peer{cred.pid, cred.uid, cred.gid};
      }
      MutexLock lock(&mu_);
      // Reap finished connections here: their threads have returned.
      for (auto it = conns_.begin(); it != conns_.end();) {
        if (it->second->done) {
          it->second->thread.join();
          it = conns_.erase(it);
        } else {
          ++it;
        }
      }
      bool allowed = options_.allow_uids.empty() || c->peer.uid == getuid();
      for (uint32_t u : options_.allow_uids) allowed |= u == c->peer.uid;
      if (!allowed || conns_.size() >= options_.max_clients) {
        spdlog::warn(
            "{}: refused: {}", c->Name(),
            allowed ? "too many clients (serve.max_clients)" : "uid not in serve.allow_uids");
        ++refused_;
        close(fd);
        continue;
      }
      Conn* raw = c.get();
      raw->thread = std::thread([this, raw] { Serve(raw); });
      conns_.emplace(raw->id, std::move(c));
    }
  });
  sweeper_ = std::thread([this] { Sweep(); });
}

void Server::Impl::Sweep() {
  while (!stopping_) {
    pollfd p{wake_fd_, POLLIN, 0};
    const int period = static_cast<int>(std::clamp<uint32_t>(lease_ms_ / 4, 5, 250));
    if (poll(&p, 1, period) > 0 && stopping_) break;
    const uint64_t now = MonotonicNs();
    MutexLock lock(&mu_);
    for (auto& [id, c] : conns_) {
      std::vector<uint32_t> freed;
      size_t leases = 0;
      {
        MutexLock cl(&c->mu);
        for (auto it = c->leases.begin(); it != c->leases.end();) {
          if (it->second.expires_ns <= now) {
            it = c->leases.erase(it);  // its PinHandle unpins
            ++leases;
          } else {
            ++it;
          }
        }
        for (auto it = c->reservations.begin(); it != c->reservations.end();) {
          if (it->second.expires_ns <= now) {
            freed.insert(freed.end(), it->second.slots.begin(), it->second.slots.end());
            it = c->reservations.erase(it);
            --reservations_now_;
          } else {
            ++it;
          }
        }
      }
      leases_now_ -= leases;
      if (!freed.empty()) {
        spdlog::info("{}: {} reserved slots expired uncommitted after {} ms", c->Name(),
                     freed.size(), lease_ms_.load());
        CacheHooks::Unreserve(*cache_, freed);
      }
      if (leases) spdlog::debug("{}: {} leases expired", c->Name(), leases);
    }
  }
}

void Server::Impl::EndAll(Conn* c) {
  std::vector<uint32_t> freed;
  size_t leases = 0, res = 0;
  {
    MutexLock cl(&c->mu);
    leases = c->leases.size();
    c->leases.clear();
    for (auto& [id, r] : c->reservations) freed.insert(freed.end(), r.slots.begin(), r.slots.end());
    res = c->reservations.size();
    c->reservations.clear();
  }
  leases_now_ -= leases;
  reservations_now_ -= res;
  if (!freed.empty()) CacheHooks::Unreserve(*cache_, freed);
}

Status Server::Impl::CheckTenant(const Conn& c, const std::string& tenant,
                                 const std::string& token) const {
  MutexLock lock(&mu_);
  for (const TenantBinding& b : options_.tenants) {
    if (b.name != tenant) continue;
    bool ok = !b.token.empty() && token == b.token;
    for (uint32_t u : b.uids) ok |= u == c.peer.uid;
    if (!ok)
      return Status::InvalidArgument(
          "tenant '" + tenant + "' is bound to " +
          (b.uids.empty() ? std::string("a token") : "uids/token in serve.tenants") + "; " +
          c.Name() + " may not declare it");
    return Status::Ok();
  }
  return Status::Ok();
}

Result<BlockKey> Server::Impl::RootFor(const Conn& c, const Scope& scope) const {
  if (!c.data_plane) return Status::InvalidArgument("this connection declared no layout");
  Namespace ns{c.hello.model_id, c.hello.model_revision, c.hello.layout.fingerprint(),
               scope.tenant.empty() ? c.tenant : scope.tenant,
               scope.lora_id.empty() ? c.hello.lora_id : scope.lora_id};
  if (!scope.tenant.empty() && scope.tenant != c.tenant)
    KVTIER_RETURN_IF_ERROR(CheckTenant(c, scope.tenant, c.hello.token));
  return ns.Root();
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
  c->hello = h;
  c->tenant = h.tenant;
  c->tenant_tag = TenantTag(h.tenant);
  HelloReply r;
  r.block_bytes = c->data_plane ? mine.bytes_per_block() : 0;
  r.arena_bytes = c->data_plane ? host_->arena_bytes() : 0;
  r.lease_ms = lease_ms_;
  if (c->data_plane) {
    KVTIER_ASSIGN_OR_RETURN(r.root, RootFor(*c, Scope{}));
  }
  r.tenant = c->tenant;
  EncodeHelloReply(r, w);
  *pass_fd = c->data_plane;
  spdlog::info("{}: hello: model '{}' rev '{}', tenant '{}', lora '{}'{}", c->Name(), h.model_id,
               h.model_revision, h.tenant, h.lora_id, c->data_plane ? "" : " (operator)");
  return Status::Ok();
}

// A lookup or prefetch request: its chain keyed under the connection's root, looked up (pinned).
Result<LookupResult> Server::Impl::LookupRequest(Conn* c) {
  LookupReq& m = c->lookup;
  KVTIER_ASSIGN_OR_RETURN(BlockKey root, RootFor(*c, m.scope));
  if (m.tokens) HashPrefix(root, cache_->layout().block_tokens, m.token_ids, &m.keys);
  const uint32_t tag = TagFor(*c, m.scope);
  for (BlockKey& k : m.keys) k = InternalKey(k, root, tag);
  RequestOptions ro;
  ro.session_id = m.session_id;
  return cache_->LookupKeys(m.keys, ro);
}

Status Server::Impl::OnLookup(Conn* c, Writer* w) {
  KVTIER_ASSIGN_OR_RETURN(LookupResult lr, LookupRequest(c));
  const uint32_t total = static_cast<uint32_t>(lr.keys.size());
  const uint32_t hit = lr.hit_blocks;
  c->offsets.resize(hit);
  host_->Offsets(std::span<const BlockKey>(lr.keys).first(hit), c->offsets);
  // Encoded before lr moves into the lease (the reply reads its sources).
  const uint64_t lease_id = hit > 0 ? next_id_++ : 0;
  EncodeLookupReply(lease_id, total, lr.source, c->offsets, w);
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
  Stage(lease.lookup, n, r.offsets);
  {
    MutexLock cl(&c->mu);
    lease.expires_ns = MonotonicNs() + LeaseNs();
    c->leases.emplace(m.lease_id, std::move(lease));
  }
  EncodeLoadReply(r, w);
  return Status::Ok();
}

Status Server::Impl::OnReserve(Conn* c, std::span<const std::byte> in, Writer* w) {
  ReserveReq m;
  KVTIER_RETURN_IF_ERROR(DecodeReserve(in, &m));
  KVTIER_ASSIGN_OR_RETURN(BlockKey root, RootFor(*c, m.scope));
  const uint32_t tag = TagFor(*c, m.scope);
  for (BlockKey& k : m.keys) k = InternalKey(k, root, tag);
  ReserveReply r;
  r.state.assign(m.keys.size(), static_cast<uint8_t>(SlotState::kNoRoom));
  r.offsets.assign(m.keys.size(), kNoOffset);
  std::vector<uint64_t> present(m.keys.size());
  host_->Offsets(m.keys, present);
  std::vector<uint32_t> need;
  for (uint32_t i = 0; i < m.keys.size(); ++i) {
    if (present[i] != kNoOffset)
      r.state[i] = static_cast<uint8_t>(SlotState::kPresent);
    else
      need.push_back(i);
  }
  Reservation res;
  res.first_block = m.first_block;
  if (!need.empty()) {
    const size_t got = CacheHooks::Reserve(*cache_, need.size(), &res.slots);
    // The chain's head first: a later block is useless without the ones before it.
    for (size_t j = 0; j < got; ++j) {
      r.state[need[j]] = static_cast<uint8_t>(SlotState::kReserved);
      r.offsets[need[j]] = host_->SlotOffset(res.slots[j]);
      res.keys.push_back(m.keys[need[j]]);
    }
  }
  if (!res.slots.empty()) {
    r.reservation_id = next_id_++;
    res.expires_ns = MonotonicNs() + LeaseNs();
    MutexLock cl(&c->mu);
    c->reservations.emplace(r.reservation_id, std::move(res));
    ++reservations_now_;
  }
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
  const uint64_t bb = cache_->layout().bytes_per_block();
  const bool verify = verify_commit_;
  for (size_t j = 0; j < res.slots.size(); ++j) {
    if (!m.written[j]) {
      dropped.push_back(res.slots[j]);
      continue;
    }
    if (verify) {
      const ConstBlock b(host_->arena() + host_->SlotOffset(res.slots[j]), bb);
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
  }
  if (!dropped.empty()) CacheHooks::Unreserve(*cache_, dropped);
  if (!keys.empty()) {
    StoreResult s = CacheHooks::Commit(*cache_, keys, slots, sums, res.first_block);
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
  const uint32_t tag = TenantTag(tenant);
  DropTenantReply r;
  r.dropped = CacheHooks::DropMatching(
      *cache_, [tag](const BlockKey& k) { return HasTenantTag(k, tag); }, &r.pinned);
  spdlog::info("{}: drop tenant '{}': {} blocks dropped, {} pinned kept", c->Name(), tenant,
               r.dropped, r.pinned);
  EncodeDropTenantReply(r, w);
  return Status::Ok();
}

void Server::Impl::Serve(Conn* c) {
  FrameHeader h;
  std::vector<std::byte> payload;
  Writer w;
  bool said_hello = false;
  std::string why;
  for (;;) {
    Status s = RecvFrame(c->fd, 0, wake_fd_, &h, &payload, nullptr);
    if (!s.ok()) {
      if (s.code() == StatusCode::kInvalidArgument) {
        ++bad_frames_;
        why = s.message();
      } else if (s.message() != "peer closed the connection" && s.message() != "stopping") {
        ++bad_frames_;
        why = s.message();
      }
      break;
    }
    const auto type = static_cast<MsgType>(h.type);
    if (!said_hello && type != MsgType::kHello) {
      ++bad_frames_;
      why = std::string(MsgTypeName(h.type)) + " before hello";
      break;
    }
    // A lookup or prefetch is decoded once, into the connection's scratch, for its handler.
    const bool lookup = type == MsgType::kLookup || type == MsgType::kPrefetch;
    Status st = lookup ? DecodeLookup(payload, &c->lookup) : DecodeRequest(h.type, payload);
    if (!st.ok()) {
      ++bad_frames_;
      why = st.message();
      break;
    }
    w.Begin(h.type | kReplyBit, 0, h.request_id);
    w.StatusField(Status::Ok());
    const size_t body = w.buffer().size();
    bool pass_fd = false;
    switch (type) {
      case MsgType::kHello:
        st = said_hello ? Status::InvalidArgument("a second hello")
                        : OnHello(c, payload, &w, &pass_fd);
        if (!st.ok()) ++refused_;
        said_hello = st.ok();
        break;
      case MsgType::kLookup:
        st = OnLookup(c, &w);
        break;
      case MsgType::kLoad:
        st = OnLoad(c, payload, &w);
        break;
      case MsgType::kReserve:
        st = OnReserve(c, payload, &w);
        break;
      case MsgType::kCommit:
        st = OnCommit(c, payload, &w);
        break;
      case MsgType::kPrefetch:
        st = OnPrefetch(c, &w);
        break;
      case MsgType::kRelease: {
        uint64_t id = 0;
        st = DecodeU64(payload, &id, "release");
        MutexLock cl(&c->mu);
        if (st.ok() && c->leases.erase(id)) --leases_now_;
        break;
      }
      case MsgType::kSession: {
        SessionReq m;
        st = DecodeSession(payload, &m);
        if (st.ok()) cache_->NotifySession(m.session_id, static_cast<SessionEvent>(m.event));
        break;
      }
      case MsgType::kStats:
        EncodeStatsReply(cache_->stats(), Counters(), &w);
        break;
      case MsgType::kPing:
        break;
      case MsgType::kFlush: {
        if (!OperatorPeer(*c)) {
          st = Status::InvalidArgument("flush: only uid " + std::to_string(getuid()) +
                                       " or root may flush; " + c->Name() + " may not");
          break;
        }
        const uint64_t n = CacheHooks::ClearManaged(*cache_);
        spdlog::info("{}: flush dropped {} blocks", c->Name(), n);
        w.U64(n);
        break;
      }
      case MsgType::kDropTenant:
        st = OnDropTenant(c, payload, &w);
        break;
    }
    if (h.flags & kFlagNoReply) continue;
    if (!st.ok()) {  // the reply is the status alone
      w.buffer().resize(body);
      w.Begin(h.type | kReplyBit, 0, h.request_id);
      w.StatusField(st);
    }
    s = SendAll(c->fd, w.Finish(), MonotonicNs() + 10'000'000'000ull,
                pass_fd && st.ok() ? host_->arena_fd() : -1);
    if (!s.ok()) {
      why = "reply not taken: " + s.message();
      break;
    }
    if (type == MsgType::kHello && !st.ok()) {
      why = "hello refused: " + st.message();
      break;
    }
  }
  if (!why.empty()) spdlog::warn("{}: disconnecting: {}", c->Name(), why);
  EndAll(c);
  close(c->fd);
  c->done = true;
}

ServeCounters Server::Impl::Counters() const {
  ServeCounters s;
  {
    MutexLock lock(&mu_);
    for (const auto& [id, c] : conns_) s.clients += !c->done;
  }
  s.leases = leases_now_;
  s.reservations = reservations_now_;
  s.refused = refused_;
  s.disconnects = bad_frames_;
  s.pid = static_cast<uint64_t>(getpid());
  return s;
}

void Server::Impl::Stop() {
  {
    MutexLock lock(&stop_mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  stopping_ = true;
  if (wake_fd_ >= 0) {
    const uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof(one));
  }
  if (acceptor_.joinable()) acceptor_.join();
  if (sweeper_.joinable()) sweeper_.join();
  std::map<uint64_t, std::unique_ptr<Conn>> conns;
  {
    MutexLock lock(&mu_);
    conns.swap(conns_);
  }
  for (auto& [id, c] : conns) c->thread.join();  // each finishes the request it serves
  if (listen_fd_ >= 0) {
    close(listen_fd_);
    unlink(socket_path_.c_str());
    listen_fd_ = -1;
  }
}

std::vector<std::string> Server::Impl::Reload(const CacheOptions& cache,
                                              const ServeOptions& options) {
  std::vector<std::string> kept;
  MutexLock lock(&mu_);
  const std::string path = options.socket_path.empty() ? DefaultSocketPath() : options.socket_path;
  if (path != socket_path_)
    kept.push_back("serve.socket: stays " + socket_path_ + " until restart");
  if (options.group != options_.group || options.socket_mode != options_.socket_mode)
    kept.push_back("serve.group/socket_mode: apply at restart");
  if (options.metrics_addr != options_.metrics_addr || options.events_addr != options_.events_addr)
    kept.push_back("serve.metrics_addr/events_addr: apply at restart");
  if (!(cache.layout == cache_->layout())) kept.push_back("layout: applies at restart");
  if (cache.tiers.size() != static_cast<size_t>(cache_->num_tiers()))
    kept.push_back("tiers: apply at restart");
  const std::string socket = options_.socket_path;
  options_ = options;
  options_.socket_path = socket;
  lease_ms_ = options.lease_ms;
  verify_commit_ = options.verify_commit;
  return kept;
}

Result<std::unique_ptr<Server>> Server::Start(CacheOptions cache, ServeOptions options) {
  KVTIER_RETURN_IF_ERROR(options.Validate());
  if (cache.tiers.empty() || cache.tiers[0].kind != "host" || cache.tiers[0].instance)
    return Status::InvalidArgument("tiers[0]: the daemon's first tier must be kind host");
  // Tier 0 on a memfd: what clients map.
  const TierSpec& spec = cache.tiers[0];
  HostTierOptions ho;
  ho.name = spec.name.empty() ? "host" : spec.name;
  ho.capacity_bytes = spec.capacity_bytes;
  ho.threads = spec.threads;
  ho.shared = true;
  auto params = HostParamsOf(spec);
  if (!params.ok()) return params.status().WithContext("tiers[0]");
  ho.prefault = params->prefault;
  ho.huge_pages = params->huge_pages;
  ho.pin = params->pin.value_or(true);
  KVTIER_ASSIGN_OR_RETURN(auto host, HostTier::Open(cache.layout, ho));
  cache.tiers[0].instance = std::shared_ptr<Tier>(std::move(host));
  KVTIER_ASSIGN_OR_RETURN(auto c, Cache::Open(std::move(cache)));
  if (!CacheHooks::HasSharedHost(*c)) return Status::Internal("tier 0 is not a shared host arena");
  auto impl = std::make_unique<Impl>(std::move(c), std::move(options));
  {
    MutexLock lock(&impl->mu_);
    KVTIER_RETURN_IF_ERROR(impl->Bind());
  }
  impl->Run();
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Server::~Server() { impl_->Stop(); }
void Server::Stop() { impl_->Stop(); }
std::vector<std::string> Server::Reload(const CacheOptions& cache, const ServeOptions& options) {
  return impl_->Reload(cache, options);
}
const std::string& Server::socket_path() const { return impl_->socket_path_; }
Cache& Server::cache() { return *impl_->cache_; }
ServeCounters Server::counters() const { return impl_->Counters(); }

}  // namespace kvtier::serve
