// RemoteTier: a tier on Redis or Valkey, single node or Cluster, shared by every replica.
//
// Each block is one Redis string: <key_prefix><32 hex digits of the BlockKey> -> a 48-byte
// header (magic, key, layout fingerprint), the block bytes and an 8-byte checksum trailer (see
// value_format.h and doc/remote.md). Every read verifies the header and the checksum; a value that
// fails is reported as Corruption and deleted from Redis. Redis evicts on its own (maxmemory
// policy, optional TTL) and other replicas add blocks, so the tier is neither cache-managed nor
// authoritative.
//
// A batched call groups its keys per node (CRC16 hash slots from CLUSTER SLOTS), pipelines one
// connection per node and drives all nodes at once with poll(); MOVED updates the slot map and
// retries, ASK retries once on the target after ASKING. Every call has one deadline
// (timeout_ms); keys whose node did not answer in time get Unavailable. A circuit breaker per
// node fails calls fast while a node is down and probes it again with exponential backoff, so
// a dead node costs a Lookup no more than its deadline, and usually nothing.
//
// Thread-safety: every public method may be called concurrently (connections are pooled per
// node). Ownership: the tier owns its connections; it never keeps a caller's buffers.
#ifndef KVTIER_TIERS_REMOTE_REMOTE_TIER_H_
#define KVTIER_TIERS_REMOTE_REMOTE_TIER_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/log_limiter.h"
#include "common/mutex.h"
#include "kvtier/tier.h"
#include "kvtier/tier_options.h"
#include "tiers/remote/circuit_breaker.h"
#include "tiers/remote/cluster_slots.h"
#include "tiers/remote/redis_connection.h"
#include "tiers/remote/redis_url.h"

namespace kvtier::remote {

struct RemoteTierOptions {
  std::string name = "remote";
  KvLayout layout;
  uint64_t capacity_bytes = 0;  // what the Cache assumes the server holds (> 0)
  std::string url;              // redis://[user[:password]@]host:port[,host:port...][/db]
  std::string user;             // overrides the URL's user when not empty
  std::string password;         // overrides the URL's password when not empty
  std::string mode = "auto";    // "auto" (ask the server), "single" or "cluster"
  std::string key_prefix = "kvtier:";
  int64_t ttl_s = 0;             // > 0: every SET expires after ttl_s seconds
  int connect_timeout_ms = 500;  // per connection attempt (also bounded by the call's deadline)
  int timeout_ms = 1000;         // deadline of one batched call
  int max_redirects = 5;         // MOVED / ASK rounds per call
  int max_idle_connections = 8;  // pooled per node
  // Blocks of 32 KiB and more: a call spreads a node's keys over up to connections_per_node
  // connections, with at most set_window SETs / get_window GETs in flight on each (0: no
  // limit). Smaller blocks are pipelined on one connection per node.
  int connections_per_node = 2;
  int set_window = 1;
  int get_window = 1;
  CircuitBreakerOptions breaker;
  bool lazy_connect = false;  // Open succeeds even when no seed answers (discover later)

  // OK, or InvalidArgument naming the field.
  Status Validate() const;
};

// Reads TierSpec::params of kind "remote" with the one tier params reader (keys, ranges and
// vocabulary in doc/config.md). InvalidArgument "params.KEY: why" for an unknown key or a bad
// value.
Result<RemoteTierOptions> RemoteTierOptionsFromParams(
    std::string name, const KvLayout& layout, uint64_t capacity_bytes,
    const std::map<std::string, std::string>& params);
// Same, from checked typed params; InvalidArgument "params.KEY: why" from Validate.
Result<RemoteTierOptions> RemoteTierOptionsFrom(std::string name, const KvLayout& layout,
                                                uint64_t capacity_bytes,
                                                const RemoteTierParams& params);

struct RemoteStats {
  bool cluster = false;
  int nodes = 0;
  uint64_t connects = 0;  // connections opened
  uint64_t connect_failures = 0;
  uint64_t moved = 0;               // MOVED redirects followed
  uint64_t asks = 0;                // ASK redirects followed
  uint64_t topology_refreshes = 0;  // CLUSTER SLOTS read
  uint64_t breaker_opens = 0;
  uint64_t fast_failures = 0;   // calls refused by an open breaker
  uint64_t timeouts = 0;        // node exchanges that ran past the deadline
  uint64_t io_failures = 0;     // node exchanges that broke (reset, closed, protocol)
  uint64_t corruptions = 0;     // values that failed verification (and were deleted)
  uint64_t oom_rejections = 0;  // SETs refused at maxmemory
};

class RemoteTier final : public Tier {
 public:
  // Validates options and discovers the deployment (single node or cluster). InvalidArgument
  // for bad options or refused AUTH; Unavailable when no seed answers (unless lazy_connect).
  static Result<std::unique_ptr<RemoteTier>> Open(RemoteTierOptions options);
  ~RemoteTier() override;

  RemoteStats remote_stats() const;
  bool is_cluster() const;
  // Reads CLUSTER SLOTS again now (it also happens by itself after MOVED or a node failure).
  Status RefreshTopology();
  const RemoteTierOptions& options() const { return options_; }

 protected:
  void PutImpl(std::span<const BlockKey> keys, std::span<const ConstBlock> blocks,
               std::span<Status> results) override;
  void GetImpl(std::span<const BlockKey> keys, std::span<const MutableBlock> out,
               std::span<Status> results) override;
  // out[i] is true only for keys confirmed resident; a key whose node did not answer reads as
  // absent. Unavailable only when no key could be answered.
  Status ExistsImpl(std::span<const BlockKey> keys, std::span<bool> out) override;
  Status EraseImpl(std::span<const BlockKey> keys) override;
  uint64_t UsedBytesImpl() const override;
  // The keys of every master's database (refreshed with used bytes, at most once a second):
  // the tier's blocks when it has the database to itself.
  uint64_t ResidentBlocksImpl(uint64_t used_bytes) const override;
  TierCapabilities CapabilitiesImpl() const override;
  void CountersImpl(std::vector<TierStats::Counter>* out) const override;

 private:
  struct Node;
  struct Batch;
  struct Flight;
  struct Counters {
    std::atomic<uint64_t> connects{0}, connect_failures{0}, moved{0}, asks{0},
        topology_refreshes{0}, breaker_opens{0}, fast_failures{0}, timeouts{0}, io_failures{0},
        corruptions{0}, oom_rejections{0};
  };
  static constexpr uint16_t kNoNode = 0xFFFF;

  RemoteTier(RemoteTierOptions options, RedisUrl url);

  Status Discover(int64_t deadline_ns);
  Status RefreshTopologyLocked(int64_t deadline_ns) KVTIER_REQUIRES(refresh_mu_);
  void InstallSlots(const std::vector<SlotRange>& ranges);
  void MaybeRefresh(int64_t deadline_ns);
  uint16_t InternNodeLocked(const NodeAddress& address) KVTIER_REQUIRES(topo_mu_);

  Result<std::unique_ptr<RedisConnection>> Acquire(Node* node, int64_t deadline_ns) const;
  void Release(Node* node, std::unique_ptr<RedisConnection> conn, bool healthy) const;
  // One command on node over a pooled connection, which goes back healthy unless the command
  // failed on the wire (an error reply is still a healthy connection).
  Result<ReplyPtr> CommandOn(Node* node, const std::vector<std::string>& argv,
                             int64_t deadline_ns) const;

  // Fills each key's Redis key, slot and routing state.
  void Route(Batch& batch) const;
  void Run(Batch& batch);
  // One round of the pending ops (redirected ops are appended to pending for the next).
  void RunRound(Batch& batch, std::vector<size_t>& pending, int64_t deadline_ns);
  // RunRound's steps: group the ops by node into flights (several per node for big values),
  // connect each, then pump them (poll, send, receive) until every reply is in or the
  // deadline passes.
  void GroupFlights(Batch& batch, const std::vector<size_t>& pending, std::vector<Flight>* flights);
  void SplitBigFlights(const Batch& batch, std::vector<Flight>* flights) const;
  void ConnectFlights(Batch& batch, std::vector<Flight>& flights, int64_t deadline_ns);
  void PumpFlights(Batch& batch, std::vector<Flight>& flights, std::vector<size_t>* pending,
                   int64_t deadline_ns);
  // What the flight may send now, checksummed hash_ahead bytes ahead: OK, or Unavailable when
  // the socket failed.
  Status SendSome(Batch& batch, Flight& f, uint64_t hash_ahead);
  // The replies that have arrived, each handled: OK, or Unavailable when the socket failed.
  Status ReceiveSome(Batch& batch, Flight& f, std::vector<size_t>* pending);
  // Every op of f whose reply has not arrived gets s; FailFlight also drops the connection.
  static void FailRest(Batch& batch, Flight& f, const Status& s);
  void FailFlight(Batch& batch, Flight& f, const Status& s);
  void BuildFlight(Batch& batch, Flight& flight);
  void ChecksumAhead(Batch& batch, Flight& flight, uint64_t upto);
  void HandleReply(Batch& batch, size_t i, const NodeAddress& from, RespReply& reply,
                   std::vector<size_t>* again);
  Status MapError(const std::string& error) const;
  void DropCorrupt(Batch& batch, int64_t deadline_ns);

  const RemoteTierOptions options_;
  const RedisUrl url_;
  ConnectionOptions conn_options_;
  const uint64_t fingerprint_;

  mutable Mutex topo_mu_;
  bool discovered_ KVTIER_GUARDED_BY(topo_mu_) = false;
  bool cluster_ KVTIER_GUARDED_BY(topo_mu_) = false;
  std::vector<std::unique_ptr<Node>> nodes_ KVTIER_GUARDED_BY(topo_mu_);  // append-only
  std::array<uint16_t, kClusterSlots> slot_node_ KVTIER_GUARDED_BY(topo_mu_);
  std::atomic<bool> stale_{false};
  std::atomic<int64_t> last_refresh_ns_{0};
  Mutex refresh_mu_;  // one refresh (or discovery) at a time; taken before topo_mu_

  mutable Mutex usage_mu_;  // one INFO round at a time; the others use the last answer
  mutable std::atomic<uint64_t> used_bytes_{0};
  mutable std::atomic<uint64_t> resident_blocks_{0};  // DBSIZE of every master, with used_bytes_
  mutable std::atomic<int64_t> usage_at_ns_{0};

  mutable Counters counters_;
  // Deadline hits, corrupt values, writes refused at maxmemory.
  mutable LogLimiter timeout_log_, corruption_log_, oom_log_;
};

}  // namespace kvtier::remote

#endif  // KVTIER_TIERS_REMOTE_REMOTE_TIER_H_
