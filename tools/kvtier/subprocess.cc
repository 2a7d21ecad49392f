#include "subprocess.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <thread>

namespace kvtier::cli {

using Clock = std::chrono::steady_clock;

std::string FindInPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::stringstream ss(std::string(path ? path : "") + ":/usr/bin:/usr/sbin");
  std::string dir;
  while (std::getline(ss, dir, ':')) {
    if (!dir.empty() && access((dir + "/" + name).c_str(), X_OK) == 0) return dir + "/" + name;
  }
  return "";
}

pid_t Spawn(const std::vector<std::string>& argv, int* out_fd) {
  int pipefd[2] = {-1, -1};
  if (out_fd != nullptr && pipe(pipefd) != 0) return -1;
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid != 0) {
    if (out_fd != nullptr) {
      close(pipefd[1]);
      *out_fd = pipefd[0];
    }
    return pid;
  }
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(127);
  int devnull = open("/dev/null", O_RDWR);
  dup2(devnull, 0);
  dup2(out_fd != nullptr ? pipefd[1] : devnull, 1);
  dup2(devnull, 2);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  execv(args[0], args.data());
  _exit(127);
}

int FreeLoopbackPort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  close(fd);
  return port;
}

TempDir::~TempDir() {
  if (!path_.empty()) std::filesystem::remove_all(path_);
}

Status TempDir::Make(const std::string& prefix) {
  std::string templ = "/tmp/" + prefix + "XXXXXX";
  if (mkdtemp(templ.data()) == nullptr)
    return Status::Internal("mkdtemp " + templ + ": " + std::strerror(errno));
  path_ = templ;
  return Status::Ok();
}

RedisServer::~RedisServer() {
  if (pid_ > 0) {
    kill(pid_, SIGTERM);
    int st;
    waitpid(pid_, &st, 0);
  }
}

Status RedisServer::Start() {
  std::string bin = FindInPath("redis-server");
  if (bin.empty()) return Status::Unavailable("redis-server not found in PATH");
  KVTIER_RETURN_IF_ERROR(dir_.Make("kvtier-bench-redis-"));
  port_ = FreeLoopbackPort();
  pid_ = Spawn(
      {bin, "--port", std::to_string(port_), "--bind", "127.0.0.1", "--save", "", "--appendonly",
       "no", "--dir", dir_.path(), "--daemonize", "no", "--logfile", dir_.path() + "/redis.log"},
      nullptr);
  auto until = Clock::now() + std::chrono::seconds(10);
  while (Clock::now() < until) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port_));
    bool up = connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    close(fd);
    if (up) return Status::Ok();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return Status::Unavailable("redis-server did not start on port " + std::to_string(port_));
}

std::string RedisServer::url() const { return "redis://127.0.0.1:" + std::to_string(port_); }

}  // namespace kvtier::cli
