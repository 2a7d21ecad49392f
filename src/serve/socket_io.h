// Blocking frame I/O on a Unix stream socket with a deadline, and SCM_RIGHTS fd passing.
// Used by the daemon (no deadline, woken by an eventfd) and the client (a deadline per call).
//
// Thread-safety: one reader and one writer per socket at a time; the functions keep no state.
#ifndef KVTIER_SRC_SERVE_SOCKET_IO_H_
#define KVTIER_SRC_SERVE_SOCKET_IO_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kvtier/status.h"
#include "serve/protocol.h"

namespace kvtier::serve {

// deadline_ns: a MonotonicNs() time, or 0 for none. wake_fd: when readable, the call returns
// Unavailable("stopping") (-1: none).
// Sends all bytes, passing pass_fd (>= 0) with the first byte. Unavailable on a closed peer or
// the deadline.
Status SendAll(int fd, std::span<const std::byte> bytes, uint64_t deadline_ns, int pass_fd = -1);

// Reads one frame: header (validated) and payload. *passed_fd gets an fd that came with it
// (-1 if none; the caller owns it). Unavailable: peer closed / deadline / woken; InvalidArgument:
// a bad header (the peer speaks something else).
// Limits (FrameLimits): a frame announcing more than max_payload bytes is refused before any
// of it is read; once a frame's first byte has arrived the rest must arrive within
// partial_timeout_ns (else Unavailable); the payload buffer grows as bytes arrive, so a peer
// that announces much and sends little costs little.
struct FrameLimits {
  uint32_t max_payload = kMaxPayload;
  uint64_t partial_timeout_ns = 0;  // 0: the call's deadline alone
};
Status RecvFrame(int fd, uint64_t deadline_ns, int wake_fd, FrameHeader* header,
                 std::vector<std::byte>* payload, int* passed_fd, const FrameLimits& limits = {});

// Connects to a Unix socket path (a non-blocking socket, CLOEXEC). Unavailable when nobody
// listens there.
Result<int> ConnectUnix(const std::string& path);

}  // namespace kvtier::serve

#endif  // KVTIER_SRC_SERVE_SOCKET_IO_H_
