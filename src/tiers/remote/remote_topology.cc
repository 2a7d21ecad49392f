// RemoteTier's opening and topology: discovery of a standalone server or a cluster, the
// slot map, and its refresh after MOVED or a node failure.
#include <hiredis/hiredis.h>

#include <algorithm>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "tiers/remote/remote_tier_internal.h"

namespace kvtier::remote {
namespace {

// After a MOVED or a node failure, CLUSTER SLOTS is read again at most this often.
constexpr int64_t kRefreshIntervalNs = 100 * kMs;

}  // namespace

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
  MutexLock refresh(&refresh_mu_);
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
  MutexLock refresh(&refresh_mu_);
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
  if (!refresh_mu_.TryLock()) return;  // another call is refreshing; route with what we have
  MutexLock refresh(&refresh_mu_, std::adopt_lock);
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

}  // namespace kvtier::remote
