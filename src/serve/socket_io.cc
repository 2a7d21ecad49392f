#include "serve/socket_io.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/clock.h"

namespace kvtier::serve {
namespace {

// Waits for `events` on fd; OK when ready.
Status Wait(int fd, short events, uint64_t deadline_ns, int wake_fd) {
  for (;;) {
    int timeout_ms = -1;
    if (deadline_ns != 0) {
      const uint64_t now = MonotonicNs();
      if (now >= deadline_ns) return Status::Unavailable("timed out");
      timeout_ms = static_cast<int>((deadline_ns - now + 999999) / 1000000);
    }
    pollfd p[2] = {{fd, events, 0}, {wake_fd, POLLIN, 0}};
    const int n = poll(p, wake_fd >= 0 ? 2 : 1, timeout_ms);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::Unavailable(std::string("poll: ") + std::strerror(errno));
    }
    if (wake_fd >= 0 && (p[1].revents & POLLIN)) return Status::Unavailable("stopping");
    if (n > 0 && p[0].revents) return Status::Ok();
  }
}

// Reads exactly out.size() bytes; the first recvmsg may carry an fd. Once *started (a byte
// of the frame has arrived), partial_deadline_ns (when non-zero) bounds the rest too.
Status RecvExact(int fd, std::span<std::byte> out, uint64_t deadline_ns, int wake_fd,
                 int* passed_fd, uint64_t partial_timeout_ns, uint64_t* started_ns) {
  size_t got = 0;
  while (got < out.size()) {
    iovec iov{out.data() + got, out.size() - got};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    if (passed_fd) {
      msg.msg_control = control;
      msg.msg_controllen = sizeof(control);
    }
    const ssize_t n = recvmsg(fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n > 0) {
      if (passed_fd) {
        for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
          if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
            int got_fd = -1;
            std::memcpy(&got_fd, CMSG_DATA(c), sizeof(int));
            if (*passed_fd >= 0) close(*passed_fd);
            *passed_fd = got_fd;
          }
        }
      }
      if (*started_ns == 0) *started_ns = MonotonicNs();
      got += static_cast<size_t>(n);
      continue;
    }
    const bool mid = got > 0 || *started_ns != 0;
    if (n == 0)
      return Status::Unavailable(mid ? "peer closed the connection mid-frame"
                                     : "peer closed the connection");
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK)
      return Status::Unavailable(std::string("recv: ") + std::strerror(errno));
    uint64_t deadline = deadline_ns;
    if (mid && partial_timeout_ns != 0) {
      const uint64_t partial = *started_ns + partial_timeout_ns;
      deadline = deadline == 0 ? partial : std::min(deadline, partial);
    }
    Status w = Wait(fd, POLLIN, deadline, wake_fd);
    if (!w.ok()) return mid ? Status::Unavailable(w.message() + " mid-frame") : w;
  }
  return Status::Ok();
}

}  // namespace

Status SendAll(int fd, std::span<const std::byte> bytes, uint64_t deadline_ns, int pass_fd) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    iovec iov{const_cast<std::byte*>(bytes.data()) + sent, bytes.size() - sent};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    if (pass_fd >= 0 && sent == 0) {
      std::memset(control, 0, sizeof(control));
      msg.msg_control = control;
      msg.msg_controllen = sizeof(control);
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int));
      std::memcpy(CMSG_DATA(c), &pass_fd, sizeof(int));
    }
    const ssize_t n = sendmsg(fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
      return Status::Unavailable(std::string("send: ") + std::strerror(errno));
    KVTIER_RETURN_IF_ERROR(Wait(fd, POLLOUT, deadline_ns, -1));
  }
  return Status::Ok();
}

Status RecvFrame(int fd, uint64_t deadline_ns, int wake_fd, FrameHeader* header,
                 std::vector<std::byte>* payload, int* passed_fd, const FrameLimits& limits) {
  if (passed_fd) *passed_fd = -1;
  std::byte hdr[kHeaderBytes];
  uint64_t started = 0;
  KVTIER_RETURN_IF_ERROR(
      RecvExact(fd, hdr, deadline_ns, wake_fd, passed_fd, limits.partial_timeout_ns, &started));
  KVTIER_RETURN_IF_ERROR(DecodeHeader(hdr, header));
  if (header->payload_bytes > limits.max_payload)
    return Status::InvalidArgument("frame of " + std::to_string(header->payload_bytes) +
                                   " bytes, more than the " + std::to_string(limits.max_payload) +
                                   " allowed here");
  // Grown by at most 256 KiB ahead of what has arrived.
  constexpr size_t kStep = 256u << 10;
  payload->clear();
  while (payload->size() < header->payload_bytes) {
    const size_t at = payload->size();
    payload->resize(std::min<size_t>(header->payload_bytes, at + kStep));
    KVTIER_RETURN_IF_ERROR(RecvExact(fd, std::span<std::byte>(*payload).subspan(at), deadline_ns,
                                     wake_fd, nullptr, limits.partial_timeout_ns, &started));
  }
  return Status::Ok();
}

Result<int> ConnectUnix(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path))
    return Status::InvalidArgument("socket path too long (" + std::to_string(path.size()) +
                                   " bytes, at most " + std::to_string(sizeof(addr.sun_path) - 1) +
                                   "): " + path);
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return Status::Unavailable(std::string("socket: ") + std::strerror(errno));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    Status s = Status::Unavailable(path + ": " + std::strerror(errno));
    close(fd);
    return s;
  }
  return fd;
}

}  // namespace kvtier::serve
