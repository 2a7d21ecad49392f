// ServeOptions: the daemon's own settings, the `serve:` section of the YAML config (see
// doc/config.md). Read apart from the cache's keys.
//
// Thread-safety: a value type.
#ifndef KVTIER_SRC_SERVE_SERVE_OPTIONS_H_
#define KVTIER_SRC_SERVE_SERVE_OPTIONS_H_

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/cache.h"
#include "kvtier/status.h"

namespace kvtier::serve {

// A tenant name that only some peers may declare: those whose uid is listed, or that present
// the token. A tenant not listed is scoped by uid: peers of different uids that declare the same
// unlisted name are two tenants. max_share and reserved_share bound the tenant's part of the
// arena (tier 0): it never holds more than max_share, and others' stores never evict it below
// reserved_share.
struct TenantBinding {
  std::string name;
  std::vector<uint32_t> uids;
  std::string token;
  double max_share = 1.0;
  double reserved_share = 0.0;
};

struct ServeOptions {
  std::string socket_path;  // empty = DefaultSocketPath()
  std::string group;        // socket group (name or gid); empty = the daemon's
  uint32_t socket_mode = 0660;
  std::vector<uint32_t> allow_uids;  // SO_PEERCRED check; empty = any peer that can connect
  uint32_t lease_ms = 30000;         // pins and reservations not renewed by then are dropped
  std::string metrics_addr;          // HOST:PORT for GET /metrics; empty = off
  std::string events_addr;           // ZeroMQ PUB endpoint for KV events; empty = off
  // The rest of the publisher's settings (serve.events_*, doc/events.md); its endpoint is
  // events_addr and its media come from events_media.
  KvEventsOptions events;
  std::map<std::string, std::string> events_media;  // tier name or kind -> medium
  std::vector<TenantBinding> tenants;
  // Re-read each committed block and check the client's checksum. Off by default: the client
  // computes the checksum in the same pass as its copy into the arena, and a client that lies
  // can only poison blocks of the namespaces it may write anyway.
  bool verify_commit = false;
  uint32_t max_clients = 1024;       // connections past hello (an operator's own uid passes anyway)
  uint32_t max_pending = 64;         // connections that have not said hello yet
  uint32_t hello_timeout_ms = 2000;  // from accept to a complete hello
  uint32_t frame_timeout_ms = 5000;  // from a frame's first byte to its last
  uint32_t max_tenants = 64;         // arena partitions (one per tenant) until restart
  uint32_t max_tenants_per_uid = 8;  // of those, unlisted tenants one uid may open
  // Every tenant not in `tenants`: the same bounds.
  double default_max_share = 1.0;
  // Arena bytes not yet handed to anyone that a tenant's client is told it gets next, so it
  // faults their pages in off its stores' path (fresh pages fault per 4 KiB page when a store
  // first writes them); claimed again when half are used. 0: off.
  uint64_t warm_ahead_bytes = uint64_t{256} << 20;
  // OK, or InvalidArgument naming the key ("metrics_addr: ...").
  Status Validate() const;
};

// OK for "PORT", ":PORT" or "HOST:PORT" with PORT in 0..65535 (0: any free port); else
// InvalidArgument saying why (a bad port was bound as another one: 99999 became 34463).
Status CheckMetricsAddr(std::string_view addr);
// OK for a ZeroMQ endpoint the daemon can bind: "tcp://HOST:PORT" (PORT in 0..65535 or *),
// "ipc://PATH" or "inproc://NAME"; else InvalidArgument saying why.
Status CheckEventsAddr(std::string_view addr);

struct ServeConfig {
  CacheOptions cache;
  ServeOptions serve;
};

// The embedded default: a host tier of a quarter of the machine's memory (at most 64 GiB, at
// least 64 MiB), llama-3.1-8b's layout, LRU. *why says how it was sized (for the log).
ServeConfig DefaultServeConfig(std::string* why);
// Sets cache->events from serve.events_addr and serve.events_*: InvalidArgument when
// events_media names no tier of cache.
Status ApplyEventOptions(const ServeOptions& serve, CacheOptions* cache);
// Reads a YAML file: the cache keys (kvtier/config.h) plus an optional `serve:` section.
Result<ServeConfig> LoadServeConfigFile(const std::string& path);
Result<ServeConfig> ParseServeConfigYaml(std::string_view text, std::string_view source);

// An in-process cache's options from a config (its text, or a file): the cache's keys, with
// the KV-event publisher of serve.events_* (doc/events.md) when serve.events_addr is set; the
// daemon's other keys are checked but do not apply, nor do the daemon's rules on tiers.
Result<CacheOptions> CacheOptionsWithEvents(std::string_view text, std::string_view source);
Result<CacheOptions> CacheOptionsWithEventsFile(const std::string& path);

}  // namespace kvtier::serve

#endif  // KVTIER_SRC_SERVE_SERVE_OPTIONS_H_
