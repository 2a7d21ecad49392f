#include "serve/sd_notify.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <string>

namespace kvtier::serve {

Status NotifySystemd(std::string_view state) {
  const char* env = std::getenv("NOTIFY_SOCKET");
  if (env == nullptr || env[0] == '\0') return Status::Ok();
  const std::string path(env);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  // "@name" is a Linux abstract socket: a leading NUL, not part of the name's length.
  if ((path[0] != '/' && path[0] != '@') || path.size() >= sizeof(addr.sun_path))
    return Status::InvalidArgument("NOTIFY_SOCKET '" + path +
                                   "': want an absolute path or @abstract name");
  std::memcpy(addr.sun_path, path.data(), path.size());
  if (path[0] == '@') addr.sun_path[0] = '\0';
  const socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path.size());
  const int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::Unavailable(std::string("sd_notify: socket: ") + std::strerror(errno));
  const ssize_t sent = ::sendto(fd, state.data(), state.size(), MSG_NOSIGNAL,
                                reinterpret_cast<const sockaddr*>(&addr), len);
  const int err = errno;
  ::close(fd);
  if (sent != static_cast<ssize_t>(state.size()))
    return Status::Unavailable("sd_notify to " + path + ": " +
                               (sent < 0 ? std::strerror(err) : "short send"));
  return Status::Ok();
}

}  // namespace kvtier::serve
