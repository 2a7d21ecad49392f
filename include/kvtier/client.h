// Client: a KvCache served by the node's `kvtier serve` daemon (doc/serve.md).
//
// Same calls and results as the in-process Cache (kv_cache.h). Control calls go over the
// daemon's Unix socket (doc/protocol.md); block bytes do not: the client maps the daemon's
// host arena and copies blocks in and out of it itself.
//
// Never blocks an engine for ever: every call has a deadline (timeout_ms). When the daemon is
// down, restarting or stalled past the deadline, the call becomes a miss (Lookup: 0 hits; Load:
// 0 blocks; Store: dropped, counted in client_stats()) and the client reconnects in the
// background. A lookup's pins are a lease of the connection: they end when released, when the
// daemon's lease_ms passes, or when the connection is lost (then Load delivers nothing).
//
// Thread-safety: every method may be called concurrently (control calls share one connection
// and take turns; copies run in parallel). Ownership: a LookupResult's pins should be released
// before the Client; releasing them later is harmless.
#ifndef KVTIER_CLIENT_H_
#define KVTIER_CLIENT_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "kvtier/kv_cache.h"
#include "kvtier/layout.h"
#include "kvtier/status.h"

namespace kvtier {

// $XDG_RUNTIME_DIR/kvtier/kvtier.sock when XDG_RUNTIME_DIR is set, else /run/kvtier/kvtier.sock.
std::string DefaultSocketPath();

struct ClientOptions {
  std::string socket_path;  // empty = DefaultSocketPath()
  // The engine's block shape; it must equal the daemon's. All zero = an operator connection
  // (stats, ping, flush: no data plane).
  KvLayout layout{};
  std::string model_id = "default";
  std::string model_revision;
  std::string tenant;  // the connection's tenant; the daemon may bind it to a uid or token
  std::string lora_id;
  std::string token;            // proves a token-bound tenant
  uint32_t timeout_ms = 1000;   // deadline of every call, 1..600000
  uint32_t reconnect_ms = 100;  // background reconnect period, 10..60000
  // OK, or InvalidArgument naming the field.
  Status Validate() const;
};

// What the client itself saw (not the daemon's figures).
struct ClientStats {
  bool connected = false;
  uint64_t connects = 0;        // successful hellos, the first included
  uint64_t disconnects = 0;     // connections lost (daemon died, timed out, refused)
  uint64_t timeouts = 0;        // calls that ran past their deadline
  uint64_t missed_lookups = 0;  // lookups answered 0 hits for want of a daemon
  uint64_t dropped_stores = 0;  // Store calls dropped for want of a daemon
  uint64_t dropped_blocks = 0;
  uint64_t expired_loads = 0;   // Loads refused: lease lost or expired
  uint64_t corrupt_blocks = 0;  // blocks whose arena bytes failed their checksum (recomputed)
  // Arena bytes faulted in ahead of this client's stores (serve.warm_ahead), in the background.
  uint64_t warmed_bytes = 0;
};

// The daemon's own counters, beside its cache's (the stats schema, src/obs/stats_schema.h).
struct ServeCounters {
  uint64_t pid = 0;
  uint64_t clients = 0;              // connections now
  uint64_t leases = 0;               // pinned lookups now
  uint64_t reservations = 0;         // stores between reserve and commit now
  uint64_t refused = 0;              // hellos refused (version, layout, credentials)
  uint64_t disconnects = 0;          // connections closed for a protocol error
  uint64_t corrupt_blocks = 0;       // blocks clients reported corrupt that the daemon dropped
  uint64_t warm_claimed_blocks = 0;  // free slots claimed ahead for tenants (serve.warm_ahead)
};

// The daemon's view: its own counters and its cache's stats (kvtier status).
struct DaemonStatus : ServeCounters {
  CacheStats cache;
};

// What `drop --tenant` did.
struct DropTenantResult {
  uint64_t dropped_blocks = 0;  // dropped from every tier that held them
  uint64_t pinned_blocks = 0;   // kept in the arena because a lease pins them (retry later)
};

class Client final : public KvCache {
 public:
  // InvalidArgument for bad options, or when the daemon answers but refuses this client
  // (protocol version, layout, tenant credentials: the message names both sides). A daemon
  // that is not there is no error: the client starts disconnected and keeps trying.
  static Result<std::unique_ptr<Client>> Open(ClientOptions options);
  ~Client() override;
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  const KvLayout& layout() const override;
  BlockKey Root(const RequestOptions& request = {}) const override;
  Result<LookupResult> LookupKeys(std::span<const BlockKey> keys,
                                  const RequestOptions& request = {}) override;
  using KvCache::Load;
  Result<LoadResult> Load(const LookupResult& lookup, uint32_t first,
                          std::span<const MutableBlock> dst) override;
  // Lends each block where it lies in the shared arena (scratch is not used) and checks its
  // checksum right after visit returns: a block changed under the engine's copy fails, with
  // every block after it, though visit saw it.
  Result<LoadResult> LoadVisit(const LookupResult& lookup, uint32_t first, uint32_t n,
                               std::span<const MutableBlock> scratch,
                               const BlockVisitor& visit) override;
  Result<StoreResult> StoreKeys(std::span<const BlockKey> keys, std::span<const ConstBlock> blocks,
                                uint32_t first_block = 0,
                                const RequestOptions& request = {}) override;
  void NotifySession(uint64_t session_id, SessionEvent event) override;
  // One-way: dropped while disconnected.
  void NoteDeclined(std::span<const uint32_t> blocks_by_tier) override;
  // The daemon publishes KV events (it said so at connect): Store's engine hashes travel.
  bool WantsEngineHashes() const override;
  // The daemon's cache stats; empty when it cannot be reached.
  CacheStats stats() const override;
  // A Client of its own (same options, its own connection): calls on one connection take
  // turns, so a store thread at SCHED_IDLE holding it would hold up this client's lookups for
  // as long as busy CPUs starve it. Its client_stats() are its own.
  std::unique_ptr<KvCache> OpenStoreLane() const override;

  // Brings the cached prefix of tokens up into the daemon's arena ahead of its request (an
  // agent whose tool call is about to return): blocks on SSD or Redis are staged, nothing is
  // pinned. Returns how many leading blocks are now in the arena; 0 without a daemon.
  Result<uint32_t> Prefetch(std::span<const TokenId> tokens, const RequestOptions& request = {});

  bool connected() const;
  // Waits up to timeout_ms for a connection; OK when connected.
  Status WaitConnected(uint32_t timeout_ms) const;
  ClientStats client_stats() const;
  // One empty round trip (the control plane's floor). Unavailable when not connected.
  Status Ping();
  Result<DaemonStatus> GetDaemonStatus();
  // Drops every unpinned block of the daemon's memory tiers; returns how many.
  Result<uint64_t> DropAll();
  // Drops every block of `tenant`'s namespaces (any model, LoRA) that the daemon has indexed,
  // from every tier, with removal events. The daemon's own uid or root only (InvalidArgument
  // otherwise). See doc/serve.md for what an index that restarted does not know.
  Result<DropTenantResult> DropTenant(std::string_view tenant);

  class Impl;

 private:
  explicit Client(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

}  // namespace kvtier

#endif  // KVTIER_CLIENT_H_
