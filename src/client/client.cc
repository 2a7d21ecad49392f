#include "kvtier/client.h"

#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <thread>

#include <spdlog/spdlog.h>

#include "common/arena.h"
#include "common/clock.h"
#include "common/copy.h"
#include "common/mutex.h"
#include "serve/protocol.h"
#include "serve/socket_io.h"

namespace kvtier {

using serve::Reader;
using serve::Writer;

std::string DefaultSocketPath() {
  const char* xdg = std::getenv("XDG_RUNTIME_DIR");
  if (xdg && *xdg) return std::string(xdg) + "/kvtier/kvtier.sock";
  return "/run/kvtier/kvtier.sock";
}

Status ClientOptions::Validate() const {
  if (!(layout == KvLayout{})) KVTIER_RETURN_IF_ERROR(layout.Validate().WithContext("layout"));
  if (timeout_ms < 1 || timeout_ms > 600000)
    return Status::InvalidArgument("timeout_ms: must be in 1..600000, got " +
                                   std::to_string(timeout_ms));
  if (reconnect_ms < 10 || reconnect_ms > 60000)
    return Status::InvalidArgument("reconnect_ms: must be in 10..60000, got " +
                                   std::to_string(reconnect_ms));
  return Status::Ok();
}

namespace {

// One live connection.
struct Conn {
  int fd = -1;
  uint64_t generation = 0;
  std::shared_ptr<Arena> arena;
  serve::HelloReply hello;
};

}  // namespace

class Client::Impl {
 public:
  explicit Impl(ClientOptions o) : opt_(std::move(o)) {
    if (opt_.socket_path.empty()) opt_.socket_path = DefaultSocketPath();
    data_plane_ = !(opt_.layout == KvLayout{});
  }

  // Connects and says hello within the deadline. Refusals (InvalidArgument) are not retried
  // quietly: Open reports them.
  Result<Conn> Dial() {
    const uint64_t deadline = MonotonicNs() + uint64_t{opt_.timeout_ms} * 1000000;
    KVTIER_ASSIGN_OR_RETURN(int fd, serve::ConnectUnix(opt_.socket_path));
    Conn c;
    c.fd = fd;
    auto fail = [&](Status s) {
      close(fd);
      return s;
    };
    serve::Hello h;
    h.layout = opt_.layout;
    h.model_id = opt_.model_id;
    h.model_revision = opt_.model_revision;
    h.tenant = opt_.tenant;
    h.lora_id = opt_.lora_id;
    h.token = opt_.token;
    Writer w;
    w.Begin(static_cast<uint16_t>(serve::MsgType::kHello), 0, 1);
    serve::EncodeHello(h, &w);
    const Status sent = serve::SendAll(fd, w.Finish(), deadline);
    serve::FrameHeader fh;
    std::vector<std::byte> payload;
    int arena_fd = -1;
    // A daemon that refuses at accept answers before our hello and closes: its reason may be
    // waiting even when the send failed.
    Status s = serve::RecvFrame(
        fd, sent.ok() ? deadline : std::min<uint64_t>(deadline, MonotonicNs() + 100'000'000ull), -1,
        &fh, &payload, &arena_fd);
    if (!s.ok() && !sent.ok()) return fail(sent);
    if (!s.ok()) return fail(Status::Unavailable(opt_.socket_path + ": hello: " + s.message()));
    Reader r(payload);
    Status remote;
    if (!r.StatusField(&remote)) {
      if (arena_fd >= 0) close(arena_fd);
      return fail(Status::InvalidArgument(opt_.socket_path + ": malformed hello reply"));
    }
    if (!remote.ok() && remote.code() == StatusCode::kResourceExhausted) {
      // Full for now (clients, connections waiting for hello): worth trying again later.
      if (arena_fd >= 0) close(arena_fd);
      return fail(Status::ResourceExhausted(
          opt_.socket_path + ": daemon refused the connection: " + remote.message()));
    }
    if (!remote.ok()) {
      if (arena_fd >= 0) close(arena_fd);
      return fail(Status::InvalidArgument(
          opt_.socket_path + ": daemon refused hello: " + remote.message() +
          " (client protocol version " + std::to_string(serve::kProtocolVersion) + ")"));
    }
    s = serve::DecodeHelloReply(&r, &c.hello);
    if (!s.ok()) {
      if (arena_fd >= 0) close(arena_fd);
      return fail(s);
    }
    if (c.hello.version != serve::kProtocolVersion) {
      if (arena_fd >= 0) close(arena_fd);
      return fail(Status::InvalidArgument("protocol version mismatch: this client speaks version " +
                                          std::to_string(serve::kProtocolVersion) +
                                          ", the daemon speaks version " +
                                          std::to_string(c.hello.version)));
    }
    if (data_plane_) {
      if (arena_fd < 0) return fail(Status::Unavailable("hello reply carried no arena"));
      auto arena = MapArena(arena_fd, c.hello.arena_bytes);
      close(arena_fd);
      if (!arena.ok()) return fail(arena.status());
      c.arena = std::move(arena).value();
    } else if (arena_fd >= 0) {
      close(arena_fd);
    }
    return c;
  }

  void Install(Conn c) {
    MutexLock lock(&mu_);
    c.generation = ++generation_;
    lease_ms_ = c.hello.lease_ms;
    events_ = c.hello.events;
    conn_ = std::move(c);
    connected_ = true;
    ++connects_;
    Warm(conn_.arena, conn_.hello.warm);
  }

  // Drops the connection (caller holds mu_): its leases are gone with it.
  void DropLocked() KVTIER_REQUIRES(mu_) {
    if (conn_.fd < 0) return;
    close(conn_.fd);
    conn_.fd = -1;
    conn_.arena.reset();
    ++generation_;
    connected_ = false;
    ++disconnects_;
    cv_.SignalAll();
  }

  // The daemon's slots this client writes next: faulted in ahead (pinned, they are already).
  void Warm(const std::shared_ptr<Arena>& arena, std::span<const uint64_t> offsets) {
    if (arena && !arena->pinned) warmer_.Add(arena, offsets, opt_.layout.bytes_per_block());
  }

  void StartReconnector() {
    reconnector_ = std::thread([this] {
      for (;;) {
        {
          MutexLock lk(&wait_mu_);
          if (closing_) break;
          (void)cv_.WaitFor(&wait_mu_, std::chrono::milliseconds(opt_.reconnect_ms));
          if (closing_) break;
        }
        if (connected_) continue;
        auto c = Dial();
        if (c.ok()) {
          Install(std::move(c).value());
          spdlog::info("kvtier client: connected to {}", opt_.socket_path);
        }
      }
    });
  }

  void Shutdown() {
    {
      MutexLock lk(&wait_mu_);
      closing_ = true;
    }
    cv_.SignalAll();
    if (reconnector_.joinable()) reconnector_.join();
    MutexLock lock(&mu_);
    DropLocked();
  }

  // One request and its reply on the connection, within the call's deadline. Unavailable
  // (the connection is then dropped) when the daemon is gone or too slow; the daemon's error
  // when it answered with one. *gen gets the generation the call used.
  Status Call(serve::MsgType type, const std::function<void(Writer*)>& body,
              std::vector<std::byte>* reply, uint64_t* gen = nullptr,
              std::shared_ptr<Arena>* arena = nullptr, bool one_way = false,
              uint64_t only_gen = 0) {
    const uint64_t deadline = MonotonicNs() + uint64_t{opt_.timeout_ms} * 1000000;
    thread_local Writer w;
    const uint32_t id = ++request_id_;
    w.Begin(static_cast<uint16_t>(type), one_way ? serve::kFlagNoReply : 0, id);
    body(&w);
    MutexLock lock(&mu_);
    if (conn_.fd < 0) return Status::Unavailable("not connected to " + opt_.socket_path);
    if (only_gen != 0 && only_gen != conn_.generation)
      return Status::Unavailable("connection changed");
    if (gen) *gen = conn_.generation;
    if (arena) *arena = conn_.arena;
    Status s = serve::SendAll(conn_.fd, w.Finish(), deadline);
    if (s.ok() && !one_way) {
      serve::FrameHeader h;
      s = serve::RecvFrame(conn_.fd, deadline, -1, &h, reply, nullptr);
      if (s.ok() &&
          (h.request_id != id || h.type != (static_cast<uint16_t>(type) | serve::kReplyBit)))
        s = Status::Unavailable("reply out of order");
    }
    if (!s.ok()) {
      if (s.message().find("timed out") != std::string::npos) ++timeouts_;
      spdlog::warn("kvtier client: {} to {}: {}; reconnecting in the background",
                   serve::MsgTypeName(static_cast<uint16_t>(type)), opt_.socket_path, s.message());
      DropLocked();
      return Status::Unavailable(s.message());
    }
    return Status::Ok();
  }

  // Reads a reply's leading status.
  static Status ReplyStatus(Reader* r) {
    Status st;
    if (!r->StatusField(&st)) return Status::Unavailable("malformed reply");
    return st;
  }

  BlockKey Root(const RequestOptions& rq) const {
    Namespace ns{opt_.model_id, opt_.model_revision, opt_.layout.fingerprint(),
                 rq.tenant.empty() ? opt_.tenant : rq.tenant,
                 rq.lora_id.empty() ? opt_.lora_id : rq.lora_id};
    return ns.Root();
  }

  ClientOptions opt_;
  bool data_plane_ = false;
  Mutex mu_;  // the connection: one request in flight
  Conn conn_ KVTIER_GUARDED_BY(mu_);
  uint64_t generation_ KVTIER_GUARDED_BY(mu_) = 0;
  std::atomic<uint32_t> request_id_{0};
  std::atomic<uint32_t> lease_ms_{0};
  std::atomic<bool> events_{false};  // the daemon publishes KV events (engine hashes wanted)
  uint32_t conn_lease_ms() const { return lease_ms_; }
  std::atomic<bool> connected_{false};
  std::atomic<uint64_t> connects_{0}, disconnects_{0}, timeouts_{0}, missed_lookups_{0},
      dropped_stores_{0}, dropped_blocks_{0}, expired_loads_{0}, corrupt_blocks_{0};
  Mutex wait_mu_;  // a leaf: never held with mu_
  CondVar cv_;     // the connection dropped, or closing (waited on under wait_mu_)
  bool closing_ KVTIER_GUARDED_BY(wait_mu_) = false;
  std::thread reconnector_;
  ArenaWarmer warmer_;  // last: stopped first, while the rest is still there
};

namespace {

// A lookup's lease, behind the public PinHandle: releasing it tells the daemon (one-way).
struct LeaseHolder final : PinHandle::Holder {
  std::weak_ptr<Client::Impl> client;
  uint64_t generation = 0;
  uint64_t lease_id = 0;
  uint64_t expires_ns = 0;  // this side's view of the lease, with margin
  std::shared_ptr<Arena> arena;
  std::vector<uint64_t> offsets;
  std::vector<uint64_t> checksums;  // recorded at commit; what Load checks the bytes against
  ~LeaseHolder() override {
    auto c = client.lock();
    if (!c || lease_id == 0) return;
    (void)c->Call(
        serve::MsgType::kRelease, [&](Writer* w) { w->U64(lease_id); }, nullptr, nullptr, nullptr,
        /*one_way=*/true, generation);
  }
};

// Load's and LoadVisit's one path: blocks [first, first + n) of lookup's lease, those on SSD or
// Redis staged into the arena by the daemon first, each handed to deliver(i, bytes in the
// arena), which returns the bytes' Checksum64. A block whose checksum differs from its commit's
// is a miss from there on, and the daemon is told so it drops it.
Result<LoadResult> LoadFromArena(
    Client::Impl& impl, const LookupResult& lookup, uint32_t first, uint32_t n, uint64_t bb,
    const std::function<uint64_t(uint32_t, const std::byte*)>& deliver) {
  LoadResult r;
  r.block_status.assign(n, Status::Ok());
  if (n == 0) return r;
  auto* h = dynamic_cast<LeaseHolder*>(lookup.pins.holder());
  auto refuse = [&](const std::string& why) {
    ++impl.expired_loads_;
    for (auto& s : r.block_status) s = Status::Unavailable(why);
    return r;
  };
  if (!h || !h->arena) return refuse("Load: the lookup holds no lease");
  if (MonotonicNs() >= h->expires_ns) return refuse("Load: the lease expired");
  // Block i here is block first + i of the lease.
  const uint64_t* offsets = h->offsets.data() + first;
  const uint64_t* checksums = h->checksums.data() + first;
  bool missing = false;
  for (uint32_t i = 0; i < n; ++i) missing |= offsets[i] == serve::kNoOffset;
  if (missing) {
    // Blocks on SSD or Redis: the daemon stages them into the arena first.
    std::vector<std::byte> reply;
    Status s = impl.Call(
        serve::MsgType::kLoad,
        [&](Writer* w) {
          w->U64(h->lease_id);
          w->U32(first + n);
        },
        &reply, nullptr, nullptr, false, h->generation);
    serve::LoadReply lr;
    if (s.ok()) {
      Reader rd(reply);
      s = Client::Impl::ReplyStatus(&rd);
      if (s.ok()) s = serve::DecodeLoadReply(&rd, &lr);
    }
    if (!s.ok()) return refuse("Load: " + s.message());
    for (uint32_t i = first; i < first + n && i < lr.offsets.size(); ++i) {
      h->offsets[i] = lr.offsets[i];
      h->checksums[i] = lr.checksums[i];
    }
    if (MonotonicNs() >= h->expires_ns) return refuse("Load: the lease expired while staging");
  }
  for (uint32_t i = 0; i < n; ++i) {
    const uint64_t off = offsets[i];
    if (off == serve::kNoOffset || off + bb > h->arena->bytes) {
      for (uint32_t j = i; j < n; ++j)
        r.block_status[j] = Status::NotFound("block " + lookup.keys[first + j].ToHex() +
                                             " could not be staged into the arena");
      break;
    }
    const uint64_t sum = deliver(i, h->arena->base + off);
    if (checksums[i] != 0 && sum != checksums[i]) {
      ++impl.corrupt_blocks_;
      for (uint32_t j = i; j < n; ++j)
        r.block_status[j] = Status::Corruption("block " + lookup.keys[first + i].ToHex() +
                                               " changed in the arena since its commit");
      (void)impl.Call(
          serve::MsgType::kBadBlock,
          [&](Writer* w) {
            w->U64(h->lease_id);
            w->U32(first + i);
          },
          nullptr, nullptr, nullptr, /*one_way=*/true, h->generation);
      break;
    }
    r.loaded_blocks = i + 1;
    r.bytes += bb;
  }
  return r;
}

}  // namespace

Result<std::unique_ptr<Client>> Client::Open(ClientOptions options) {
  KVTIER_RETURN_IF_ERROR(options.Validate());
  auto impl = std::make_shared<Impl>(std::move(options));
  auto c = impl->Dial();
  if (c.ok()) {
    impl->Install(std::move(c).value());
  } else if (c.status().code() == StatusCode::kInvalidArgument ||
             (c.status().code() == StatusCode::kResourceExhausted && !impl->data_plane_)) {
    // Refused for good, or an operator command (kvtier status) that wants its answer now.
    return c.status();
  } else {
    spdlog::warn("kvtier client: {}; will keep trying", c.status().message());
  }
  impl->StartReconnector();
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

Client::Client(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() { impl_->Shutdown(); }

const KvLayout& Client::layout() const { return impl_->opt_.layout; }

std::unique_ptr<KvCache> Client::OpenStoreLane() const {
  if (!impl_->data_plane_) return nullptr;
  auto c = Client::Open(impl_->opt_);
  if (!c.ok()) return nullptr;  // refused for good: this client would be too
  return std::move(c).value();
}
BlockKey Client::Root(const RequestOptions& request) const { return impl_->Root(request); }
bool Client::connected() const { return impl_->connected_; }

Status Client::WaitConnected(uint32_t timeout_ms) const {
  const uint64_t deadline = MonotonicNs() + uint64_t{timeout_ms} * 1000000;
  while (!impl_->connected_) {
    if (MonotonicNs() >= deadline)
      return Status::Unavailable("not connected to " + impl_->opt_.socket_path + " after " +
                                 std::to_string(timeout_ms) + " ms");
    MutexLock lk(&impl_->wait_mu_);
    (void)impl_->cv_.WaitFor(&impl_->wait_mu_, std::chrono::milliseconds(5));
  }
  return Status::Ok();
}

ClientStats Client::client_stats() const {
  ClientStats s;
  s.connected = impl_->connected_;
  s.connects = impl_->connects_;
  s.disconnects = impl_->disconnects_;
  s.timeouts = impl_->timeouts_;
  s.missed_lookups = impl_->missed_lookups_;
  s.dropped_stores = impl_->dropped_stores_;
  s.dropped_blocks = impl_->dropped_blocks_;
  s.expired_loads = impl_->expired_loads_;
  s.warmed_bytes = impl_->warmer_.warmed_bytes();
  s.corrupt_blocks = impl_->corrupt_blocks_;
  return s;
}

Result<LookupResult> Client::LookupKeys(std::span<const BlockKey> keys,
                                        const RequestOptions& request) {
  if (!impl_->data_plane_) return Status::InvalidArgument("Lookup: an operator client (no layout)");
  LookupResult r;
  r.block_tokens = impl_->opt_.layout.block_tokens;
  r.keys.assign(keys.begin(), keys.end());
  const uint64_t t0 = MonotonicNs();
  std::vector<std::byte> reply;
  uint64_t gen = 0;
  std::shared_ptr<Arena> arena;
  Status s = impl_->Call(
      serve::MsgType::kLookup,
      [&](Writer* w) {
        serve::EncodeKeyLookup(request.tenant, request.lora_id, request.session_id, keys, w);
      },
      &reply, &gen, &arena);
  serve::LookupReply lr;
  if (s.ok()) {
    Reader rd(reply);
    s = Impl::ReplyStatus(&rd);
    if (s.ok()) s = serve::DecodeLookupReply(&rd, &lr);
  }
  if (s.code() == StatusCode::kInvalidArgument) return s;  // the daemon refused the request
  if (!s.ok() || lr.total_blocks != keys.size()) {
    ++impl_->missed_lookups_;
    return r;  // a miss
  }
  r.hit_blocks = static_cast<uint32_t>(lr.source.size());
  r.source = std::move(lr.source);
  for (int8_t src : r.source)
    if (src >= 0 && src < kMaxTiers) ++r.blocks_by_tier[src];
  if (lr.lease_id != 0) {
    auto h = std::make_unique<LeaseHolder>();
    h->client = impl_;
    h->generation = gen;
    h->lease_id = lr.lease_id;
    h->arena = std::move(arena);
    h->offsets = std::move(lr.offsets);
    h->checksums = std::move(lr.checksums);
    // Expire on this side first: a copy must finish before the daemon may reuse the slot.
    const uint64_t lease_ns = uint64_t{impl_->conn_lease_ms()} * 1000000;
    h->expires_ns = t0 + lease_ns - lease_ns / 4;
    r.pins = PinHandle(std::move(h));
  }
  return r;
}

Result<LoadResult> Client::Load(const LookupResult& lookup, uint32_t first,
                                std::span<const MutableBlock> dst) {
  const uint64_t bb = impl_->opt_.layout.bytes_per_block();
  if (uint64_t{first} + dst.size() > lookup.hit_blocks)
    return Status::InvalidArgument("Load: blocks " + std::to_string(first) + ".." +
                                   std::to_string(first + dst.size()) + " asked of a lookup of " +
                                   std::to_string(lookup.hit_blocks) + " hit blocks");
  for (size_t i = 0; i < dst.size(); ++i)
    if (dst[i].size() != bb)
      return Status::InvalidArgument("Load: buffer " + std::to_string(i) + " has " +
                                     std::to_string(dst[i].size()) + " bytes, a block has " +
                                     std::to_string(bb));
  // Checked in the copy's pass (bytes zeroed, punched or overwritten since their commit).
  return LoadFromArena(
      *impl_, lookup, first, static_cast<uint32_t>(dst.size()), bb,
      [&](uint32_t i, const std::byte* src) { return CopyBlockChecksum(dst[i].data(), src, bb); });
}

Result<LoadResult> Client::LoadVisit(const LookupResult& lookup, uint32_t first, uint32_t n,
                                     std::span<const MutableBlock> scratch,
                                     const BlockVisitor& visit) {
  if (Status s = CheckVisit(lookup, first, n, scratch); !s.ok()) return s;
  const uint64_t bb = impl_->opt_.layout.bytes_per_block();
  // Lent from the arena: the engine's copy is the only one. The block is checked right after
  // it, while its bytes are still in cache; a block changed under the copy fails (the engine
  // recomputes what it was handed past loaded_blocks).
  return LoadFromArena(*impl_, lookup, first, n, bb, [&](uint32_t i, const std::byte* src) {
    visit(i, ConstBlock(src, bb));
    return Checksum64(std::span<const std::byte>(src, bb));
  });
}

Result<StoreResult> Client::StoreKeys(std::span<const BlockKey> keys,
                                      std::span<const ConstBlock> blocks, uint32_t first_block,
                                      const RequestOptions& request) {
  if (!impl_->data_plane_) return Status::InvalidArgument("Store: an operator client (no layout)");
  const uint64_t bb = impl_->opt_.layout.bytes_per_block();
  if (keys.size() != blocks.size())
    return Status::InvalidArgument("Store: " + std::to_string(keys.size()) + " keys but " +
                                   std::to_string(blocks.size()) + " blocks");
  for (size_t i = 0; i < blocks.size(); ++i)
    if (blocks[i].size() != bb)
      return Status::InvalidArgument("Store: block " + std::to_string(i) + " has " +
                                     std::to_string(blocks[i].size()) + " bytes, the layout's " +
                                     "block has " + std::to_string(bb));
  if (!request.engine_hashes.empty() && request.engine_hashes.size() != keys.size())
    return Status::InvalidArgument("Store: " + std::to_string(request.engine_hashes.size()) +
                                   " engine hash entries for " + std::to_string(keys.size()) +
                                   " blocks");
  StoreResult r;
  if (keys.empty()) return r;
  auto dropped = [&](const Status& why) {
    ++impl_->dropped_stores_;
    impl_->dropped_blocks_ += keys.size();
    StoreResult d;
    d.failed_blocks = static_cast<uint32_t>(keys.size());
    d.first_error = why;
    return d;
  };
  std::vector<std::byte> reply;
  uint64_t gen = 0;
  std::shared_ptr<Arena> arena;
  Status s = impl_->Call(
      serve::MsgType::kReserve,
      [&](Writer* w) {
        serve::ReserveReq rq;
        rq.scope = serve::Scope{request.tenant, request.lora_id};
        rq.session_id = request.session_id;
        rq.first_block = first_block;
        rq.keys.assign(keys.begin(), keys.end());
        // The hashes travel only to a daemon that publishes.
        serve::EncodeReserve(
            rq, impl_->events_ ? request.engine_hashes : std::span<const EngineBlockHashes>{}, w);
      },
      &reply, &gen, &arena);
  serve::ReserveReply rr;
  if (s.ok()) {
    Reader rd(reply);
    s = Impl::ReplyStatus(&rd);
    if (s.ok()) s = serve::DecodeReserveReply(&rd, &rr);
    if (s.ok()) impl_->Warm(arena, rr.warm);
  }
  if (s.code() == StatusCode::kInvalidArgument) return s;
  if (!s.ok() || rr.state.size() != keys.size())
    return dropped(s.ok() ? Status::Unavailable("bad reply") : s);
  serve::CommitReq commit;
  commit.reservation_id = rr.reservation_id;
  for (size_t i = 0; i < keys.size(); ++i) {
    const auto st = static_cast<serve::SlotState>(rr.state[i]);
    if (st == serve::SlotState::kPresent) {
      ++r.present_blocks;
    } else if (st == serve::SlotState::kNoRoom) {
      ++r.failed_blocks;
      if (r.first_error.ok())
        r.first_error =
            Status::ResourceExhausted("the daemon's arena has no room (the rest pinned)");
    } else {
      const uint64_t off = rr.offsets[i];
      const bool fits = arena && off + bb <= arena->bytes;
      commit.written.push_back(fits ? 1 : 0);
      commit.checksums.push_back(fits ? CopyBlockChecksum(arena->base + off, blocks[i].data(), bb)
                                      : 0);
    }
  }
  if (commit.reservation_id == 0) return r;
  s = impl_->Call(
      serve::MsgType::kCommit, [&](Writer* w) { serve::EncodeCommit(commit, w); }, &reply, nullptr,
      nullptr, false, gen);
  serve::CommitReply cr;
  if (s.ok()) {
    Reader rd(reply);
    s = Impl::ReplyStatus(&rd);
    if (s.ok()) s = serve::DecodeCommitReply(&rd, &cr);
  }
  if (!s.ok()) return dropped(s);
  r.stored_blocks += cr.stored;
  r.present_blocks += cr.present;
  r.failed_blocks += cr.failed;
  if (r.first_error.ok()) r.first_error = cr.first_error;
  return r;
}

Result<uint32_t> Client::Prefetch(std::span<const TokenId> tokens, const RequestOptions& request) {
  if (!impl_->data_plane_)
    return Status::InvalidArgument("Prefetch: an operator client (no layout)");
  std::vector<BlockKey> keys;
  HashPrefix(impl_->Root(request), impl_->opt_.layout.block_tokens, tokens, &keys);
  std::vector<std::byte> reply;
  Status s = impl_->Call(
      serve::MsgType::kPrefetch,
      [&](Writer* w) {
        serve::EncodeKeyLookup(request.tenant, request.lora_id, request.session_id, keys, w);
      },
      &reply);
  uint32_t staged = 0;
  if (s.ok()) {
    Reader rd(reply);
    s = Impl::ReplyStatus(&rd);
    if (s.ok()) {
      rd.U32(&staged);
      s = rd.Done("prefetch reply");
    }
  }
  if (s.code() == StatusCode::kInvalidArgument) return s;
  return s.ok() ? staged : 0u;
}

bool Client::WantsEngineHashes() const { return impl_->events_; }

void Client::NoteDeclined(std::span<const uint32_t> blocks_by_tier) {
  (void)impl_->Call(
      serve::MsgType::kDeclined, [&](Writer* w) { serve::EncodeDeclined(blocks_by_tier, w); },
      nullptr, nullptr, nullptr, /*one_way=*/true);
}

void Client::NotifySession(uint64_t session_id, SessionEvent event) {
  (void)impl_->Call(
      serve::MsgType::kSession,
      [&](Writer* w) {
        w->U64(session_id);
        w->U8(static_cast<uint8_t>(event));
      },
      nullptr, nullptr, nullptr, /*one_way=*/true);
}

Result<DaemonStatus> Client::GetDaemonStatus() {
  std::vector<std::byte> reply;
  KVTIER_RETURN_IF_ERROR(impl_->Call(
      serve::MsgType::kStats, [](Writer*) {}, &reply));
  Reader rd(reply);
  KVTIER_RETURN_IF_ERROR(Impl::ReplyStatus(&rd));
  DaemonStatus d;
  KVTIER_RETURN_IF_ERROR(serve::DecodeStatsReply(&rd, &d.cache, &d));
  return d;
}

CacheStats Client::stats() const {
  auto d = const_cast<Client*>(this)->GetDaemonStatus();
  return d.ok() ? d->cache : CacheStats{};
}

Status Client::Ping() {
  std::vector<std::byte> reply;
  KVTIER_RETURN_IF_ERROR(impl_->Call(
      serve::MsgType::kPing, [](Writer*) {}, &reply));
  Reader rd(reply);
  return Impl::ReplyStatus(&rd);
}

Result<uint64_t> Client::DropAll() {
  std::vector<std::byte> reply;
  KVTIER_RETURN_IF_ERROR(impl_->Call(
      serve::MsgType::kFlush, [](Writer*) {}, &reply));
  Reader rd(reply);
  KVTIER_RETURN_IF_ERROR(Impl::ReplyStatus(&rd));
  uint64_t n = 0;
  rd.U64(&n);
  KVTIER_RETURN_IF_ERROR(rd.Done("flush reply"));
  return n;
}

Result<DropTenantResult> Client::DropTenant(std::string_view tenant) {
  std::vector<std::byte> reply;
  KVTIER_RETURN_IF_ERROR(impl_->Call(
      serve::MsgType::kDropTenant, [&](Writer* w) { serve::EncodeDropTenant(tenant, w); }, &reply));
  Reader rd(reply);
  KVTIER_RETURN_IF_ERROR(Impl::ReplyStatus(&rd));
  serve::DropTenantReply r;
  KVTIER_RETURN_IF_ERROR(serve::DecodeDropTenantReply(&rd, &r));
  return DropTenantResult{r.dropped, r.pinned};
}

}  // namespace kvtier
