// kvtier serve as an operator runs it (issue 27 item 6): readiness told to systemd, the log's
// level and JSON format, and addresses refused at start. Forks the real binary.
#include <gtest/gtest.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "daemon_harness.h"
#include "kvtier/client.h"
#include "kvtier/config.h"
#include "serve_util.h"
#include "testing/test_util.h"

namespace kvtier::testing {
namespace {

std::string Config(const std::string& serve_extra = "") {
  return "model_id: test\n"
         "layout: {num_layers: 2, num_kv_heads: 2, head_dim: 8, dtype: fp32, block_tokens: 16}\n"
         "tiers:\n"
         "  - {kind: host, capacity: 1MiB, params: {prefault: false}}\n"
         "serve:\n"
         "  lease_ms: 30000\n" +
         serve_extra;
}

// The daemon did not tell systemd when it was ready (the unit was Type=simple): units ordered
// after it started before the socket existed. Now READY=1 comes once the socket is bound.
TEST(ServeOpsTest, ReadyIsSentToNotifySocketOnceTheSocketIsBound) {
  TempDir dir;
  const std::string path = dir.path() + "/notify";
  const int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strncpy(a.sun_path, path.c_str(), sizeof(a.sun_path) - 1);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ::setenv("NOTIFY_SOCKET", path.c_str(), 1);
  Daemon d(dir.path(), Config());
  const Status started = d.Start();
  ::unsetenv("NOTIFY_SOCKET");
  ASSERT_TRUE(started.ok()) << started.ToString();
  pollfd p{fd, POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 10000), 1) << "no READY=1 within 10 s: " << d.Log();
  char buf[512];
  const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
  const std::string got(buf, n > 0 ? static_cast<size_t>(n) : 0);
  EXPECT_EQ(got.rfind("READY=1\n", 0), 0u) << got;
  EXPECT_NE(got.find(d.socket()), std::string::npos) << got;
  EXPECT_EQ(d.Signal(SIGTERM), 0);
  ::close(fd);
}

// There was no log level or structured-log option: now --log-level and --log-json.
TEST(ServeOpsTest, LogJsonLinesAtTheAskedLevel) {
  TempDir dir;
  Daemon d(dir.path(), Config());
  ASSERT_TRUE(d.Start({"--log-json", "--log-level", "debug"}).ok()) << d.Log();
  ASSERT_TRUE(d.WaitForLog("serving", 5000)) << d.Log();
  EXPECT_EQ(d.Signal(SIGTERM), 0);
  std::istringstream lines(d.Log());
  int parsed = 0;
  for (std::string line; std::getline(lines, line);) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    ASSERT_TRUE(j.is_object()) << "not a JSON line: " << line;
    EXPECT_TRUE(j.contains("time") && j.contains("level") && j.contains("msg")) << line;
    ++parsed;
  }
  EXPECT_GT(parsed, 1);

  Daemon quiet(dir.path(), Config());
  ASSERT_TRUE(quiet.Start({"--log-level", "error"}).ok()) << quiet.Log();
  EXPECT_EQ(quiet.Signal(SIGTERM), 0);
  EXPECT_EQ(quiet.Log().find("serving"), std::string::npos) << quiet.Log();
}

// metrics_addr 127.0.0.1:99999 was accepted and port 34463 bound instead; now the daemon
// refuses to start, naming the key (from the config or the flag).
TEST(ServeOpsTest, BadMetricsAddressRefusesTheStartNamingIt) {
  TempDir dir;
  Daemon d(dir.path(), Config("  metrics_addr: 127.0.0.1:99999\n"));
  EXPECT_FALSE(d.Start().ok());
  EXPECT_NE(d.Log().find("serve.metrics_addr: '127.0.0.1:99999'"), std::string::npos) << d.Log();
  Daemon f(dir.path(), Config());
  EXPECT_FALSE(f.Start({"--metrics-addr", "99999"}).ok());
  EXPECT_NE(f.Log().find("metrics_addr: '99999'"), std::string::npos) << f.Log();
}

// A grouped layout (doc/config.md): a sliding window of `window` tokens in 4-token pages beside
// a full group, 16-token blocks.
std::string GroupedLayoutYaml(uint32_t window) {
  return "block_tokens: 16\ngroups:\n"
         "  - {kind: sliding_window, num_layers: 2, num_kv_heads: 2, head_dim: 8, dtype: fp32, "
         "window: " +
         std::to_string(window) +
         ", page_tokens: 4}\n"
         "  - {kind: full, num_layers: 2, num_kv_heads: 2, head_dim: 8, dtype: fp32}\n";
}

std::string IndentBy(const std::string& text, const std::string& pad) {
  std::string out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out += pad + line + "\n";
  return out;
}

// Protocol 5 carries a grouped layout: a client declaring the daemon's groups stores and loads
// through it; one whose sliding window differs is refused, the message naming both layouts.
TEST(ServeOpsTest, GroupedLayoutClientIsServedOrRefusedNamingBothLayouts) {
  TempDir dir;
  const std::string yaml = "model_id: test\nlayout:\n" + IndentBy(GroupedLayoutYaml(8), "  ") +
                           "tiers:\n  - {kind: host, capacity: 1MiB, params: {prefault: false}}\n"
                           "serve:\n  lease_ms: 30000\n";
  Daemon d(dir.path(), yaml);
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  auto mine = ParseLayoutYaml(GroupedLayoutYaml(8), "client");
  auto other = ParseLayoutYaml(GroupedLayoutYaml(12), "client");
  ASSERT_TRUE(mine.ok() && other.ok()) << mine.status().ToString() << other.status().ToString();
  auto good = Client::Open(Opts(d, "", "", *mine));
  ASSERT_TRUE(good.ok()) << good.status().ToString();
  ASSERT_TRUE((*good)->connected());
  EXPECT_EQ(StoreChain(**good, 3, 4).stored_blocks, 4u);
  EXPECT_EQ(LoadChain(**good, 3, 4), 4);
  auto bad = Client::Open(Opts(d, "", "", *other));
  ASSERT_FALSE(bad.ok());
  const std::string msg(bad.status().message());
  EXPECT_NE(msg.find("layout mismatch"), std::string::npos) << msg;
  EXPECT_NE(msg.find(other->ToString()), std::string::npos) << msg;
  EXPECT_NE(msg.find(mine->ToString()), std::string::npos) << msg;
  EXPECT_NE(msg.find("window 12 in 4-token pages"), std::string::npos) << msg;
}

// A peer of the previous protocol is refused by version, the message naming both.
TEST(ServeOpsTest, PreviousProtocolVersionIsRefusedNamingBoth) {
  static_assert(serve::kProtocolVersion == 6);
  TempDir dir;
  Daemon d(dir.path(), Config());
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  Raw raw(d.socket());
  const Status s = raw.Hello(5);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("the client speaks version 5, this daemon speaks version 6"),
            std::string::npos)
      << s.message();
}

}  // namespace
}  // namespace kvtier::testing
