#include "daemon_harness.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "serve/socket_io.h"

namespace kvtier::testing {

Daemon::Daemon(std::string dir, std::string yaml)
    : dir_(std::move(dir)), config_(dir_ + "/kvtier.yaml"), socket_(dir_ + "/kvtier.sock") {
  std::ofstream(config_) << yaml;
}

Daemon::~Daemon() {
  if (pid_ > 0) {
    kill(pid_, SIGCONT);
    Signal(SIGKILL);
  }
}

Status Daemon::Start(const std::vector<std::string>& extra) {
  log_ = dir_ + "/daemon-" + std::to_string(++runs_) + ".log";
  const pid_t pid = fork();
  if (pid < 0) return Status::Internal("fork failed");
  if (pid == 0) {
    const int fd = open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, STDERR_FILENO);
    dup2(fd, STDOUT_FILENO);
    std::vector<const char*> argv = {KVTIER_CLI_PATH, "serve",    "--config",
                                     config_.c_str(), "--socket", socket_.c_str()};
    for (const std::string& a : extra) argv.push_back(a.c_str());
    argv.push_back(nullptr);
    execv(KVTIER_CLI_PATH, const_cast<char* const*>(argv.data()));
    _exit(127);
  }
  pid_ = pid;
  const bool up = PollUntil(
      [&] {
        int st = 0;
        if (waitpid(pid_, &st, WNOHANG) == pid_) {
          pid_ = -1;
          return true;
        }
        auto fd = serve::ConnectUnix(socket_);
        if (!fd.ok()) return false;
        close(*fd);
        return true;
      },
      20000);
  if (pid_ < 0) return Status::Internal("kvtier serve exited at start: " + Log());
  if (!up) return Status::Unavailable("kvtier serve did not listen within 20 s: " + Log());
  return Status::Ok();
}

int Daemon::Signal(int sig) {
  if (pid_ <= 0) return -1;
  kill(pid_, sig);
  if (sig != SIGTERM && sig != SIGKILL && sig != SIGINT) return -1;
  int st = 0;
  waitpid(pid_, &st, 0);
  pid_ = -1;
  if (WIFEXITED(st)) return WEXITSTATUS(st);
  return 128 + WTERMSIG(st);
}

std::string Daemon::Log() const {
  std::ifstream in(log_);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool Daemon::WaitStopped(int timeout_ms) const {
  const std::string dir = "/proc/" + std::to_string(pid_) + "/task";
  return PollUntil(
      [&] {
        DIR* d = opendir(dir.c_str());
        if (!d) return false;
        bool all = true;
        while (dirent* e = readdir(d)) {
          if (e->d_name[0] == '.') continue;
          std::ifstream in(dir + "/" + e->d_name + "/stat");
          std::string stat;
          std::getline(in, stat);
          const auto paren = stat.rfind(')');
          all &= paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == 'T';
        }
        closedir(d);
        return all;
      },
      timeout_ms);
}

bool Daemon::WaitForLog(const std::string& text, int timeout_ms) const {
  return PollUntil([&] { return Log().find(text) != std::string::npos; }, timeout_ms);
}

}  // namespace kvtier::testing
