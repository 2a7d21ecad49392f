// RemoteTier's internals shared by its files (options, topology, pool, batch, tier): the
// per-node state with its breaker, and the pipelined batch with its per-connection flights.
// Internal to src/tiers/remote/.
//
// Thread-safety: Node is guarded by its mu (as annotated); a Batch and its Flights belong to
// the one call that runs them.
#ifndef KVTIER_TIERS_REMOTE_REMOTE_TIER_INTERNAL_H_
#define KVTIER_TIERS_REMOTE_REMOTE_TIER_INTERNAL_H_

#include <sys/uio.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <spdlog/spdlog.h>

#include "hash/xxh.h"
#include "tiers/remote/remote_tier.h"
#include "tiers/remote/value_format.h"

namespace kvtier::remote {

inline constexpr int64_t kMs = 1'000'000;

inline bool StartsWith(const std::string& s, std::string_view prefix) {
  return s.starts_with(prefix);
}

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

}  // namespace kvtier::remote

#endif  // KVTIER_TIERS_REMOTE_REMOTE_TIER_INTERNAL_H_
