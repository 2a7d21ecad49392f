#include "tiers/remote/remote_tier.h"

#include <hiredis/hiredis.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <limits>
#include <optional>

#include <spdlog/spdlog.h>

#include "common/log_limiter.h"
#include "hash/xxh.h"
#include "hash/xxh3_wide.h"
#include "tiers/remote/value_format.h"

namespace kvtier::remote {
namespace {

constexpr int64_t kMs = 1'000'000;
// After a MOVED or a node failure, CLUSTER SLOTS is read again at most this often.
constexpr int64_t kRefreshIntervalNs = 100 * kMs;
constexpr int64_t kUsageIntervalNs = 1000 * kMs;
constexpr size_t kMaxIov = 512;
// From this size a value is a "big argument" to Redis (PROTO_MBULK_BIG_ARG).
constexpr uint64_t kBigValueBytes = 32 * 1024;
// A Put checksums at least this far, and at least one value, ahead of what it sends: small
// values stay cache-hot and start leaving early, and a 2 MiB value leaves in one sendmsg
// (in 256 KiB stretches, eight sends a value, 2 MiB puts ran 15-20% slower on loopback, where
// each send also runs the receiver's TCP path).
constexpr uint64_t kChecksumAheadBytes = 256 * 1024;
// A Get sleeps until this much of a block has arrived (SO_RCVLOWAT).
constexpr size_t kRecvLowWaterBytes = 512 * 1024;

void AppendBulk(std::string* out, std::string_view arg) {
  *out += '$';
  *out += std::to_string(arg.size());
  *out += "\r\n";
  *out += arg;
  *out += "\r\n";
}

Result<int64_t> ParamInt(const std::map<std::string, std::string>& params, const std::string& key,
                         int64_t fallback, int64_t min, int64_t max) {
  auto it = params.find(key);
  if (it == params.end()) return fallback;
  const std::string& text = it->second;
  int64_t v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || p != text.data() + text.size() || text.empty() || v < min || v > max) {
    return Status::InvalidArgument("params." + key + ": '" + text + "' is not an integer in [" +
                                   std::to_string(min) + ", " + std::to_string(max) + "]");
  }
  return v;
}

bool StartsWith(const std::string& s, std::string_view prefix) { return s.starts_with(prefix); }

}  // namespace

// ---------------------------------------------------------------------------------------------
// Options

Status RemoteTierOptions::Validate() const {
  KVTIER_RETURN_IF_ERROR(layout.Validate().WithContext("layout"));
  if (capacity_bytes == 0) return Status::InvalidArgument("capacity_bytes: must be > 0");
  if (capacity_bytes < layout.bytes_per_block()) {
    return Status::InvalidArgument("capacity_bytes: smaller than one block");
  }
  Result<RedisUrl> parsed = ParseRedisUrl(url);
  if (!parsed.ok()) return parsed.status();
  if (mode != "auto" && mode != "single" && mode != "cluster") {
    return Status::InvalidArgument("mode: '" + mode + "' is not auto, single or cluster");
  }
  if (mode == "cluster" && parsed->db != 0) {
    return Status::InvalidArgument("url: a cluster has only database 0");
  }
  if (ttl_s < 0) return Status::InvalidArgument("ttl_s: must be >= 0");
  if (connect_timeout_ms < 1) return Status::InvalidArgument("connect_timeout_ms: must be >= 1");
  if (timeout_ms < 1) return Status::InvalidArgument("timeout_ms: must be >= 1");
  if (max_redirects < 1) return Status::InvalidArgument("max_redirects: must be >= 1");
  if (connections_per_node < 1 || connections_per_node > 64) {
    return Status::InvalidArgument("connections_per_node: must be in [1, 64]");
  }
  if (set_window < 0) return Status::InvalidArgument("set_window: must be >= 0");
  if (get_window < 0) return Status::InvalidArgument("get_window: must be >= 0");
  if (max_idle_connections < 0) {
    return Status::InvalidArgument("max_idle_connections: must be >= 0");
  }
  if (key_prefix.find_first_of("{}") != std::string::npos) {
    // A hash tag in the prefix would put every block in one slot.
    return Status::InvalidArgument("key_prefix: must not contain '{' or '}'");
  }
  return breaker.Validate();
}

Result<RemoteTierOptions> RemoteTierOptionsFromParams(
    std::string name, const KvLayout& layout, uint64_t capacity_bytes,
    const std::map<std::string, std::string>& params) {
  static const char* const kKnown[] = {"url",
                                       "user",
                                       "password",
                                       "mode",
                                       "key_prefix",
                                       "ttl_s",
                                       "connect_timeout_ms",
                                       "timeout_ms",
                                       "max_redirects",
                                       "max_idle_connections",
                                       "breaker_failures",
                                       "breaker_backoff_ms",
                                       "breaker_max_backoff_ms",
                                       "lazy_connect",
                                       "connections_per_node",
                                       "set_window",
                                       "get_window"};
  for (const auto& [key, value] : params) {
    if (std::find(std::begin(kKnown), std::end(kKnown), key) == std::end(kKnown)) {
      std::string known;
      for (const char* k : kKnown) known += std::string(known.empty() ? "" : ", ") + k;
      return Status::InvalidArgument("params." + key +
                                     ": unknown for a remote tier (known: " + known + ")");
    }
  }
  RemoteTierOptions o;
  o.name = std::move(name);
  o.layout = layout;
  o.capacity_bytes = capacity_bytes;
  auto get = [&](const char* key, std::string* out) {
    if (auto it = params.find(key); it != params.end()) *out = it->second;
  };
  get("url", &o.url);
  if (o.url.empty()) return Status::InvalidArgument("params.url: required (redis://host:port)");
  if (Result<RedisUrl> u = ParseRedisUrl(o.url); !u.ok()) {
    return u.status().WithContext("params");
  }
  get("user", &o.user);
  get("password", &o.password);
  get("mode", &o.mode);
  get("key_prefix", &o.key_prefix);
  constexpr int64_t kIntMax = std::numeric_limits<int>::max();
  KVTIER_ASSIGN_OR_RETURN(o.ttl_s, ParamInt(params, "ttl_s", 0, 0, int64_t{1} << 40));
  KVTIER_ASSIGN_OR_RETURN(int64_t ct, ParamInt(params, "connect_timeout_ms", 500, 1, kIntMax));
  KVTIER_ASSIGN_OR_RETURN(int64_t t, ParamInt(params, "timeout_ms", 1000, 1, kIntMax));
  KVTIER_ASSIGN_OR_RETURN(int64_t r, ParamInt(params, "max_redirects", 5, 1, 100));
  KVTIER_ASSIGN_OR_RETURN(int64_t idle, ParamInt(params, "max_idle_connections", 8, 0, 1024));
  KVTIER_ASSIGN_OR_RETURN(int64_t bf, ParamInt(params, "breaker_failures", 3, 1, 1000));
  KVTIER_ASSIGN_OR_RETURN(int64_t bb, ParamInt(params, "breaker_backoff_ms", 100, 1, kIntMax));
  KVTIER_ASSIGN_OR_RETURN(int64_t bm, ParamInt(params, "breaker_max_backoff_ms", 5000, 1, kIntMax));
  KVTIER_ASSIGN_OR_RETURN(int64_t cpn, ParamInt(params, "connections_per_node", 2, 1, 64));
  KVTIER_ASSIGN_OR_RETURN(int64_t sw, ParamInt(params, "set_window", 1, 0, 1 << 20));
  KVTIER_ASSIGN_OR_RETURN(int64_t gw, ParamInt(params, "get_window", 1, 0, 1 << 20));
  o.connections_per_node = static_cast<int>(cpn);
  o.set_window = static_cast<int>(sw);
  o.get_window = static_cast<int>(gw);
  o.connect_timeout_ms = static_cast<int>(ct);
  o.timeout_ms = static_cast<int>(t);
  o.max_redirects = static_cast<int>(r);
  o.max_idle_connections = static_cast<int>(idle);
  o.breaker.failure_threshold = static_cast<int>(bf);
  o.breaker.initial_backoff_ns = bb * kMs;
  o.breaker.max_backoff_ns = bm * kMs;
  if (auto it = params.find("lazy_connect"); it != params.end()) {
    if (it->second == "true" || it->second == "1") {
      o.lazy_connect = true;
    } else if (it->second == "false" || it->second == "0") {
      o.lazy_connect = false;
    } else {
      return Status::InvalidArgument("params.lazy_connect: '" + it->second +
                                     "' is not true or false");
    }
  }
  if (Status s = o.Validate(); !s.ok()) return s.WithContext("params");
  return o;
}

// ---------------------------------------------------------------------------------------------
// Internal types

struct RemoteTier::Node {
  Node(NodeAddress a, const CircuitBreakerOptions& b, uint64_t seed)
      : address(std::move(a)), breaker(b, seed) {}
  const NodeAddress address;
  Mutex mu;
  std::vector<std::unique_ptr<RedisConnection>> idle KVTIER_GUARDED_BY(mu);
  CircuitBreaker breaker KVTIER_GUARDED_BY(mu);

  // Counts a failure against the breaker; when that opens it, the idle connections move to
  // *closing, which the caller destroys after unlocking (closing a socket is a syscall).
  void RecordFailure(std::atomic<uint64_t>* breaker_opens,
                     std::vector<std::unique_ptr<RedisConnection>>* closing) KVTIER_REQUIRES(mu) {
    const uint64_t opens = breaker.opens();
    const int64_t now = SteadyNowNs();
    breaker.RecordFailure(now);
    if (breaker.opens() != opens) {
      breaker_opens->fetch_add(1, std::memory_order_relaxed);
      closing->swap(idle);
      // Once per opening (the backoff spaces them): an outage is visible without a flood.
      spdlog::warn(
          "remote {}: circuit opened after repeated failures: its blocks are misses, "
          "next try in {} ms",
          address.ToString(), std::max<int64_t>(0, (breaker.retry_at_ns() - now) / kMs));
    }
  }
};

enum class OpKind : uint8_t { kGet, kSet, kExists, kDel };

struct RemoteTier::Batch {
  OpKind kind = OpKind::kGet;
  std::span<const BlockKey> keys;
  std::vector<std::string> rkeys;
  std::vector<int> slots;
  std::span<const ConstBlock> blocks;     // kSet
  std::vector<ValueHeaderBytes> headers;  // kSet: encoded; kGet: read into
  std::span<const MutableBlock> out;      // kGet
  std::span<bool> exists;                 // kExists
  std::vector<Status> owned_results;      // when the caller has no per-key results
  std::span<Status> results;
  std::vector<uint16_t> target;             // kNoNode: route by slot; else a redirect's node
  std::vector<uint8_t> asking;              // send ASKING before the command
  std::vector<size_t> corrupt;              // kGet: values to delete
  std::vector<XXH3_state_t> hashes;         // checksum of each block as it is sent or arrives
  std::vector<ValueTrailerBytes> trailers;  // kSet: filled as each block is sent; kGet: read

  // A SET or GET batch of block values: keys, results and per-value framing.
  Batch(OpKind k, std::span<const BlockKey> ks, std::span<Status> rs)
      : kind(k),
        keys(ks),
        headers(ks.size()),
        results(rs),
        hashes(ks.size()),
        trailers(ks.size()) {}
  // An EXISTS or DEL batch: keys only, results owned (all Ok to start).
  Batch(OpKind k, std::span<const BlockKey> ks)
      : kind(k), keys(ks), owned_results(ks.size(), Status::Ok()), results(owned_results) {}
  Batch(const Batch&) = delete;  // results may point into owned_results
  Batch& operator=(const Batch&) = delete;
};

struct RemoteTier::Flight {
  Node* node = nullptr;
  std::unique_ptr<RedisConnection> conn;
  std::vector<size_t> ops;       // batch indices, in send order
  std::vector<int64_t> replies;  // per expected reply: a batch index, or -1 for ASKING
  size_t next_reply = 0;
  std::string arena;
  std::vector<iovec> iov;
  size_t iov_pos = 0;
  std::vector<uint64_t> cmd_end;  // per command: stream bytes up to its end
  uint64_t sent = 0;              // stream bytes sent
  size_t window = 0;              // commands in flight at most; 0 = no limit
  bool done = false;
  // kSet: the blocks in the stream, checksummed just ahead of sending (while the bytes are
  // hot for the socket copy); bytes past the checksummed frontier are not sent yet.
  struct HashSeg {
    uint64_t begin;  // stream offset of the block
    uint64_t len;
    size_t op;
  };
  std::vector<HashSeg> hash_segs;
  size_t hash_pos = 0;  // first block not fully checksummed
  uint64_t hashed = 0;  // bytes of hash_segs[hash_pos] checksummed

  uint64_t HashedFrontier() const {
    if (hash_pos >= hash_segs.size()) return UINT64_MAX;
    return hash_segs[hash_pos].begin + hashed;
  }

  // Stream bytes that may be sent now: everything, or up to the window's last command.
  uint64_t SendLimit() const {
    if (cmd_end.empty()) return 0;
    if (window == 0) return cmd_end.back();
    return cmd_end[std::min(next_reply + window, cmd_end.size()) - 1];
  }
};

// ---------------------------------------------------------------------------------------------
// Open / topology

RemoteTier::RemoteTier(RemoteTierOptions options, RedisUrl url)
    : Tier(options.name, TierKind::kRemote, options.layout, options.capacity_bytes),
      options_(std::move(options)),
      url_(std::move(url)),
      fingerprint_(options_.layout.fingerprint()) {
  conn_options_.connect_timeout_ns = int64_t{options_.connect_timeout_ms} * kMs;
  conn_options_.op_timeout_ns = int64_t{options_.timeout_ms} * kMs;
  conn_options_.user = options_.user.empty() ? url_.user : options_.user;
  conn_options_.password = options_.password.empty() ? url_.password : options_.password;
  conn_options_.db = url_.db;
  slot_node_.fill(kNoNode);
}

RemoteTier::~RemoteTier() = default;

Result<std::unique_ptr<RemoteTier>> RemoteTier::Open(RemoteTierOptions options) {
  KVTIER_RETURN_IF_ERROR(options.Validate());
  KVTIER_ASSIGN_OR_RETURN(RedisUrl url, ParseRedisUrl(options.url));
  std::unique_ptr<RemoteTier> tier(new RemoteTier(std::move(options), std::move(url)));
  int64_t deadline = SteadyNowNs() + int64_t{tier->options_.timeout_ms} * kMs;
  Status s = tier->Discover(deadline);
  if (!s.ok() && (s.code() == StatusCode::kInvalidArgument || !tier->options_.lazy_connect)) {
    return s.WithContext("remote tier '" + tier->name() + "' at " + tier->url_.Redacted());
  }
  return tier;
}

uint16_t RemoteTier::InternNodeLocked(const NodeAddress& address) {
  for (size_t i = 0; i < nodes_.size(); ++i) {
    if (nodes_[i]->address == address) return static_cast<uint16_t>(i);
  }
  if (nodes_.size() >= kNoNode) return kNoNode;
  nodes_.push_back(std::make_unique<Node>(address, options_.breaker, nodes_.size() + 1));
  return static_cast<uint16_t>(nodes_.size() - 1);
}

bool RemoteTier::is_cluster() const {
  MutexLock lock(&topo_mu_);
  return cluster_;
}

Status RemoteTier::Discover(int64_t deadline_ns) {
  std::lock_guard<std::mutex> refresh(refresh_mu_);
  {
    MutexLock lock(&topo_mu_);
    if (discovered_) return Status::Ok();
  }
  Status last = Status::Unavailable("no seed given");
  for (const NodeAddress& seed : url_.seeds) {
    Node* node;
    {
      MutexLock lock(&topo_mu_);
      node = nodes_[InternNodeLocked(seed)].get();
    }
    if (options_.mode == "single") {
      Result<std::unique_ptr<RedisConnection>> conn = Acquire(node, deadline_ns);
      if (!conn.ok()) {
        if (conn.status().code() == StatusCode::kInvalidArgument) return conn.status();
        last = conn.status();
        continue;
      }
      Release(node, std::move(*conn), true);
      MutexLock lock(&topo_mu_);
      slot_node_.fill(InternNodeLocked(seed));
      cluster_ = false;
      discovered_ = true;
      return Status::Ok();
    }
    Result<ReplyPtr> reply = CommandOn(node, {"CLUSTER", "SLOTS"}, deadline_ns);
    if (!reply.ok()) {
      if (reply.status().code() == StatusCode::kInvalidArgument) return reply.status();
      last = reply.status();
      continue;
    }
    const redisReply* r = reply->get();
    if (r->type == REDIS_REPLY_ERROR) {
      std::string text(r->str, r->len);
      if (StartsWith(text, "NOAUTH") || StartsWith(text, "WRONGPASS")) {
        return Status::InvalidArgument("password: " + seed.ToString() + " requires AUTH: " + text);
      }
      if (StartsWith(text, "NOPERM")) {
        return Status::InvalidArgument("user: may not run CLUSTER SLOTS on " + seed.ToString() +
                                       " (" + text + "); grant it or set mode=single");
      }
      if (text.find("cluster support disabled") != std::string::npos) {
        if (options_.mode == "cluster") {
          return Status::InvalidArgument("mode: cluster, but " + seed.ToString() +
                                         " has cluster support disabled");
        }
        MutexLock lock(&topo_mu_);
        slot_node_.fill(InternNodeLocked(seed));
        cluster_ = false;
        discovered_ = true;
        return Status::Ok();
      }
      last = Status::Unavailable("remote " + seed.ToString() + ": CLUSTER SLOTS: " + text);
      continue;
    }
    if (url_.db != 0) {
      return Status::InvalidArgument("url: " + seed.ToString() +
                                     " is a cluster, which has only database 0");
    }
    Result<std::vector<SlotRange>> ranges = ParseClusterSlots(r, seed.host);
    if (!ranges.ok()) {
      last = ranges.status();
      continue;
    }
    InstallSlots(*ranges);
    return Status::Ok();
  }
  return last;
}

Status RemoteTier::RefreshTopology() {
  int64_t deadline = SteadyNowNs() + int64_t{options_.timeout_ms} * kMs;
  bool discovered, cluster;
  {
    MutexLock lock(&topo_mu_);
    discovered = discovered_;
    cluster = cluster_;
  }
  if (!discovered) return Discover(deadline);
  if (!cluster) return Status::Ok();
  std::lock_guard<std::mutex> refresh(refresh_mu_);
  return RefreshTopologyLocked(deadline);
}

void RemoteTier::MaybeRefresh(int64_t deadline_ns) {
  bool discovered;
  {
    MutexLock lock(&topo_mu_);
    discovered = discovered_;
  }
  if (!discovered) {
    (void)Discover(deadline_ns);
    return;
  }
  if (!stale_.load(std::memory_order_relaxed)) return;
  int64_t now = SteadyNowNs();
  if (now - last_refresh_ns_.load(std::memory_order_relaxed) < kRefreshIntervalNs) return;
  std::unique_lock<std::mutex> refresh(refresh_mu_, std::try_to_lock);
  if (!refresh.owns_lock()) return;  // another call is refreshing; route with what we have
  (void)RefreshTopologyLocked(deadline_ns);
}

// Routes every slot by a CLUSTER SLOTS answer (from discovery or a refresh).
void RemoteTier::InstallSlots(const std::vector<SlotRange>& ranges) {
  counters_.topology_refreshes.fetch_add(1, std::memory_order_relaxed);
  MutexLock lock(&topo_mu_);
  slot_node_.fill(kNoNode);
  for (const SlotRange& range : ranges) {
    uint16_t n = InternNodeLocked(range.master);
    for (int s = range.first; s <= range.last; ++s) slot_node_[s] = n;
  }
  cluster_ = true;
  discovered_ = true;
  stale_.store(false, std::memory_order_relaxed);
  last_refresh_ns_.store(SteadyNowNs(), std::memory_order_relaxed);
}

Status RemoteTier::RefreshTopologyLocked(int64_t deadline_ns) {
  last_refresh_ns_.store(SteadyNowNs(), std::memory_order_relaxed);
  std::vector<Node*> candidates;
  {
    MutexLock lock(&topo_mu_);
    if (!cluster_) return Status::Ok();
    for (const auto& n : nodes_) candidates.push_back(n.get());
  }
  Status last = Status::Unavailable("no node answered CLUSTER SLOTS");
  for (Node* node : candidates) {
    Result<ReplyPtr> reply = CommandOn(node, {"CLUSTER", "SLOTS"}, deadline_ns);
    if (!reply.ok()) {
      last = reply.status();
      continue;
    }
    Result<std::vector<SlotRange>> ranges = ParseClusterSlots(reply->get(), node->address.host);
    if (!ranges.ok()) {
      last = ranges.status();
      continue;
    }
    InstallSlots(*ranges);
    return Status::Ok();
  }
  return last;
}

// ---------------------------------------------------------------------------------------------
// Connection pool and breaker

Result<std::unique_ptr<RedisConnection>> RemoteTier::Acquire(Node* node,
                                                             int64_t deadline_ns) const {
  {
    MutexLock lock(&node->mu);
    int64_t now = SteadyNowNs();
    if (!node->breaker.Allow(now)) {
      counters_.fast_failures.fetch_add(1, std::memory_order_relaxed);
      int64_t wait_ms = std::max<int64_t>(0, (node->breaker.retry_at_ns() - now) / kMs);
      return Status::Unavailable("remote " + node->address.ToString() +
                                 ": circuit open after repeated failures; next try in " +
                                 std::to_string(wait_ms) + " ms");
    }
  }
  // An idle connection is taken under the lock and probed outside it: the probe is a recv and
  // dropping a dead one a close, and other callers of this node should not wait on either.
  while (true) {
    std::unique_ptr<RedisConnection> conn;
    {
      MutexLock lock(&node->mu);
      if (node->idle.empty()) break;
      conn = std::move(node->idle.back());
      node->idle.pop_back();
    }
    if (!conn->Dead()) return conn;
  }
  Result<std::unique_ptr<RedisConnection>> conn =
      RedisConnection::Open(node->address, conn_options_, deadline_ns);
  if (conn.ok()) {
    counters_.connects.fetch_add(1, std::memory_order_relaxed);
    return conn;
  }
  counters_.connect_failures.fetch_add(1, std::memory_order_relaxed);
  std::vector<std::unique_ptr<RedisConnection>> closing;  // closed after the lock
  MutexLock lock(&node->mu);
  // A refused AUTH is a configuration error, not an outage, and leaves a closed breaker alone;
  // but a half-open breaker's probe must end in a verdict, or the node is shut out for good.
  if (conn.status().code() != StatusCode::kInvalidArgument ||
      node->breaker.state() == CircuitBreaker::State::kHalfOpen) {
    node->RecordFailure(&counters_.breaker_opens, &closing);
  }
  return conn.status();
}

void RemoteTier::Release(Node* node, std::unique_ptr<RedisConnection> conn, bool healthy) const {
  std::unique_ptr<RedisConnection> drop;                  // closed after the lock
  std::vector<std::unique_ptr<RedisConnection>> closing;  // likewise
  if (healthy && conn != nullptr) conn->SetRecvLowWater(1);
  MutexLock lock(&node->mu);
  if (healthy) {
    if (node->breaker.state() != CircuitBreaker::State::kClosed) {
      spdlog::info("remote {}: answers again; circuit closed", node->address.ToString());
    }
    node->breaker.RecordSuccess();
    if (conn != nullptr && node->idle.size() < static_cast<size_t>(options_.max_idle_connections)) {
      node->idle.push_back(std::move(conn));
    } else {
      drop = std::move(conn);
    }
    return;
  }
  drop = std::move(conn);
  node->RecordFailure(&counters_.breaker_opens, &closing);
}

Result<ReplyPtr> RemoteTier::CommandOn(Node* node, const std::vector<std::string>& argv,
                                       int64_t deadline_ns) const {
  KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<RedisConnection> conn, Acquire(node, deadline_ns));
  Result<ReplyPtr> reply = conn->Command(argv, deadline_ns);
  Release(node, std::move(conn), reply.ok());
  return reply;
}

// ---------------------------------------------------------------------------------------------
// The pipelined batch

Status RemoteTier::MapError(const std::string& error) const {
  if (StartsWith(error, "OOM")) {
    counters_.oom_rejections.fetch_add(1, std::memory_order_relaxed);
    return Status::ResourceExhausted("remote: " + error);
  }
  if (StartsWith(error, "ERR") || StartsWith(error, "WRONGTYPE")) {
    return Status::Internal("remote: " + error);
  }
  // CLUSTERDOWN, TRYAGAIN, LOADING, MASTERDOWN, BUSY, READONLY, NOAUTH, NOPERM, ...
  return Status::Unavailable("remote: " + error);
}

void RemoteTier::BuildFlight(Batch& batch, Flight& flight) {
  // Segments: arena bytes (offset, length) or caller bytes (pointer, length); turned into
  // iovecs once the arena stops growing.
  struct Seg {
    const void* ptr;  // nullptr: arena
    size_t off;
    size_t len;
  };
  std::vector<Seg> segs;
  auto arena_mark = [&](size_t start) {
    if (flight.arena.size() == start) return;
    if (!segs.empty() && segs.back().ptr == nullptr && segs.back().off + segs.back().len == start) {
      segs.back().len += flight.arena.size() - start;
    } else {
      segs.push_back({nullptr, start, flight.arena.size() - start});
    }
  };
  std::string ttl = std::to_string(options_.ttl_s);
  RespReader& reader = flight.conn->reader();
  uint64_t stream = 0;  // bytes of the stream so far
  for (size_t i : flight.ops) {
    size_t start = flight.arena.size();
    if (batch.asking[i]) {
      flight.arena += "*1\r\n$6\r\nASKING\r\n";
      reader.Expect();
      flight.replies.push_back(-1);
      stream += flight.arena.size() - start;
      flight.cmd_end.push_back(stream);
      arena_mark(start);
      start = flight.arena.size();
    }
    const uint64_t cmd_start_arena = start;
    uint64_t cmd_extra = 0;  // caller bytes (header, block) of this command
    const std::string& key = batch.rkeys[i];
    switch (batch.kind) {
      case OpKind::kGet:
        flight.arena += "*2\r\n$3\r\nGET\r\n";
        AppendBulk(&flight.arena, key);
        XXH3_64bits_reset(&batch.hashes[i]);
        reader.Expect(BulkSink{batch.headers[i], batch.out[i], batch.trailers[i],
                               [](void* state, std::span<const std::byte> bytes) {
                                 WideXxh3Update(static_cast<XXH3_state_t*>(state), bytes.data(),
                                                bytes.size());
                               },
                               &batch.hashes[i]});
        break;
      case OpKind::kExists:
        flight.arena += "*2\r\n$6\r\nEXISTS\r\n";
        AppendBulk(&flight.arena, key);
        reader.Expect();
        break;
      case OpKind::kDel:
        flight.arena += "*2\r\n$6\r\nUNLINK\r\n";
        AppendBulk(&flight.arena, key);
        reader.Expect();
        break;
      case OpKind::kSet: {
        flight.arena += options_.ttl_s > 0 ? "*5\r\n$3\r\nSET\r\n" : "*3\r\n$3\r\nSET\r\n";
        AppendBulk(&flight.arena, key);
        flight.arena += '$';
        flight.arena +=
            std::to_string(kValueHeaderBytes + batch.blocks[i].size() + kValueTrailerBytes);
        flight.arena += "\r\n";
        arena_mark(start);
        segs.push_back({batch.headers[i].data(), 0, kValueHeaderBytes});
        if (!batch.blocks[i].empty()) {
          segs.push_back({batch.blocks[i].data(), 0, batch.blocks[i].size()});
          flight.hash_segs.push_back(
              {stream + (flight.arena.size() - cmd_start_arena) + kValueHeaderBytes,
               batch.blocks[i].size(), i});
        }
        XXH3_64bits_reset(&batch.hashes[i]);
        if (batch.blocks[i].empty()) batch.trailers[i] = EncodeValueTrailer(Checksum64({}));
        segs.push_back({batch.trailers[i].data(), 0, kValueTrailerBytes});
        cmd_extra = kValueHeaderBytes + batch.blocks[i].size() + kValueTrailerBytes;
        start = flight.arena.size();
        flight.arena += "\r\n";
        if (options_.ttl_s > 0) {
          flight.arena += "$2\r\nEX\r\n";
          AppendBulk(&flight.arena, ttl);
        }
        reader.Expect();
        break;
      }
    }
    arena_mark(start);
    stream += flight.arena.size() - cmd_start_arena + cmd_extra;
    flight.cmd_end.push_back(stream);
    flight.replies.push_back(static_cast<int64_t>(i));
  }
  flight.iov.reserve(segs.size());
  for (const Seg& s : segs) {
    const void* base = s.ptr != nullptr ? s.ptr : flight.arena.data() + s.off;
    flight.iov.push_back(iovec{const_cast<void*>(base), s.len});
  }
}

void RemoteTier::ChecksumAhead(Batch& batch, Flight& f, uint64_t upto) {
  while (f.hash_pos < f.hash_segs.size()) {
    const Flight::HashSeg& seg = f.hash_segs[f.hash_pos];
    if (seg.begin + f.hashed >= upto) return;
    const uint64_t end = std::min(seg.len, upto - seg.begin);
    const std::byte* data = batch.blocks[seg.op].data();
    WideXxh3Update(&batch.hashes[seg.op], data + f.hashed, end - f.hashed);
    f.hashed = end;
    if (f.hashed < seg.len) return;
    batch.trailers[seg.op] = EncodeValueTrailer(XXH3_64bits_digest(&batch.hashes[seg.op]));
    ++f.hash_pos;
    f.hashed = 0;
  }
}

void RemoteTier::HandleReply(Batch& batch, size_t i, const NodeAddress& from, RespReply& reply,
                             std::vector<size_t>* again) {
  batch.asking[i] = 0;
  batch.target[i] = kNoNode;
  if (reply.type == RespReply::Type::kError) {
    std::optional<Redirect> redirect;
    {
      MutexLock lock(&topo_mu_);
      redirect = ParseRedirect(reply.text, from.host);
      if (redirect) {
        uint16_t n = InternNodeLocked(redirect->target);
        if (redirect->ask) {
          batch.target[i] = n;
          batch.asking[i] = 1;
        } else {
          slot_node_[redirect->slot] = n;
        }
      }
    }
    if (redirect) {
      (redirect->ask ? counters_.asks : counters_.moved).fetch_add(1, std::memory_order_relaxed);
      if (!redirect->ask) stale_.store(true, std::memory_order_relaxed);
      batch.results[i] = Status::Unavailable("remote: too many redirects, last: " + reply.text);
      again->push_back(i);
      return;
    }
    if (StartsWith(reply.text, "CLUSTERDOWN") || StartsWith(reply.text, "READONLY")) {
      stale_.store(true, std::memory_order_relaxed);
    }
    if (batch.kind == OpKind::kGet && StartsWith(reply.text, "WRONGTYPE")) {
      // Something else wrote a list or hash under a tier key: never served, and deleted like a
      // corrupt value, or the block would miss for ever (EXISTS still finds the key).
      batch.results[i] = Status::Corruption("remote value of " + batch.keys[i].ToHex() +
                                            ": not a string (" + reply.text + ")");
      batch.corrupt.push_back(i);
      return;
    }
    batch.results[i] = MapError(reply.text);
    return;
  }
  switch (batch.kind) {
    case OpKind::kGet:
      if (reply.type == RespReply::Type::kNil) {
        batch.results[i] = Status::NotFound("remote: no value for " + batch.keys[i].ToHex());
      } else if (reply.type == RespReply::Type::kBulk && reply.in_sink) {
        batch.results[i] =
            VerifyValueDigest(batch.headers[i], batch.out[i].size(), batch.trailers[i],
                              XXH3_64bits_digest(&batch.hashes[i]), batch.keys[i], fingerprint_);
        if (!batch.results[i].ok()) batch.corrupt.push_back(i);
      } else if (reply.type == RespReply::Type::kBulk) {
        batch.results[i] = Status::Corruption(
            "remote value of " + batch.keys[i].ToHex() + ": " + std::to_string(reply.bulk_bytes) +
            " bytes, expected " +
            std::to_string(kValueHeaderBytes + batch.out[i].size() + kValueTrailerBytes));
        batch.corrupt.push_back(i);
      } else {
        batch.results[i] = Status::Corruption("remote value of " + batch.keys[i].ToHex() +
                                              ": GET answered with a non-string reply");
        batch.corrupt.push_back(i);
      }
      break;
    case OpKind::kSet:
      batch.results[i] = reply.type == RespReply::Type::kStatus
                             ? Status::Ok()
                             : Status::Internal("remote: SET answered '" + reply.text + "'");
      break;
    case OpKind::kExists:
    case OpKind::kDel:
      if (reply.type == RespReply::Type::kInteger) {
        if (batch.kind == OpKind::kExists) batch.exists[i] = reply.integer > 0;
        batch.results[i] = Status::Ok();
      } else {
        batch.results[i] = Status::Internal("remote: expected an integer reply");
      }
      break;
  }
}

void RemoteTier::RunRound(Batch& batch, std::vector<size_t>& pending, int64_t deadline_ns) {
  // Group by node.
  std::vector<Flight> flights;
  {
    std::vector<int> flight_of;  // node index -> flight index
    MutexLock lock(&topo_mu_);
    flight_of.assign(nodes_.size(), -1);
    for (size_t i : pending) {
      uint16_t n = batch.target[i] != kNoNode ? batch.target[i] : slot_node_[batch.slots[i]];
      if (n == kNoNode || n >= nodes_.size()) {
        batch.results[i] = Status::Unavailable(
            "remote: hash slot " + std::to_string(batch.slots[i]) + " has no known master");
        stale_.store(true, std::memory_order_relaxed);
        continue;
      }
      if (flight_of[n] < 0) {
        flight_of[n] = static_cast<int>(flights.size());
        flights.emplace_back();
        flights.back().node = nodes_[n].get();
      }
      flights[flight_of[n]].ops.push_back(i);
    }
  }
  pending.clear();
  // Large values: several connections per node, each with a short window. Redis reads a big
  // argument straight into its final string only when it is alone in the query buffer, so
  // pipelined multi-MiB SETs cost the server copies; parallel connections keep it busy instead.
  const bool big =
      block_bytes() >= kBigValueBytes && (batch.kind == OpKind::kSet || batch.kind == OpKind::kGet);
  if (big) {
    const size_t per_node = static_cast<size_t>(options_.connections_per_node);
    const size_t window =
        static_cast<size_t>(batch.kind == OpKind::kSet ? options_.set_window : options_.get_window);
    std::vector<Flight> split;
    for (Flight& f : flights) {
      size_t parts = std::min(per_node, f.ops.size());
      size_t first = split.size();
      for (size_t p = 0; p < parts; ++p) {
        split.emplace_back();
        split.back().node = f.node;
        split.back().window = window;
      }
      for (size_t j = 0; j < f.ops.size(); ++j) split[first + j % parts].ops.push_back(f.ops[j]);
    }
    flights = std::move(split);
  }

  auto fail_rest = [&](Flight& f, const Status& s) {
    // Every op whose reply has not arrived gets s.
    for (size_t r = f.next_reply; r < f.replies.size(); ++r) {
      if (f.replies[r] >= 0) batch.results[f.replies[r]] = s;
    }
    if (f.replies.empty()) {
      for (size_t i : f.ops) batch.results[i] = s;
    }
    f.done = true;
  };
  auto fail_flight = [&](Flight& f, const Status& s) {
    fail_rest(f, s);
    Release(f.node, std::move(f.conn), false);
    stale_.store(true, std::memory_order_relaxed);
  };

  std::vector<std::pair<Node*, Status>> unreachable;  // one failed connect fails the node's rest
  for (Flight& f : flights) {
    auto known = std::find_if(unreachable.begin(), unreachable.end(),
                              [&](const auto& u) { return u.first == f.node; });
    if (known != unreachable.end()) {
      fail_rest(f, known->second);
      continue;
    }
    Result<std::unique_ptr<RedisConnection>> conn = Acquire(f.node, deadline_ns);
    if (!conn.ok()) {
      fail_rest(f, conn.status());
      unreachable.emplace_back(f.node, conn.status());
      if (conn.status().code() != StatusCode::kInvalidArgument) {
        stale_.store(true, std::memory_order_relaxed);
      }
      continue;
    }
    f.conn = std::move(*conn);
    BuildFlight(batch, f);
  }

  const uint64_t hash_ahead = std::max<uint64_t>(kChecksumAheadBytes, block_bytes());
  std::vector<pollfd> pfds;
  std::vector<Flight*> polled;
  while (true) {
    pfds.clear();
    polled.clear();
    for (Flight& f : flights) {
      if (f.done) continue;
      short events = 0;
      if (f.sent < f.SendLimit()) events |= POLLOUT;
      if (f.next_reply < f.replies.size()) {
        events |= POLLIN;
        // While a block streams in, wake only once a large stretch of it has arrived: fewer
        // wakeups and larger reads. Only bytes the reply must still carry are waited for.
        f.conn->SetRecvLowWater(static_cast<int>(
            std::clamp<size_t>(f.conn->reader().DirectBytesDue(), 1, kRecvLowWaterBytes)));
      }
      pfds.push_back(pollfd{f.conn->fd(), events, 0});
      polled.push_back(&f);
    }
    if (pfds.empty()) break;
    int64_t left = deadline_ns - SteadyNowNs();
    if (left <= 0) {
      for (Flight* f : polled) {
        const uint64_t total = counters_.timeouts.fetch_add(1, std::memory_order_relaxed) + 1;
        const std::string why = "remote " + f->node->address.ToString() + ": timed out after " +
                                std::to_string(options_.timeout_ms) + " ms";
        if (timeout_log_.Allow()) {
          spdlog::warn("remote tier '{}': {} ({} deadline hits so far; logged at most every {} s)",
                       name(), why, total, LogLimiter::kIntervalS);
        }
        fail_flight(*f, Status::Unavailable(why));
      }
      break;
    }
    int rc = poll(pfds.data(), pfds.size(), static_cast<int>((left + kMs - 1) / kMs));
    if (rc < 0 && errno != EINTR) {
      for (Flight* f : polled)
        fail_flight(*f, Status::Internal("poll: " + std::string(strerror(errno))));
      break;
    }
    if (rc <= 0) continue;
    for (size_t p = 0; p < pfds.size(); ++p) {
      Flight& f = *polled[p];
      short rev = pfds[p].revents;
      if (rev == 0) continue;
      Status io;
      if (rev & (POLLOUT | POLLERR | POLLHUP)) {
        iovec part[kMaxIov];
        for (uint64_t limit = f.SendLimit(); f.sent < limit;) {
          // Checksum the next stretch of block bytes, then send no further than that.
          ChecksumAhead(batch, f, std::min(limit, f.sent + hash_ahead));
          const uint64_t cap = std::min(limit, f.HashedFrontier());
          // The window's bytes only: copy the iovecs, cutting the last one short.
          size_t count = 0;
          uint64_t room = cap - f.sent;
          for (size_t v = f.iov_pos; v < f.iov.size() && count < kMaxIov && room > 0; ++v) {
            part[count] = f.iov[v];
            if (part[count].iov_len > room) part[count].iov_len = room;
            room -= part[count].iov_len;
            ++count;
          }
          msghdr msg{};
          msg.msg_iov = part;
          msg.msg_iovlen = count;
          ssize_t n = sendmsg(f.conn->fd(), &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
          if (n < 0) {
            if (errno == EINTR) continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK) {
              io = Status::Unavailable("remote " + f.node->address.ToString() +
                                       ": send: " + strerror(errno));
            }
            break;
          }
          size_t left_n = static_cast<size_t>(n);
          f.sent += left_n;
          while (left_n > 0) {
            iovec& v = f.iov[f.iov_pos];
            if (left_n >= v.iov_len) {
              left_n -= v.iov_len;
              ++f.iov_pos;
            } else {
              v.iov_base = static_cast<char*>(v.iov_base) + left_n;
              v.iov_len -= left_n;
              left_n = 0;
            }
          }
        }
      }
      RespReader& reader = f.conn->reader();
      if (io.ok() && (rev & (POLLIN | POLLERR | POLLHUP)) && f.next_reply < f.replies.size()) {
        while (reader.outstanding() > 0) {
          std::span<std::byte> target = reader.ReadTarget();
          ssize_t n = recv(f.conn->fd(), target.data(), target.size(), MSG_DONTWAIT);
          if (n < 0) {
            if (errno == EINTR) continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK) {
              io = Status::Unavailable("remote " + f.node->address.ToString() +
                                       ": recv: " + strerror(errno));
            }
            break;
          }
          if (n == 0) {
            io = Status::Unavailable("remote " + f.node->address.ToString() +
                                     ": connection closed by the server");
            break;
          }
          Status parsed = reader.Commit(static_cast<size_t>(n));
          RespReply reply;
          while (reader.Next(&reply)) {
            int64_t op = f.replies[f.next_reply++];
            if (op >= 0)
              HandleReply(batch, static_cast<size_t>(op), f.node->address, reply, &pending);
          }
          if (!parsed.ok()) {
            io = Status::Unavailable("remote " + f.node->address.ToString() + ": " +
                                     parsed.ToString());
            break;
          }
        }
      }
      if (!io.ok()) {
        counters_.io_failures.fetch_add(1, std::memory_order_relaxed);
        fail_flight(f, io);
        continue;
      }
      if (f.next_reply == f.replies.size() && f.sent == f.SendLimit()) {
        f.done = true;
        Release(f.node, std::move(f.conn), true);
      }
    }
  }
}

void RemoteTier::Route(Batch& batch) const {
  const size_t n = batch.keys.size();
  batch.rkeys.resize(n);
  batch.slots.resize(n);
  batch.target.assign(n, kNoNode);
  batch.asking.assign(n, 0);
  for (size_t i = 0; i < n; ++i) {
    batch.rkeys[i] = RedisKeyOf(options_.key_prefix, batch.keys[i]);
    batch.slots[i] = KeyHashSlot(batch.rkeys[i]);
  }
}

void RemoteTier::Run(Batch& batch) {
  const size_t n = batch.keys.size();
  int64_t deadline = SteadyNowNs() + int64_t{options_.timeout_ms} * kMs;
  Route(batch);
  MaybeRefresh(deadline);
  std::vector<size_t> pending;
  for (size_t i = 0; i < n; ++i) {
    if (batch.results[i].ok()) pending.push_back(i);  // non-OK: rejected before the wire
  }
  for (int round = 0; round <= options_.max_redirects && !pending.empty(); ++round) {
    if (round > 0) MaybeRefresh(deadline);
    RunRound(batch, pending, deadline);
  }
  // Ops still pending carry their "too many redirects" status.
  if (!batch.corrupt.empty()) DropCorrupt(batch, deadline);
}

void RemoteTier::DropCorrupt(Batch& batch, int64_t deadline_ns) {
  const uint64_t total =
      counters_.corruptions.fetch_add(batch.corrupt.size(), std::memory_order_relaxed) +
      batch.corrupt.size();
  if (corruption_log_.Allow()) {
    spdlog::warn(
        "remote tier '{}': {} value(s) failed verification and are deleted, e.g. {} ({} "
        "so far; logged at most every {} s)",
        name(), batch.corrupt.size(), batch.results[batch.corrupt[0]].message(), total,
        LogLimiter::kIntervalS);
  }
  std::vector<BlockKey> keys;
  for (size_t i : batch.corrupt) keys.push_back(batch.keys[i]);
  Batch del(OpKind::kDel, keys);
  Route(del);
  std::vector<size_t> pending(keys.size());
  for (size_t i = 0; i < pending.size(); ++i) pending[i] = i;
  // Best effort, within what is left of the caller's deadline: a failed delete only means
  // the next reader finds (and rejects) the bad value again.
  RunRound(del, pending, deadline_ns);
  std::vector<BlockKey> dropped;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (del.results[i].ok()) dropped.push_back(keys[i]);
  }
  if (!dropped.empty()) NotifyRemoved(dropped);
}

// ---------------------------------------------------------------------------------------------
// Tier interface

void RemoteTier::PutImpl(std::span<const BlockKey> keys, std::span<const ConstBlock> blocks,
                         std::span<Status> results) {
  Batch batch(OpKind::kSet, keys, results);
  batch.blocks = blocks;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (blocks[i].size() != block_bytes()) {
      results[i] =
          Status::InvalidArgument("remote put: block of " + std::to_string(blocks[i].size()) +
                                  " bytes, expected " + std::to_string(block_bytes()));
      continue;
    }
    results[i] = Status::Ok();
    // The checksum goes in the trailer, computed as the block is sent.
    batch.headers[i] = EncodeValueHeader(ValueHeader{keys[i], fingerprint_, blocks[i].size()});
  }
  Run(batch);
}

void RemoteTier::GetImpl(std::span<const BlockKey> keys, std::span<const MutableBlock> out,
                         std::span<Status> results) {
  Batch batch(OpKind::kGet, keys, results);
  batch.out = out;
  for (size_t i = 0; i < keys.size(); ++i) {
    results[i] =
        out[i].size() == block_bytes()
            ? Status::Ok()
            : Status::InvalidArgument("remote get: buffer of " + std::to_string(out[i].size()) +
                                      " bytes, expected " + std::to_string(block_bytes()));
  }
  Run(batch);
}

Status RemoteTier::ExistsImpl(std::span<const BlockKey> keys, std::span<bool> out) {
  Batch batch(OpKind::kExists, keys);
  batch.exists = out;
  for (size_t i = 0; i < keys.size(); ++i) out[i] = false;
  Run(batch);
  // A key whose node could not answer reads as absent (a miss is always safe for a cache);
  // only when no key could be answered does the call fail.
  const Status* failure = nullptr;
  size_t answered = 0;
  for (const Status& s : batch.owned_results) {
    if (s.ok()) {
      ++answered;
    } else if (failure == nullptr) {
      failure = &s;
    }
  }
  if (failure != nullptr && answered == 0) return *failure;
  return Status::Ok();
}

Status RemoteTier::EraseImpl(std::span<const BlockKey> keys) {
  Batch batch(OpKind::kDel, keys);
  Run(batch);
  for (const Status& s : batch.owned_results) {
    if (!s.ok()) return s;
  }
  return Status::Ok();
}

uint64_t RemoteTier::UsedBytesImpl() const {
  int64_t now = SteadyNowNs();
  if (now - usage_at_ns_.load(std::memory_order_relaxed) < kUsageIntervalNs) {
    return used_bytes_.load(std::memory_order_relaxed);
  }
  std::unique_lock<std::mutex> lock(usage_mu_, std::try_to_lock);
  if (!lock.owns_lock()) return used_bytes_.load(std::memory_order_relaxed);
  usage_at_ns_.store(now, std::memory_order_relaxed);
  std::vector<Node*> nodes;
  {
    MutexLock topo(&topo_mu_);
    std::vector<uint8_t> serving(nodes_.size(), 0);
    for (uint16_t n : slot_node_) {
      if (n != kNoNode) serving[n] = 1;
    }
    for (size_t i = 0; i < nodes_.size(); ++i) {
      if (serving[i]) nodes.push_back(nodes_[i].get());
    }
  }
  // used_memory of every master: Redis's own count, which includes other replicas' blocks.
  uint64_t total = 0;
  int64_t deadline = now + std::min<int64_t>(int64_t{options_.timeout_ms} * kMs, 200 * kMs);
  for (Node* node : nodes) {
    Result<ReplyPtr> reply = CommandOn(node, {"INFO", "memory"}, deadline);
    if (!reply.ok()) continue;
    const redisReply* r = reply->get();
    if (r->type == REDIS_REPLY_STRING) {
      std::string_view text(r->str, r->len);
      size_t at = text.find("used_memory:");
      if (at != std::string_view::npos) {
        text.remove_prefix(at + 12);
        uint64_t v = 0;
        std::from_chars(text.data(), text.data() + text.size(), v);
        total += v;
      }
    }
  }
  used_bytes_.store(total, std::memory_order_relaxed);
  return total;
}

TierCapabilities RemoteTier::CapabilitiesImpl() const {
  TierCapabilities caps;
  caps.stores_bytes = true;
  caps.managed_by_cache = false;  // Redis evicts by itself (maxmemory policy, TTL)
  caps.authoritative = false;     // other replicas add and drop blocks
  caps.persistent = false;        // whether Redis persists is the server's configuration
  caps.shared = true;
  caps.verify_on_load = true;
  caps.verifies_reads = true;  // every value's header key and XXH3 trailer are checked on read
  return caps;
}

RemoteStats RemoteTier::remote_stats() const {
  RemoteStats s;
  {
    MutexLock lock(&topo_mu_);
    s.cluster = cluster_;
    s.nodes = static_cast<int>(nodes_.size());
  }
  auto r = [](const std::atomic<uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  s.connects = r(counters_.connects);
  s.connect_failures = r(counters_.connect_failures);
  s.moved = r(counters_.moved);
  s.asks = r(counters_.asks);
  s.topology_refreshes = r(counters_.topology_refreshes);
  s.breaker_opens = r(counters_.breaker_opens);
  s.fast_failures = r(counters_.fast_failures);
  s.timeouts = r(counters_.timeouts);
  s.io_failures = r(counters_.io_failures);
  s.corruptions = r(counters_.corruptions);
  s.oom_rejections = r(counters_.oom_rejections);
  return s;
}

}  // namespace kvtier::remote
