// Test harness for the remote tier: real redis-server processes on 127.0.0.1.
//
// RedisServer starts Debian's redis-server on a free loopback port in a temp dir (no
// persistence, bound to 127.0.0.1 only) and stops it by PID; RedisCluster starts N such servers
// with cluster support and joins them as masters with `redis-cli --cluster create`. A test
// that needs them calls RedisMissingReason() first and skips with that reason when the
// binaries are absent. Servers die with the test process (PR_SET_PDEATHSIG), so a crashed test
// leaves none behind.
//
// Thread-safety: not thread-safe; use from the test's main thread. Ownership: each object owns
// its processes and temp dir, and removes both when destroyed.
#ifndef KVTIER_TESTING_REDIS_HARNESS_H_
#define KVTIER_TESTING_REDIS_HARNESS_H_

#include <sys/types.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "kvtier/block_key.h"
#include "kvtier/status.h"
#include "tiers/remote/remote_tier.h"

namespace kvtier::testing {

// A block's bytes derived from its key, so a block served under the wrong key shows.
std::vector<std::byte> BlockBytes(const BlockKey& key, size_t bytes);

// Opens a remote tier; a failure fails the running test (EXPECT) and gives nullptr.
std::unique_ptr<remote::RemoteTier> OpenRemoteTier(const remote::RemoteTierOptions& o);

// Empty when redis-server (and, for a cluster, redis-cli) can be run; else why not.
std::string RedisMissingReason(bool cluster = false);

// Replies as text: status/string/error text, integers in decimal, arrays one element a line.
struct RedisReplyText {
  bool error = false;
  bool nil = false;
  std::string text;
};

class RedisServer {
 public:
  struct Options {
    std::vector<std::string> args;  // extra redis-server arguments, e.g. {"--maxmemory", "4mb"}
    bool cluster = false;
  };

  // Starts a server in a new directory under `parent_dir` (a fresh temp dir when empty) and
  // waits until it answers PING. Unavailable when it did not come up within 10 s (the message
  // ends with its log).
  static Result<std::unique_ptr<RedisServer>> Start(Options options, std::string parent_dir = "");
  ~RedisServer();
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0; }
  const std::string& dir() const { return dir_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  std::string url() const { return "redis://" + address(); }

  Status Kill();     // SIGKILL and reap
  Status Stop();     // SIGTERM, SIGKILL after 5 s, reap
  Status Restart();  // start again on the same port and dir (after Kill or Stop)

  // One command over a fresh connection (AUTH with `password` when not empty).
  Result<RedisReplyText> Command(const std::vector<std::string>& argv, const std::string& user = "",
                                 const std::string& password = "") const;

 private:
  RedisServer() = default;
  Status Launch();
  Status WaitReady();

  Options options_;
  std::string dir_;
  bool own_dir_ = false;
  int port_ = 0;
  pid_t pid_ = -1;
};

class RedisCluster {
 public:
  // Starts `masters` (>= 3) cluster servers, joins them and waits for cluster_state:ok.
  // cluster-require-full-coverage is off, so the other masters keep serving while one is down.
  static Result<std::unique_ptr<RedisCluster>> Start(int masters = 3,
                                                     std::vector<std::string> extra_args = {});
  ~RedisCluster();

  int size() const { return static_cast<int>(nodes_.size()); }
  RedisServer& node(int i) { return *nodes_[i]; }
  // redis://127.0.0.1:p1,127.0.0.1:p2,...
  std::string url() const;
  // Waits until every running node reports cluster_state:ok and knows all slots.
  Status WaitHealthy(int timeout_ms = 15000) const;
  // The node (index) that serves `key` according to CLUSTER KEYSLOT and CLUSTER SLOTS.
  Result<int> NodeOfKey(const std::string& key) const;

 private:
  RedisCluster() = default;
  std::string dir_;
  std::vector<std::unique_ptr<RedisServer>> nodes_;
};

// A server or cluster shared by the tests of a suite. Start() from SetUpTestSuite does nothing
// when the binaries are missing (SetUp then skips with RedisMissingReason) and keeps the error
// when the start failed; Stop() from TearDownTestSuite.
template <typename T>
class SuiteRedis {
 public:
  template <typename StartFn>
  void Start(bool cluster, StartFn start) {
    if (!RedisMissingReason(cluster).empty()) return;
    Result<std::unique_ptr<T>> r = start();
    if (r.ok()) {
      value_ = std::move(*r);
    } else {
      error_ = r.status().ToString();
    }
  }
  void Stop() { value_.reset(); }
  T* get() const { return value_.get(); }
  const std::string& start_error() const { return error_; }

 private:
  std::unique_ptr<T> value_;
  std::string error_;
};

}  // namespace kvtier::testing

#endif  // KVTIER_TESTING_REDIS_HARNESS_H_
