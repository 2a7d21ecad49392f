// Server::Impl, shared by server.cc (the socket, connections, the sweeper, reload) and
// server_handlers.cc (one handler per request type). Private to src/serve.
#ifndef KVTIER_SERVE_SERVER_IMPL_H_
#define KVTIER_SERVE_SERVER_IMPL_H_

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
#include <optional>
#include <thread>

#include <spdlog/spdlog.h>

#include "cache/cache_hooks.h"
#include "common/clock.h"
#include "common/log_limiter.h"
#include "common/mutex.h"
#include "config/tier_params.h"
#include "hash/xxh.h"
#include "kvtier/client.h"
#include "serve/socket_io.h"
#include "tiers/host/host_tier.h"

namespace kvtier::serve {

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
  uint64_t session_id = 0;
  uint64_t expires_ns = 0;
  std::vector<EngineBlockHashes> engine;  // none, or per reserved slot (KV events)
};

struct Peer {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};

class Server::Impl {
 public:
  struct Conn {
    uint64_t id = 0;
    int fd = -1;
    Peer peer;
    std::thread thread;
    std::atomic<bool> done{false};
    std::atomic<bool> said_hello{false};
    uint64_t accepted_ns = 0;
    // Set by hello.
    bool data_plane = false;
    Hello hello;
    std::string tenant;  // effective tenant: the declared name, scoped by uid when unlisted
    uint32_t tenant_tag = 0;
    int partition = 0;  // the arena partition this connection maps
    Mutex mu;           // leases and reservations: the connection's thread and the sweeper
    std::map<uint64_t, Lease> leases KVTIER_GUARDED_BY(mu);
    std::map<uint64_t, Reservation> reservations KVTIER_GUARDED_BY(mu);
    // The connection thread's own scratch, kept between requests so a long chain allocates
    // nothing: the lookup or prefetch being served (decoded once) and its reply's offsets.
    LookupReq lookup;
    std::vector<uint64_t> offsets, checksums;
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
  // The decoded c->lookup, keyed under the connection's root (in place) and looked up; the hit
  // blocks' checksums in c->checksums.
  Result<LookupResult> LookupRequest(Conn* c);
  Status OnLookup(Conn* c, Writer* w);
  Status OnLoad(Conn* c, std::span<const std::byte> in, Writer* w);
  Status OnReserve(Conn* c, std::span<const std::byte> in, Writer* w);
  // Free slots c's tenant gets next, claimed for it while it has fewer than half of
  // serve.warm_ahead: their offsets into *warm (the client faults them in).
  void ClaimAhead(const Conn& c, std::vector<uint64_t>* warm);
  Status OnCommit(Conn* c, std::span<const std::byte> in, Writer* w);
  Status OnPrefetch(Conn* c, Writer* w);
  // Offsets of lr's first n blocks, staging those below the arena into it first; from the
  // first block that cannot be staged on, kNoOffset.
  void Stage(const LookupResult& lr, uint32_t n, std::span<uint64_t> offsets);
  void EndAll(Conn* c);
  // Answers a connection refused at accept with the reason, then closes it.
  static void Refuse(int fd, const Status& why);
  // The namespace root for a request's scope; InvalidArgument when the peer may not use it.
  Result<BlockKey> RootFor(const Conn& c, const Scope& scope) const;
  // The effective tenant of a declared name: listed names are global, others per uid.
  std::string EffectiveTenant(const Conn& c, const std::string& declared) const;
  // The arena partition of c's tenant (created on first use, with its bounds).
  Result<int> PartitionFor(const Conn& c);
  Status OnDropTenant(Conn* c, std::span<const std::byte> in, Writer* w);
  Status OnRelease(Conn* c, std::span<const std::byte> in);
  // A client's report that a leased block failed its checksum: verified, then dropped.
  Status OnBadBlock(Conn* c, std::span<const std::byte> in);
  Status OnSession(std::span<const std::byte> in);
  Status OnFlush(Conn* c, Writer* w);
  // Runs one decoded request's handler; *said_hello and *pass_fd are hello's outcome.
  Status Handle(Conn* c, MsgType type, std::span<const std::byte> payload, Writer* w,
                bool* said_hello, bool* pass_fd);
  // The serve.tenants entry of a tenant name, if it is bound.
  std::optional<TenantBinding> Binding(const std::string& tenant) const;
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
  std::atomic<uint64_t> corrupt_loads_{0};
  std::atomic<uint64_t> warm_ahead_bytes_{0};
  std::atomic<uint64_t> warm_claimed_blocks_{0};  // slots claimed ahead for tenants, in all
  mutable Mutex tenants_mu_;
  struct TenantSeen {
    std::string declared;
    uid_t uid = static_cast<uid_t>(-1);  // the uid of an unlisted tenant; -1 for a listed one
    int partition = -1;
  };
  // Effective tenant -> what it is, for drop, per-uid limits and metrics.
  std::map<std::string, TenantSeen> tenants_seen_ KVTIER_GUARDED_BY(tenants_mu_);
  std::string TenantPrometheusText() const;
  LogLimiter no_revision_log_;  // clients that declare no model revision
  LogLimiter refused_log_;

  mutable Mutex mu_;  // options_ and conns_
  ServeOptions options_ KVTIER_GUARDED_BY(mu_);
  std::map<uint64_t, std::unique_ptr<Conn>> conns_ KVTIER_GUARDED_BY(mu_);
  Mutex stop_mu_;
  bool stopped_ KVTIER_GUARDED_BY(stop_mu_) = false;
};

}  // namespace kvtier::serve

#endif  // KVTIER_SERVE_SERVER_IMPL_H_
