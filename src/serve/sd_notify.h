// Readiness for systemd (a Type=notify unit): the sd_notify datagram protocol, implemented
// here (a few lines: one datagram to $NOTIFY_SOCKET) rather than linking libsystemd for it.
//
// Thread-safety: may be called from any thread.
#ifndef KVTIER_SRC_SERVE_SD_NOTIFY_H_
#define KVTIER_SRC_SERVE_SD_NOTIFY_H_

#include <string_view>

#include "kvtier/status.h"

namespace kvtier::serve {

// Sends `state` (newline-separated assignments: "READY=1", "STOPPING=1", "STATUS=...") to the
// service manager. OK when sent, and OK doing nothing when $NOTIFY_SOCKET is unset (not run by
// systemd). InvalidArgument for an address it cannot use (naming it), Unavailable when the
// send fails (naming the socket and the error).
Status NotifySystemd(std::string_view state);

}  // namespace kvtier::serve

#endif  // KVTIER_SRC_SERVE_SD_NOTIFY_H_
