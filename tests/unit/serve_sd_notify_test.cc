// Readiness for systemd (src/serve/sd_notify.cc): the datagram a Type=notify unit waits for.
#include <gtest/gtest.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "serve/sd_notify.h"
#include "testing/test_util.h"

namespace kvtier::serve {
namespace {

// A datagram socket bound at path, standing in for systemd's notify socket.
class NotifyListener {
 public:
  explicit NotifyListener(const std::string& path) {
    fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, path.c_str(), sizeof(a.sun_path) - 1);
    ok_ = fd_ >= 0 && ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  }
  ~NotifyListener() {
    if (fd_ >= 0) ::close(fd_);
  }
  bool ok() const { return ok_; }
  // The next datagram, or "" after timeout_ms.
  std::string Receive(int timeout_ms) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, timeout_ms) != 1) return "";
    char buf[512];
    const ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
    return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
  }

 private:
  int fd_ = -1;
  bool ok_ = false;
};

TEST(SdNotifyTest, SendsTheStateToNotifySocket) {
  kvtier::testing::TempDir dir;
  const std::string path = dir.path() + "/notify";
  NotifyListener l(path);
  ASSERT_TRUE(l.ok());
  ::setenv("NOTIFY_SOCKET", path.c_str(), 1);
  EXPECT_TRUE(NotifySystemd("READY=1\nSTATUS=serving").ok());
  EXPECT_EQ(l.Receive(2000), "READY=1\nSTATUS=serving");
  ::unsetenv("NOTIFY_SOCKET");
}

TEST(SdNotifyTest, NothingToDoOutsideSystemdAndBadAddressesNamed) {
  ::unsetenv("NOTIFY_SOCKET");
  EXPECT_TRUE(NotifySystemd("READY=1").ok());
  ::setenv("NOTIFY_SOCKET", "relative/path", 1);
  Status st = NotifySystemd("READY=1");
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("relative/path"), std::string::npos);
  kvtier::testing::TempDir dir;
  ::setenv("NOTIFY_SOCKET", (dir.path() + "/nobody").c_str(), 1);
  EXPECT_EQ(NotifySystemd("READY=1").code(), StatusCode::kUnavailable);
  ::unsetenv("NOTIFY_SOCKET");
}

}  // namespace
}  // namespace kvtier::serve
