// RemoteTier's connection pool: idle connections per node, behind the node's circuit breaker.
#include <algorithm>
#include <memory>

#include "tiers/remote/remote_tier_internal.h"

namespace kvtier::remote {

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

}  // namespace kvtier::remote
