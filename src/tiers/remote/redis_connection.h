// RedisConnection: one TCP connection to one Redis / Valkey node.
//
// Setup and control commands (AUTH, SELECT, CLUSTER SLOTS, INFO) go through hiredis's blocking
// API, bounded by the op timeout. The pipelined data path does its own non-blocking I/O on fd()
// with the RespReader, so block bytes move between the socket and the caller's buffers without
// hiredis's intermediate copies. The two are never mixed within one command exchange: the
// hiredis buffers are empty whenever the data path runs.
//
// Thread-safety: not thread-safe; a connection is used by one thread at a time (RemoteTier
// lends it out of a per-node pool). Ownership: owns its socket and hiredis context.
#ifndef KVTIER_TIERS_REMOTE_REDIS_CONNECTION_H_
#define KVTIER_TIERS_REMOTE_REDIS_CONNECTION_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kvtier/status.h"
#include "tiers/remote/cluster_slots.h"
#include "tiers/remote/resp_reader.h"

struct redisContext;
struct redisReply;

namespace kvtier::remote {

// Steady-clock nanoseconds: the time base of deadlines and the circuit breaker.
int64_t SteadyNowNs();

struct ConnectionOptions {
  int64_t connect_timeout_ns = 500'000'000;
  int64_t op_timeout_ns = 1'000'000'000;
  std::string user;      // ACL user; empty: AUTH <password> alone
  std::string password;  // empty: no AUTH
  int db = 0;            // SELECT when not 0
};

struct ReplyDeleter {
  void operator()(redisReply* reply) const;
};
using ReplyPtr = std::unique_ptr<redisReply, ReplyDeleter>;

class RedisConnection {
 public:
  // Connects within min(connect timeout, deadline - now), then AUTHs and SELECTs.
  // Unavailable when the node cannot be reached in time; InvalidArgument naming "password" or
  // "user" when AUTH is refused.
  static Result<std::unique_ptr<RedisConnection>> Open(const NodeAddress& address,
                                                       const ConnectionOptions& options,
                                                       int64_t deadline_ns);
  ~RedisConnection();
  RedisConnection(const RedisConnection&) = delete;
  RedisConnection& operator=(const RedisConnection&) = delete;

  // One command through hiredis, its whole reply read by deadline_ns (steady clock). Unavailable
  // when the connection failed or the deadline passed ("timed out after N ms"; the connection
  // is then unusable); an error reply is returned as a reply, not as a Status.
  Result<ReplyPtr> Command(const std::vector<std::string>& argv, int64_t deadline_ns);

  int fd() const;
  const NodeAddress& address() const { return address_; }
  // The socket's SO_RCVLOWAT: poll() and recv() wait until this many bytes are queued. Raised
  // only while a reply is known to carry at least that many more bytes; Command() and a return
  // to the pool put it back to 1. A failed setsockopt leaves it as it was (a hint only).
  void SetRecvLowWater(int bytes);
  RespReader& reader() { return reader_; }

  // True when the peer closed the connection or it is otherwise unusable (checked without
  // blocking): a pooled connection to a node that restarted.
  bool Dead() const;

 private:
  RedisConnection(NodeAddress address, redisContext* context);

  NodeAddress address_;
  redisContext* context_;
  RespReader reader_;
  int rcv_lowat_ = 1;
};

}  // namespace kvtier::remote

#endif  // KVTIER_TIERS_REMOTE_REDIS_CONNECTION_H_
