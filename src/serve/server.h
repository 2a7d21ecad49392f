// Server: the `kvtier serve` daemon. It owns one Cache whose first tier is a shared-arena
// HostTier (a memfd that clients map), serves the protocol of doc/protocol.md on a Unix socket,
// one thread per connection, and keeps every pin and reservation as a lease of the connection
// that took it: they end when the client releases or commits them, when their lease_ms passes
// (a sweeper thread), or when the connection closes.
//
// Thread-safety: Start, Stop, Reload, Stats may be called from any thread. Ownership: the
// Server owns the Cache, the socket (unlinked on stop) and every connection.
#ifndef KVTIER_SRC_SERVE_SERVER_H_
#define KVTIER_SRC_SERVE_SERVER_H_

#include <memory>
#include <string>
#include <string_view>

#include "kvtier/cache.h"
#include "kvtier/status.h"
#include "serve/protocol.h"
#include "serve/serve_options.h"

namespace kvtier::serve {

class Server {
 public:
  // Opens the cache (tier 0 must be kind host; it is built on a memfd), binds the socket
  // (mode socket_mode, group `group`), starts the threads. InvalidArgument for bad options;
  // Unavailable when the socket path is taken by a live daemon.
  static Result<std::unique_ptr<Server>> Start(CacheOptions cache, ServeOptions options);
  ~Server();  // Stop() and join.

  // Stops accepting, lets every connection finish the request it is serving, releases leases,
  // closes the tiers. Idempotent.
  void Stop();
  // Applies what can change live (lease_ms, tenants, allow_uids, verify_commit, log); returns
  // a line per setting it could not change (socket, tiers, layout, addresses).
  std::vector<std::string> Reload(const CacheOptions& cache, const ServeOptions& options);

  const std::string& socket_path() const;
  Cache& cache();
  ServeCounters counters() const;
  // Per tenant: arena blocks held, its max and reserved blocks. Prometheus text.
  std::string TenantPrometheusText() const;

  class Impl;

 private:
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// 32 bits naming a tenant inside its internal keys (XXH3-64 of the name, low half).
uint32_t TenantTag(std::string_view tenant);

// The namespace-bound key a daemon stores for a client's chain key: the client's key mixed
// with the connection's root, so a chain hashed under another tenant's root cannot name that
// tenant's blocks. The upper 32 bits of lo are the tenant's tag: `drop --tenant` finds a
// tenant's blocks by it.
BlockKey InternalKey(const BlockKey& client_key, const BlockKey& root, uint32_t tenant_tag);

// Whether an internal key carries tenant_tag.
inline bool HasTenantTag(const BlockKey& internal_key, uint32_t tenant_tag) {
  return static_cast<uint32_t>(internal_key.lo >> 32) == tenant_tag;
}

}  // namespace kvtier::serve

#endif  // KVTIER_SRC_SERVE_SERVER_H_
