// The typed settings of the built-in tier kinds: what a config's `params:` holds for a host (or
// emulated_device), disk or remote tier. Set one on TierSpec (spec.disk = DiskTierParams{...}), or
// give the same keys as strings in TierSpec::params; both go through one reader with one vocabulary
// and one set of checks (doc/config.md lists every key).
//
// Vocabulary of a params string: bool: true|false|yes|no|on|off|1|0; integer: decimal digits;
// size: bytes or "256MiB", "4GiB" (see ParseByteSize); choice: one of the names listed.
//
// Thread-safety: plain values.
#ifndef KVTIER_TIER_OPTIONS_H_
#define KVTIER_TIER_OPTIONS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/status.h"

namespace kvtier {

// Kind "host" or "emulated_device" (host memory standing in for HBM). Copy threads are
// TierSpec::threads.
struct HostTierParams {
  bool prefault = true;  // fault the arena in (a first-touch fault costs ~17x a copy)
  // Fault it in on a thread of its own (MADV_POPULATE_WRITE, Linux 5.14+), so open returns at
  // once; false, or an older kernel: before open returns.
  bool prefault_background = true;
  bool huge_pages = true;  // MADV_HUGEPAGE on the arena
  // Without prefault: bytes past the slots handed out so far kept faulted in ahead of the
  // stores, on an idle thread (doc/config.md); 0: none.
  uint64_t warm_ahead = 0;
  // cudaHostRegister with CUDA; unset: true for host, false for emulated_device.
  std::optional<bool> pin;
  bool operator==(const HostTierParams&) const = default;
  // OK, or InvalidArgument "KEY: why" (each struct's Validate checks its table's ranges).
  Status Validate() const;
};

// Kind "disk": append-only segment files in a directory.
struct DiskTierParams {
  std::string path;                      // required: the directory (created when missing)
  uint64_t segment_bytes = 0;            // size; 0: min(256 MiB, capacity / 4)
  uint64_t buffer_bytes = 128ull << 20;  // size; bounce buffers per I/O context
  uint32_t queue_depth = 32;             // [1, 4096] I/Os in flight per context
  std::string sync = "batch";            // none | batch | interval
  uint32_t sync_interval_ms = 100;       // [0, 2^32-1]; > 0 with sync=interval
  std::string io = "auto";               // auto | uring (io_uring) | sync (pread)
  bool register_buffers = true;          // io_uring fixed buffers where RLIMIT_MEMLOCK allows
  bool direct_io = true;                 // O_DIRECT; a filesystem that refuses it is noted
  bool reinsert_hot = true;              // on eviction, rewrite blocks read since written
  bool operator==(const DiskTierParams&) const = default;
  Status Validate() const;
};

// Kind "remote": Redis or Valkey, single node or cluster.
struct RemoteTierParams {
  std::string url;            // required: redis://[user[:pass]@]host:port[,host:port...][/db]
  std::string user;           // AUTH user (overrides the URL's)
  std::string password;       // AUTH password (overrides the URL's)
  std::string mode = "auto";  // auto | single | cluster (cluster: db 0 only)
  std::string key_prefix = "kvtier:";  // no '{' or '}'
  int64_t ttl_s = 0;                   // [0, 2^40]; 0: no expiry
  int connect_timeout_ms = 500;        // [1, 2^31-1]
  int timeout_ms = 1000;               // [1, 2^31-1] deadline of one batched call
  int max_redirects = 5;               // [1, 100] MOVED/ASK rounds per call
  int max_idle_connections = 8;        // [0, 1024]
  int breaker_failures = 3;            // [1, 1000] failures that open the breaker
  int breaker_backoff_ms = 100;        // [1, 2^31-1] first open interval
  int breaker_max_backoff_ms = 5000;   // [1, 2^31-1]
  bool lazy_connect = false;           // Open succeeds when no seed answers yet
  int connections_per_node = 2;        // [1, 64]
  int set_window = 1;                  // [0, 2^20] SETs in flight per connection; 0: no limit
  int get_window = 1;                  // [0, 2^20] GETs in flight per connection; 0: no limit
  bool operator==(const RemoteTierParams&) const = default;
  Status Validate() const;
};

// The keys a kind's params take ("host", "emulated_device", "disk", "remote"), in table order;
// empty for a kind without params.
std::vector<std::string> TierParamKeys(std::string_view kind);

}  // namespace kvtier

#endif  // KVTIER_TIER_OPTIONS_H_
