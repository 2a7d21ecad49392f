#include "testing/redis_harness.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <thread>

namespace kvtier::testing {

std::vector<std::byte> BlockBytes(const BlockKey& key, size_t bytes) {
  std::mt19937_64 rng(key.hi ^ (key.lo << 1));
  std::vector<std::byte> v(bytes);
  for (size_t i = 0; i < bytes; i += 8) {
    const uint64_t x = rng();
    std::memcpy(v.data() + i, &x, std::min<size_t>(8, bytes - i));
  }
  return v;
}

namespace {

std::string FindInPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::string dirs = path != nullptr ? path : "";
  dirs += ":/usr/bin:/usr/sbin:/usr/local/bin";
  std::stringstream ss(dirs);
  std::string dir;
  while (std::getline(ss, dir, ':')) {
    if (dir.empty()) continue;
    std::string candidate = dir + "/" + name;
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

bool PortFree(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bool ok = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return ok;
}

// A port p with p and p + 10000 (the cluster bus) both free.
int PickPort() {
  static std::mt19937 rng(std::random_device{}() ^ static_cast<unsigned>(getpid()));
  std::uniform_int_distribution<int> dist(20000, 39999);
  for (int attempt = 0; attempt < 200; ++attempt) {
    int p = dist(rng);
    if (PortFree(p) && PortFree(p + 10000)) return p;
  }
  return 0;
}

std::string MakeTempDir(const std::string& parent, const std::string& stem) {
  std::string base = parent.empty() ? std::filesystem::temp_directory_path().string() : parent;
  std::string templ = base + "/" + stem + "-XXXXXX";
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  if (mkdtemp(buf.data()) == nullptr) return "";
  return buf.data();
}

std::string ReadTail(const std::string& path, size_t max_bytes = 2000) {
  std::ifstream in(path);
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (s.size() > max_bytes) s = s.substr(s.size() - max_bytes);
  return s;
}

// fork + exec with stdout/stderr to `log`; the child dies with us.
pid_t Spawn(const std::vector<std::string>& argv, const std::string& log) {
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid != 0) return pid;
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(127);
  int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd >= 0) {
    dup2(fd, 1);
    dup2(fd, 2);
    close(fd);
  }
  int devnull = open("/dev/null", O_RDONLY);
  if (devnull >= 0) dup2(devnull, 0);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  execv(args[0], args.data());
  _exit(127);
}

// Waits for pid up to timeout_ms; true when it exited (status in *status).
bool WaitExit(pid_t pid, int timeout_ms, int* status) {
  auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (true) {
    pid_t r = waitpid(pid, status, WNOHANG);
    if (r == pid) return true;
    if (r < 0 && errno == ECHILD) return true;
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

Result<RedisReplyText> RunCommand(int port, const std::vector<std::string>& argv,
                                  const std::string& user, const std::string& password) {
  timeval tv{2, 0};
  redisContext* c = redisConnectWithTimeout("127.0.0.1", port, tv);
  if (c == nullptr || c->err) {
    std::string err = c ? c->errstr : "out of memory";
    if (c) redisFree(c);
    return Status::Unavailable("127.0.0.1:" + std::to_string(port) + ": " + err);
  }
  redisSetTimeout(c, tv);
  auto run = [&](const std::vector<std::string>& args) -> redisReply* {
    std::vector<const char*> ptrs;
    std::vector<size_t> lens;
    for (const std::string& a : args) {
      ptrs.push_back(a.data());
      lens.push_back(a.size());
    }
    return static_cast<redisReply*>(
        redisCommandArgv(c, static_cast<int>(ptrs.size()), ptrs.data(), lens.data()));
  };
  if (!password.empty()) {
    std::vector<std::string> auth = {"AUTH"};
    if (!user.empty()) auth.push_back(user);
    auth.push_back(password);
    if (redisReply* r = run(auth)) freeReplyObject(r);
  }
  redisReply* r = run(argv);
  if (r == nullptr) {
    std::string err = c->errstr;
    redisFree(c);
    return Status::Unavailable("127.0.0.1:" + std::to_string(port) + ": " + err);
  }
  RedisReplyText out;
  std::function<void(const redisReply*)> render = [&](const redisReply* x) {
    switch (x->type) {
      case REDIS_REPLY_INTEGER:
        out.text += std::to_string(x->integer);
        break;
      case REDIS_REPLY_NIL:
        out.nil = true;
        break;
      case REDIS_REPLY_ARRAY:
        for (size_t i = 0; i < x->elements; ++i) {
          render(x->element[i]);
          out.text += "\n";
        }
        break;
      case REDIS_REPLY_ERROR:
        out.error = true;
        [[fallthrough]];
      default:
        out.text.append(x->str, x->len);
    }
  };
  render(r);
  freeReplyObject(r);
  redisFree(c);
  return out;
}

}  // namespace

std::unique_ptr<remote::RemoteTier> OpenRemoteTier(const remote::RemoteTierOptions& o) {
  Result<std::unique_ptr<remote::RemoteTier>> t = remote::RemoteTier::Open(o);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? std::move(*t) : nullptr;
}

std::string RedisMissingReason(bool cluster) {
  if (FindInPath("redis-server").empty()) {
    return "redis-server not found in PATH (install Debian's redis-server package)";
  }
  if (cluster && FindInPath("redis-cli").empty()) {
    return "redis-cli not found in PATH (install Debian's redis-tools package)";
  }
  return "";
}

Result<std::unique_ptr<RedisServer>> RedisServer::Start(Options options, std::string parent_dir) {
  std::string reason = RedisMissingReason();
  if (!reason.empty()) return Status::Unavailable(reason);
  std::unique_ptr<RedisServer> server(new RedisServer());
  server->options_ = std::move(options);
  server->own_dir_ = parent_dir.empty();
  server->dir_ = MakeTempDir(parent_dir, "kvtier-redis");
  if (server->dir_.empty())
    return Status::Internal("mkdtemp failed: " + std::string(strerror(errno)));
  Status last;
  // A port found free can be taken before redis binds it: try a few.
  for (int attempt = 0; attempt < 5; ++attempt) {
    server->port_ = PickPort();
    if (server->port_ == 0) return Status::Unavailable("no free loopback port");
    last = server->Launch();
    if (last.ok()) return server;
  }
  return last;
}

Status RedisServer::Launch() {
  std::vector<std::string> argv = {FindInPath("redis-server"),
                                   "--port",
                                   std::to_string(port_),
                                   "--bind",
                                   "127.0.0.1",
                                   "--save",
                                   "",
                                   "--appendonly",
                                   "no",
                                   "--dir",
                                   dir_,
                                   "--logfile",
                                   dir_ + "/redis.log",
                                   "--daemonize",
                                   "no"};
  if (options_.cluster) {
    for (const char* a :
         {"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
          "--cluster-node-timeout", "1000", "--cluster-require-full-coverage", "no"}) {
      argv.push_back(a);
    }
  }
  argv.insert(argv.end(), options_.args.begin(), options_.args.end());
  pid_ = Spawn(argv, dir_ + "/stdout.log");
  if (pid_ < 0) return Status::Internal("fork failed: " + std::string(strerror(errno)));
  return WaitReady();
}

Status RedisServer::WaitReady() {
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < until) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return Status::Unavailable("redis-server on port " + std::to_string(port_) +
                                 " exited at start:\n" + ReadTail(dir_ + "/redis.log") +
                                 ReadTail(dir_ + "/stdout.log"));
    }
    timeval tv{0, 200000};
    redisContext* c = redisConnectWithTimeout("127.0.0.1", port_, tv);
    if (c != nullptr && !c->err) {
      redisSetTimeout(c, tv);
      redisReply* r = static_cast<redisReply*>(redisCommand(c, "PING"));
      // A server with requirepass answers NOAUTH: it is up all the same.
      bool up = r != nullptr && (r->type == REDIS_REPLY_STATUS || r->type == REDIS_REPLY_ERROR) &&
                std::string(r->str, r->len).find("LOADING") == std::string::npos;
      if (r) freeReplyObject(r);
      redisFree(c);
      if (up) return Status::Ok();
    } else if (c != nullptr) {
      redisFree(c);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  (void)Kill();
  return Status::Unavailable("redis-server on port " + std::to_string(port_) +
                             " did not answer PING within 10 s:\n" + ReadTail(dir_ + "/redis.log"));
}

RedisServer::~RedisServer() {
  (void)Stop();
  if (own_dir_ && !dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
}

Status RedisServer::Kill() {
  if (pid_ <= 0) return Status::Ok();
  kill(pid_, SIGKILL);
  int status = 0;
  WaitExit(pid_, 5000, &status);
  pid_ = -1;
  return Status::Ok();
}

Status RedisServer::Stop() {
  if (pid_ <= 0) return Status::Ok();
  kill(pid_, SIGTERM);
  int status = 0;
  if (!WaitExit(pid_, 5000, &status)) {
    kill(pid_, SIGKILL);
    WaitExit(pid_, 5000, &status);
  }
  pid_ = -1;
  return Status::Ok();
}

Status RedisServer::Restart() {
  if (pid_ > 0) return Status::InvalidArgument("restart: the server is still running");
  return Launch();
}

Result<RedisReplyText> RedisServer::Command(const std::vector<std::string>& argv,
                                            const std::string& user,
                                            const std::string& password) const {
  return RunCommand(port_, argv, user, password);
}

Result<std::unique_ptr<RedisCluster>> RedisCluster::Start(int masters,
                                                          std::vector<std::string> extra_args) {
  std::string reason = RedisMissingReason(/*cluster=*/true);
  if (!reason.empty()) return Status::Unavailable(reason);
  if (masters < 3) return Status::InvalidArgument("a Redis cluster needs at least 3 masters");
  std::unique_ptr<RedisCluster> cluster(new RedisCluster());
  cluster->dir_ = MakeTempDir("", "kvtier-cluster");
  if (cluster->dir_.empty()) return Status::Internal("mkdtemp failed");
  for (int i = 0; i < masters; ++i) {
    RedisServer::Options o;
    o.cluster = true;
    o.args = extra_args;
    KVTIER_ASSIGN_OR_RETURN(auto server, RedisServer::Start(o, cluster->dir_));
    cluster->nodes_.push_back(std::move(server));
  }
  std::vector<std::string> argv = {FindInPath("redis-cli"), "--cluster", "create"};
  for (auto& n : cluster->nodes_) argv.push_back(n->address());
  argv.insert(argv.end(), {"--cluster-replicas", "0", "--cluster-yes"});
  std::string log = cluster->dir_ + "/create.log";
  pid_t pid = Spawn(argv, log);
  int status = 0;
  if (!WaitExit(pid, 60000, &status)) {
    kill(pid, SIGKILL);
    WaitExit(pid, 5000, &status);
    return Status::Unavailable("redis-cli --cluster create timed out:\n" + ReadTail(log));
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return Status::Unavailable("redis-cli --cluster create failed:\n" + ReadTail(log));
  }
  KVTIER_RETURN_IF_ERROR(cluster->WaitHealthy());
  return cluster;
}

RedisCluster::~RedisCluster() {
  nodes_.clear();
  if (!dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
}

std::string RedisCluster::url() const {
  std::string url = "redis://";
  for (size_t i = 0; i < nodes_.size(); ++i) {
    if (i) url += ",";
    url += nodes_[i]->address();
  }
  return url;
}

Status RedisCluster::WaitHealthy(int timeout_ms) const {
  auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  std::string last;
  while (std::chrono::steady_clock::now() < until) {
    bool all = true;
    for (const auto& n : nodes_) {
      if (!n->running()) continue;
      Result<RedisReplyText> info = n->Command({"CLUSTER", "INFO"});
      if (!info.ok() || info->text.find("cluster_state:ok") == std::string::npos ||
          info->text.find("cluster_slots_assigned:16384") == std::string::npos ||
          info->text.find("cluster_known_nodes:" + std::to_string(nodes_.size())) ==
              std::string::npos) {
        all = false;
        last = info.ok() ? info->text : info.status().ToString();
        break;
      }
    }
    if (all) return Status::Ok();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return Status::Unavailable("cluster not healthy within " + std::to_string(timeout_ms) +
                             " ms; last CLUSTER INFO:\n" + last);
}

Result<int> RedisCluster::NodeOfKey(const std::string& key) const {
  for (const auto& n : nodes_) {
    if (!n->running()) continue;
    KVTIER_ASSIGN_OR_RETURN(RedisReplyText slot, n->Command({"CLUSTER", "KEYSLOT", key}));
    int s = std::atoi(slot.text.c_str());
    KVTIER_ASSIGN_OR_RETURN(RedisReplyText nodes, n->Command({"CLUSTER", "NODES"}));
    // Lines: <id> <ip:port@bus> <flags> <master> <ping> <pong> <epoch> <state> <slots...>
    std::stringstream lines(nodes.text);
    std::string line;
    while (std::getline(lines, line)) {
      std::stringstream fields(line);
      std::string id, addr, flags, master, ping, pong, epoch, state, range;
      fields >> id >> addr >> flags >> master >> ping >> pong >> epoch >> state;
      while (fields >> range) {
        if (range.front() == '[') continue;  // a slot being migrated
        int lo = 0, hi = 0;
        size_t dash = range.find('-');
        lo = std::atoi(range.substr(0, dash).c_str());
        hi = dash == std::string::npos ? lo : std::atoi(range.substr(dash + 1).c_str());
        if (s < lo || s > hi) continue;
        std::string hostport = addr.substr(0, addr.find('@'));
        for (size_t i = 0; i < nodes_.size(); ++i) {
          if (nodes_[i]->address() == hostport) return static_cast<int>(i);
        }
      }
    }
    return Status::NotFound("no node serves slot " + std::to_string(s));
  }
  return Status::Unavailable("no cluster node is running");
}

}  // namespace kvtier::testing
