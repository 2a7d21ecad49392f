// Child processes for the benchmarks: finding a program, spawning it, and a redis-server of
// the benchmark's own on a free loopback port, stopped by its PID.
// Thread-safety: none needed (the CLI's main thread). Ownership: RedisServer owns its process
// and its temp dir, and removes both in its destructor; a TempDir owns its folder.
#ifndef KVTIER_TOOLS_SUBPROCESS_H_
#define KVTIER_TOOLS_SUBPROCESS_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "kvtier/status.h"

namespace kvtier::cli {

// The program's path in PATH (then /usr/bin, /usr/sbin), or "" when absent.
std::string FindInPath(const std::string& name);

// fork + exec; stdout into *out_fd when given (else /dev/null); the child dies with us.
// -1 when the fork or pipe failed.
pid_t Spawn(const std::vector<std::string>& argv, int* out_fd);

// A port on 127.0.0.1 free at the time of the call (0 when none could be bound).
int FreeLoopbackPort();

// A folder of its own under /tmp, removed with everything in it when destroyed.
class TempDir {
 public:
  TempDir() = default;
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  // Creates /tmp/<prefix>XXXXXX; Internal when it cannot.
  Status Make(const std::string& prefix);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

class RedisServer {
 public:
  RedisServer() = default;
  ~RedisServer();
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  // Starts redis-server (no persistence) and waits up to 10 s for it to accept connections.
  // Unavailable when redis-server is not on PATH or does not come up.
  Status Start();
  std::string url() const;

 private:
  TempDir dir_;
  int port_ = 0;
  pid_t pid_ = -1;
};

}  // namespace kvtier::cli

#endif  // KVTIER_TOOLS_SUBPROCESS_H_
