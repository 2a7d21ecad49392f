// RemoteTier's pipelined batch: commands grouped by node, sent and read on non-blocking
// sockets under one deadline, redirects followed round by round.
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "common/log_limiter.h"
#include "hash/xxh.h"
#include "hash/xxh3_wide.h"
#include "tiers/remote/remote_tier_internal.h"
#include "tiers/remote/value_format.h"

namespace kvtier::remote {
namespace {

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

}  // namespace

Status RemoteTier::MapError(const std::string& error) const {
  if (StartsWith(error, "OOM")) {
    // Counted and said: a server at maxmemory with noeviction refuses every write from then on,
    // and a counter alone went unnoticed.
    const uint64_t total = counters_.oom_rejections.fetch_add(1, std::memory_order_relaxed) + 1;
    if (oom_log_.Allow()) {
      spdlog::warn(
          "remote tier '{}': a write was refused for room: {} ({} refused so far: the server is "
          "at its maxmemory; raise it or use an evicting maxmemory-policy; logged at most every "
          "{} s)",
          name(), error, total, LogLimiter::kIntervalS);
    }
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
  std::vector<Flight> flights;
  GroupFlights(batch, pending, &flights);
  pending.clear();
  // Large values: several connections per node, each with a short window. Redis reads a big
  // argument straight into its final string only when it is alone in the query buffer, so
  // pipelined multi-MiB SETs cost the server copies; parallel connections keep it busy instead.
  const bool big =
      block_bytes() >= kBigValueBytes && (batch.kind == OpKind::kSet || batch.kind == OpKind::kGet);
  if (big) SplitBigFlights(batch, &flights);
  ConnectFlights(batch, flights, deadline_ns);
  PumpFlights(batch, flights, &pending, deadline_ns);
}

void RemoteTier::GroupFlights(Batch& batch, const std::vector<size_t>& pending,
                              std::vector<Flight>* flights) {
  std::vector<int> flight_of;  // node index -> flight index
  MutexLock lock(&topo_mu_);
  flight_of.assign(nodes_.size(), -1);
  for (size_t i : pending) {
    uint16_t n = batch.target[i] != kNoNode ? batch.target[i] : slot_node_[batch.slots[i]];
    if (n == kNoNode || n >= nodes_.size()) {
      batch.results[i] = Status::Unavailable("remote: hash slot " + std::to_string(batch.slots[i]) +
                                             " has no known master");
      stale_.store(true, std::memory_order_relaxed);
      continue;
    }
    if (flight_of[n] < 0) {
      flight_of[n] = static_cast<int>(flights->size());
      flights->emplace_back();
      flights->back().node = nodes_[n].get();
    }
    (*flights)[flight_of[n]].ops.push_back(i);
  }
}

void RemoteTier::SplitBigFlights(const Batch& batch, std::vector<Flight>* flights) const {
  const size_t per_node = static_cast<size_t>(options_.connections_per_node);
  const size_t window =
      static_cast<size_t>(batch.kind == OpKind::kSet ? options_.set_window : options_.get_window);
  std::vector<Flight> split;
  for (Flight& f : *flights) {
    size_t parts = std::min(per_node, f.ops.size());
    size_t first = split.size();
    for (size_t p = 0; p < parts; ++p) {
      split.emplace_back();
      split.back().node = f.node;
      split.back().window = window;
    }
    for (size_t j = 0; j < f.ops.size(); ++j) split[first + j % parts].ops.push_back(f.ops[j]);
  }
  *flights = std::move(split);
}

void RemoteTier::FailRest(Batch& batch, Flight& f, const Status& s) {
  // Every op whose reply has not arrived gets s.
  for (size_t r = f.next_reply; r < f.replies.size(); ++r) {
    if (f.replies[r] >= 0) batch.results[f.replies[r]] = s;
  }
  if (f.replies.empty()) {
    for (size_t i : f.ops) batch.results[i] = s;
  }
  f.done = true;
}

void RemoteTier::FailFlight(Batch& batch, Flight& f, const Status& s) {
  FailRest(batch, f, s);
  Release(f.node, std::move(f.conn), false);
  stale_.store(true, std::memory_order_relaxed);
}

void RemoteTier::ConnectFlights(Batch& batch, std::vector<Flight>& flights, int64_t deadline_ns) {
  std::vector<std::pair<Node*, Status>> unreachable;  // one failed connect fails the node's rest
  for (Flight& f : flights) {
    auto known = std::find_if(unreachable.begin(), unreachable.end(),
                              [&](const auto& u) { return u.first == f.node; });
    if (known != unreachable.end()) {
      FailRest(batch, f, known->second);
      continue;
    }
    Result<std::unique_ptr<RedisConnection>> conn = Acquire(f.node, deadline_ns);
    if (!conn.ok()) {
      FailRest(batch, f, conn.status());
      unreachable.emplace_back(f.node, conn.status());
      if (conn.status().code() != StatusCode::kInvalidArgument) {
        stale_.store(true, std::memory_order_relaxed);
      }
      continue;
    }
    f.conn = std::move(*conn);
    BuildFlight(batch, f);
  }
}

void RemoteTier::PumpFlights(Batch& batch, std::vector<Flight>& flights,
                             std::vector<size_t>* pending, int64_t deadline_ns) {
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
        FailFlight(batch, *f, Status::Unavailable(why));
      }
      break;
    }
    int rc = poll(pfds.data(), pfds.size(), static_cast<int>((left + kMs - 1) / kMs));
    if (rc < 0 && errno != EINTR) {
      for (Flight* f : polled)
        FailFlight(batch, *f, Status::Internal("poll: " + std::string(strerror(errno))));
      break;
    }
    if (rc <= 0) continue;
    for (size_t p = 0; p < pfds.size(); ++p) {
      Flight& f = *polled[p];
      short rev = pfds[p].revents;
      if (rev == 0) continue;
      Status io;
      if (rev & (POLLOUT | POLLERR | POLLHUP)) io = SendSome(batch, f, hash_ahead);
      if (io.ok() && (rev & (POLLIN | POLLERR | POLLHUP)) && f.next_reply < f.replies.size()) {
        io = ReceiveSome(batch, f, pending);
      }
      if (!io.ok()) {
        counters_.io_failures.fetch_add(1, std::memory_order_relaxed);
        FailFlight(batch, f, io);
        continue;
      }
      if (f.next_reply == f.replies.size() && f.sent == f.SendLimit()) {
        f.done = true;
        Release(f.node, std::move(f.conn), true);
      }
    }
  }
}

Status RemoteTier::SendSome(Batch& batch, Flight& f, uint64_t hash_ahead) {
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
        return Status::Unavailable("remote " + f.node->address.ToString() +
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
  return Status::Ok();
}

Status RemoteTier::ReceiveSome(Batch& batch, Flight& f, std::vector<size_t>* pending) {
  RespReader& reader = f.conn->reader();
  while (reader.outstanding() > 0) {
    std::span<std::byte> target = reader.ReadTarget();
    ssize_t n = recv(f.conn->fd(), target.data(), target.size(), MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        return Status::Unavailable("remote " + f.node->address.ToString() +
                                   ": recv: " + strerror(errno));
      }
      break;
    }
    if (n == 0) {
      return Status::Unavailable("remote " + f.node->address.ToString() +
                                 ": connection closed by the server");
    }
    Status parsed = reader.Commit(static_cast<size_t>(n));
    RespReply reply;
    while (reader.Next(&reply)) {
      int64_t op = f.replies[f.next_reply++];
      if (op >= 0) HandleReply(batch, static_cast<size_t>(op), f.node->address, reply, pending);
    }
    if (!parsed.ok()) {
      return Status::Unavailable("remote " + f.node->address.ToString() + ": " + parsed.ToString());
    }
  }
  return Status::Ok();
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

}  // namespace kvtier::remote
