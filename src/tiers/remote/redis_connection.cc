#include "tiers/remote/redis_connection.h"

#include <hiredis/hiredis.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <limits>

#include "common/clock.h"

namespace kvtier::remote {
namespace {

timeval ToTimeval(int64_t ns) {
  ns = std::max<int64_t>(ns, 1'000'000);  // hiredis treats 0 as "no timeout"
  timeval tv;
  tv.tv_sec = static_cast<time_t>(ns / 1'000'000'000);
  tv.tv_usec = static_cast<suseconds_t>((ns % 1'000'000'000) / 1000);
  return tv;
}

std::string ReplyText(const redisReply* r) {
  return r->str != nullptr ? std::string(r->str, r->len) : std::string();
}

}  // namespace

int64_t SteadyNowNs() { return static_cast<int64_t>(MonotonicNs()); }

void ReplyDeleter::operator()(redisReply* reply) const { freeReplyObject(reply); }

RedisConnection::RedisConnection(NodeAddress address, redisContext* context)
    : address_(std::move(address)), context_(context) {}

RedisConnection::~RedisConnection() { redisFree(context_); }

int RedisConnection::fd() const { return context_->fd; }

Result<std::unique_ptr<RedisConnection>> RedisConnection::Open(const NodeAddress& address,
                                                               const ConnectionOptions& options,
                                                               int64_t deadline_ns) {
  int64_t budget = std::min(options.connect_timeout_ns, deadline_ns - SteadyNowNs());
  if (budget <= 0) return Status::Unavailable("remote " + address.ToString() + ": deadline passed");
  redisContext* c = redisConnectWithTimeout(address.host.c_str(), address.port, ToTimeval(budget));
  if (c == nullptr) return Status::Unavailable("remote " + address.ToString() + ": out of memory");
  if (c->err) {
    Status s = Status::Unavailable("remote " + address.ToString() + ": connect: " + c->errstr);
    redisFree(c);
    return s;
  }
  std::unique_ptr<RedisConnection> conn(new RedisConnection(address, c));
  if (redisSetTimeout(c, ToTimeval(options.op_timeout_ns)) != REDIS_OK) {
    return Status::Unavailable("remote " + address.ToString() + ": cannot set timeouts");
  }
  if (!options.password.empty()) {
    std::vector<std::string> argv = {"AUTH"};
    if (!options.user.empty()) argv.push_back(options.user);
    argv.push_back(options.password);
    KVTIER_ASSIGN_OR_RETURN(ReplyPtr reply, conn->Command(argv, deadline_ns));
    if (reply->type == REDIS_REPLY_ERROR) {
      return Status::InvalidArgument(std::string(options.user.empty() ? "password" : "user") +
                                     ": AUTH refused by " + address.ToString() + ": " +
                                     ReplyText(reply.get()));
    }
  }
  if (options.db != 0) {
    KVTIER_ASSIGN_OR_RETURN(ReplyPtr reply,
                            conn->Command({"SELECT", std::to_string(options.db)}, deadline_ns));
    if (reply->type == REDIS_REPLY_ERROR) {
      return Status::InvalidArgument("url: SELECT " + std::to_string(options.db) + " refused by " +
                                     address.ToString() + ": " + ReplyText(reply.get()));
    }
  }
  return conn;
}

Result<ReplyPtr> RedisConnection::Command(const std::vector<std::string>& argv,
                                          int64_t deadline_ns) {
  SetRecvLowWater(1);  // hiredis reads replies of any length
  const int64_t start = SteadyNowNs();
  const std::string what = "remote " + address_.ToString() + ": " + argv[0] + ": ";
  auto failed = [&](const char* fallback) {
    return Status::Unavailable(what + (context_->err ? context_->errstr : fallback));
  };
  // hiredis's blocking call bounds each read by the socket timeout, not the whole reply: a
  // server that drips a byte at a time held it for ever. Here the reply must be whole by the
  // deadline; past it the connection is out of step and the caller drops it.
  auto wait = [&](short events) -> Status {
    const int64_t left = deadline_ns - SteadyNowNs();
    pollfd p{context_->fd, events, 0};
    int n = 0;
    if (left > 0) {
      do {
        n = ::poll(&p, 1,
                   static_cast<int>(std::min<int64_t>((left + 999'999) / 1'000'000,
                                                      std::numeric_limits<int>::max())));
      } while (n < 0 && errno == EINTR);
    }
    if (n > 0) return Status::Ok();
    if (n < 0) return Status::Unavailable(what + "poll: " + std::strerror(errno));
    return Status::Unavailable(what + "timed out after " +
                               std::to_string((SteadyNowNs() - start) / 1'000'000) + " ms");
  };
  std::vector<const char*> args;
  std::vector<size_t> lens;
  for (const std::string& a : argv) {
    args.push_back(a.data());
    lens.push_back(a.size());
  }
  if (redisAppendCommandArgv(context_, static_cast<int>(args.size()), args.data(), lens.data()) !=
      REDIS_OK) {
    return failed("cannot queue the command");
  }
  for (int done = 0; !done;) {
    if (redisBufferWrite(context_, &done) != REDIS_OK) return failed("write failed");
    if (!done) KVTIER_RETURN_IF_ERROR(wait(POLLOUT));
  }
  void* raw = nullptr;
  for (;;) {
    if (redisGetReplyFromReader(context_, &raw) != REDIS_OK) return failed("bad reply");
    if (raw != nullptr) break;
    KVTIER_RETURN_IF_ERROR(wait(POLLIN));
    if (redisBufferRead(context_) != REDIS_OK) return failed("read failed");
  }
  return ReplyPtr(static_cast<redisReply*>(raw));
}

void RedisConnection::SetRecvLowWater(int bytes) {
  if (bytes == rcv_lowat_) return;
  if (setsockopt(fd(), SOL_SOCKET, SO_RCVLOWAT, &bytes, sizeof(bytes)) == 0) rcv_lowat_ = bytes;
}

bool RedisConnection::Dead() const {
  if (context_->err) return true;
  char byte;
  ssize_t n = recv(context_->fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n == 0) return true;  // orderly shutdown by the peer
  if (n < 0) return errno != EAGAIN && errno != EWOULDBLOCK;
  return true;  // bytes nobody asked for: the stream is out of step
}

}  // namespace kvtier::remote
