// A `kvtier serve` process for tests: started with fork/exec on a private socket in a temp
// dir, its log captured to a file, stopped by PID.
#ifndef KVTIER_TESTS_SERVE_DAEMON_HARNESS_H_
#define KVTIER_TESTS_SERVE_DAEMON_HARNESS_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "kvtier/status.h"

namespace kvtier::testing {

class Daemon {
 public:
  // Writes `yaml` to dir/kvtier.yaml; the socket is dir/kvtier.sock, the log dir/daemon-N.log.
  Daemon(std::string dir, std::string yaml);
  ~Daemon();  // SIGKILL when still running

  // Starts the process (with `extra` after its --config and --socket) and waits (with a
  // deadline) until its socket answers.
  Status Start(const std::vector<std::string>& extra = {});
  // Sends sig; for SIGTERM/SIGKILL also reaps it. Returns the exit status (-1 if not reaped).
  int Signal(int sig);
  bool running() const { return pid_ > 0; }
  // Polls /proc until every thread of the process is stopped (SIGSTOP is delivered
  // asynchronously) or timeout_ms passes.
  bool WaitStopped(int timeout_ms) const;
  pid_t pid() const { return pid_; }
  const std::string& socket() const { return socket_; }
  const std::string& config() const { return config_; }
  // The current run's log so far.
  std::string Log() const;
  // Polls the log until it contains `text` or timeout_ms passes.
  bool WaitForLog(const std::string& text, int timeout_ms) const;

 private:
  std::string dir_, config_, socket_, log_;
  pid_t pid_ = -1;
  int runs_ = 0;
};

// Polls cond every millisecond until it holds or timeout_ms passes; returns its last value.
template <typename Fn>
bool PollUntil(Fn&& cond, int timeout_ms);

}  // namespace kvtier::testing

#include <chrono>
#include <thread>

template <typename Fn>
bool kvtier::testing::PollUntil(Fn&& cond, int timeout_ms) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (!cond()) {
    if (std::chrono::steady_clock::now() > end) return cond();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

#endif  // KVTIER_TESTS_SERVE_DAEMON_HARNESS_H_
