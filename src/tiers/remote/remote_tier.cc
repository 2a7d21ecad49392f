// RemoteTier as a Tier: Put, Get, Exists and Erase over the pipelined batch, and its usage
// and stats.
#include "tiers/remote/remote_tier.h"

#include <hiredis/hiredis.h>

#include <algorithm>
#include <charconv>
#include <string>

#include "tiers/remote/remote_tier_internal.h"
#include "tiers/remote/value_format.h"

namespace kvtier::remote {
namespace {

// How often the used bytes are read from the servers at most.
constexpr int64_t kUsageIntervalNs = 1000 * kMs;

}  // namespace

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
  if (!usage_mu_.TryLock()) return used_bytes_.load(std::memory_order_relaxed);
  MutexLock lock(&usage_mu_, std::adopt_lock);
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
  // used_memory of every master: Redis's own count, which includes other replicas' blocks and
  // the server's own memory (megabytes when empty: not a count of blocks). The blocks are
  // counted apart, as the keys of each master's database (DBSIZE).
  uint64_t total = 0, keys = 0;
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
    Result<ReplyPtr> size = CommandOn(node, {"DBSIZE"}, deadline);
    if (size.ok() && (*size)->type == REDIS_REPLY_INTEGER && (*size)->integer > 0) {
      keys += static_cast<uint64_t>((*size)->integer);
    }
  }
  used_bytes_.store(total, std::memory_order_relaxed);
  resident_blocks_.store(keys, std::memory_order_relaxed);
  return total;
}

uint64_t RemoteTier::ResidentBlocksImpl(uint64_t) const {
  return resident_blocks_.load(std::memory_order_relaxed);
}

TierCapabilities RemoteTier::CapabilitiesImpl() const {
  TierCapabilities caps;
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

void RemoteTier::CountersImpl(std::vector<TierStats::Counter>* out) const {
  const RemoteStats s = remote_stats();
  out->insert(
      out->end(),
      {{"remote_connects", "Connections the remote tier opened", s.connects},
       {"remote_connect_failures", "Connections that failed", s.connect_failures},
       {"remote_moved", "MOVED redirects followed", s.moved},
       {"remote_asks", "ASK redirects followed", s.asks},
       {"remote_topology_refreshes", "CLUSTER SLOTS reads", s.topology_refreshes},
       {"remote_breaker_opens", "Node circuit breakers opened", s.breaker_opens},
       {"remote_fast_failures", "Calls refused by an open breaker", s.fast_failures},
       {"remote_timeouts", "Node exchanges past their deadline", s.timeouts},
       {"remote_io_failures", "Node exchanges that broke", s.io_failures},
       {"remote_corruptions", "Values that failed verification and were deleted", s.corruptions},
       {"remote_oom_rejections", "Writes refused by the server's maxmemory", s.oom_rejections}});
}

}  // namespace kvtier::remote
