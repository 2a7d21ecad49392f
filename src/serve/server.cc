#include "serve/server.h"

#include "serve/server_impl.h"

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

Status Server::Impl::Bind() {
  socket_path_ = options_.socket_path.empty() ? DefaultSocketPath() : options_.socket_path;
  lease_ms_ = options_.lease_ms;
  warm_ahead_bytes_ = options_.warm_ahead_bytes;
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
      // Connections that have not said hello are bounded apart from clients, so idle sockets
      // cannot lock engines (or `kvtier status`) out.
      uint32_t pending = 0;
      for (const auto& [id, o] : conns_) pending += !o->said_hello && !o->done;
      if (!allowed || pending >= options_.max_pending) {
        const std::string why =
            allowed ? "too many connections waiting for hello (" + std::to_string(pending) +
                          ", serve.max_pending)"
                    : "uid " + std::to_string(c->peer.uid) + " not in serve.allow_uids";
        if (refused_log_.Allow()) spdlog::warn("{}: refused: {}", c->Name(), why);
        ++refused_;
        // A uid not allowed is refused for good; a full queue only for now.
        Refuse(fd, allowed ? Status::ResourceExhausted(why) : Status::InvalidArgument(why));
        continue;
      }
      c->accepted_ns = MonotonicNs();
      Conn* raw = c.get();
      raw->thread = std::thread([this, raw] { Serve(raw); });
      conns_.emplace(raw->id, std::move(c));
    }
  });
  sweeper_ = std::thread([this] { Sweep(); });
}

void Server::Impl::Refuse(int fd, const Status& why) {
  // A hello reply with the reason, so the peer says "refused: ..." rather than "no daemon";
  // best effort within 100 ms (the socket buffer takes it at once unless the peer is hostile).
  Writer w;
  w.Begin(static_cast<uint16_t>(MsgType::kHello) | kReplyBit, 0, 0);
  w.StatusField(why);
  (void)SendAll(fd, w.Finish(), MonotonicNs() + 100'000'000ull);
  close(fd);
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

void Server::Impl::Serve(Conn* c) {
  FrameHeader h;
  std::vector<std::byte> payload;
  Writer w;
  bool said_hello = false;
  std::string why;
  uint64_t hello_ns = 0, frame_ns = 0;
  {
    MutexLock lock(&mu_);
    hello_ns = uint64_t{options_.hello_timeout_ms} * 1000000;
    frame_ns = uint64_t{options_.frame_timeout_ms} * 1000000;
  }
  for (;;) {
    // Before hello: a small frame, by the hello deadline. After: any frame, whenever it starts,
    // but each whole within frame_timeout_ms.
    FrameLimits limits;
    limits.partial_timeout_ns = frame_ns;
    if (!said_hello) limits.max_payload = kMaxHelloPayload;
    Status s = RecvFrame(c->fd, said_hello ? 0 : c->accepted_ns + hello_ns, wake_fd_, &h, &payload,
                         nullptr, limits);
    if (!said_hello && s.message() == "timed out") s = Status::Unavailable("no hello in time");
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
    st = Handle(c, type, payload, &w, &said_hello, &pass_fd);
    c->said_hello = said_hello;
    if (h.flags & kFlagNoReply) continue;
    if (!st.ok()) {  // the reply is the status alone
      w.buffer().resize(body);
      w.Begin(h.type | kReplyBit, 0, h.request_id);
      w.StatusField(st);
    }
    s = SendAll(c->fd, w.Finish(), MonotonicNs() + 10'000'000'000ull,
                pass_fd && st.ok() ? host_->partition_fd(c->partition) : -1);
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

std::string Server::Impl::TenantPrometheusText() const {
  auto label = [](const std::string& v) {
    std::string out;
    for (char ch : v) {
      if (ch == '\\' || ch == '"') out += '\\';
      out += ch == '\n' ? std::string("\\n") : std::string(1, ch);
    }
    return out;
  };
  std::string held, max, reserved;
  MutexLock lock(&tenants_mu_);
  for (const auto& [name, t] : tenants_seen_) {
    if (t.partition < 0) continue;
    const std::string l = "{tenant=\"" + label(name) + "\"} ";
    const HostTier::Usage u = host_->usage(t.partition);
    const HostTier::Bounds& b = u.bounds;
    held += "kvtier_serve_tenant_arena_blocks" + l + std::to_string(u.held) + "\n";
    max += "kvtier_serve_tenant_arena_max_blocks" + l +
           std::to_string(std::min<uint64_t>(b.max_slots, host_->slots())) + "\n";
    reserved +=
        "kvtier_serve_tenant_arena_reserved_blocks" + l + std::to_string(b.reserved_slots) + "\n";
  }
  return "# TYPE kvtier_serve_tenant_arena_blocks gauge\n" + held +
         "# TYPE kvtier_serve_tenant_arena_max_blocks gauge\n" + max +
         "# TYPE kvtier_serve_tenant_arena_reserved_blocks gauge\n" + reserved;
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
  s.corrupt_blocks = corrupt_loads_.load();
  s.warm_claimed_blocks = warm_claimed_blocks_.load();
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
  warm_ahead_bytes_ = options.warm_ahead_bytes;
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
  ho.max_partitions = static_cast<int>(options.max_tenants);
  auto params = HostParamsOf(spec);
  if (!params.ok()) return params.status().WithContext("tiers[0]");
  // Partition 0 serves no client: each tenant's partition is faulted by its own writes, so
  // the socket answers at once (pre-faulting took 8.8 s for a 5.88 GiB default arena).
  ho.prefault = false;
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
std::string Server::TenantPrometheusText() const { return impl_->TenantPrometheusText(); }

}  // namespace kvtier::serve
