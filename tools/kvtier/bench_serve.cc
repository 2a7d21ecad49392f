// kvtier bench serve: the daemon's data plane (client Load/Store through the shared arena
// beside the same run's memcpy in that client), its write-through to SSD (the daemon's CPU per
// GiB written down beside the same run's host-only daemon and an O_DIRECT write loop), its
// control plane (lookup of a 2,000-block chain beside the same run's empty round trip) and its
// memory outside the arena per indexed block. Each phase runs a real daemon in a child process
// on a private socket.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <zmq.hpp>

#include "command.h"
#include "kvtier/client.h"
#include "serve/server.h"

namespace kvtier::cli {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double Pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

// A daemon in a child process: started before this process makes any thread.
struct ChildDaemon {
  pid_t pid = -1;
  std::string socket;
  ChildDaemon(const CacheOptions& co, const std::string& path, bool verify_commit = false)
      : socket(path) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    pid = fork();
    if (pid == 0) {
      pthread_sigmask(SIG_BLOCK, &set, nullptr);
      serve::ServeOptions so;
      so.socket_path = path;
      so.lease_ms = 60000;
      so.verify_commit = verify_commit;
      auto s = serve::Server::Start(co, so);
      if (!s.ok()) {
        std::fprintf(stderr, "kvtier bench serve: daemon: %s\n", s.status().ToString().c_str());
        _exit(1);
      }
      int sig = 0;
      sigwait(&set, &sig);
      (*s)->Stop();
      _exit(0);
    }
  }
  ~ChildDaemon() {
    if (pid > 0) {
      kill(pid, SIGTERM);
      int st = 0;
      waitpid(pid, &st, 0);
    }
  }
  // CPU seconds the daemon has used so far (every thread), or -1 when it cannot be read.
  double CpuSeconds() const {
    clockid_t id;
    timespec ts{};
    if (clock_getcpuclockid(pid, &id) != 0 || clock_gettime(id, &ts) != 0) return -1;
    return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
  }
  // CPU seconds of the daemon's threads named `name` (/proc/PID/task/*/comm and stat; clock
  // ticks, 10 ms).
  double ThreadCpuSeconds(const std::string& name) const {
    double total = 0;
    const std::string dir = "/proc/" + std::to_string(pid) + "/task";
    std::error_code ec;
    for (const auto& t : std::filesystem::directory_iterator(dir, ec)) {
      std::ifstream comm(t.path() / "comm");
      std::string c;
      std::getline(comm, c);
      if (c != name) continue;
      std::ifstream stat(t.path() / "stat");
      std::string line;
      std::getline(stat, line);
      // Fields 14 and 15 (utime, stime) come after the ")" that ends the name.
      std::istringstream rest(line.substr(line.rfind(')') + 2));
      std::string f;
      unsigned long long ut = 0, st = 0;
      for (int i = 3; i <= 15 && rest >> f; ++i) {
        if (i == 14) ut = std::stoull(f);
        if (i == 15) st = std::stoull(f);
      }
      total += double(ut + st) / double(sysconf(_SC_CLK_TCK));
    }
    return total;
  }
  // VmRSS minus shared-memory RSS (the arena): what the daemon holds outside the arena.
  uint64_t RssOutsideArena() const {
    std::ifstream in("/proc/" + std::to_string(pid) + "/status");
    std::string line;
    uint64_t rss = 0, shmem = 0;
    while (std::getline(in, line)) {
      if (line.rfind("VmRSS:", 0) == 0) rss = std::stoull(line.substr(6)) * 1024;
      if (line.rfind("RssShmem:", 0) == 0) shmem = std::stoull(line.substr(9)) * 1024;
    }
    return rss - shmem;
  }
};

Result<std::unique_ptr<Client>> Connect(const ChildDaemon& d, const KvLayout& l) {
  ClientOptions o;
  o.socket_path = d.socket;
  o.layout = l;
  o.timeout_ms = 60000;
  KVTIER_ASSIGN_OR_RETURN(auto c, Client::Open(o));
  KVTIER_RETURN_IF_ERROR(c->WaitConnected(10000));
  return c;
}

CacheOptions HostOnly(const KvLayout& l, uint64_t blocks, bool prefault) {
  CacheOptions co;
  co.layout = l;
  TierSpec t;
  t.kind = "host";
  t.capacity_bytes = blocks * l.bytes_per_block();
  t.params["prefault"] = prefault ? "true" : "false";
  co.tiers.push_back(t);
  return co;
}

// $TMPDIR, else /tmp.
std::string TempRoot() {
  const char* tmp = std::getenv("TMPDIR");
  return tmp && *tmp ? tmp : "/tmp";
}

std::string TempSocket(const std::string& tag) {
  return TempRoot() + "/kvtier-bench-" + std::to_string(getpid()) + "-" + tag + ".sock";
}

struct Opts {
  bool json = false;
  int reps = 5;
  int lookups = 10000;
  uint64_t rss_blocks = 1000000;
  std::string working_set = "128MiB";
  std::string phases = "data,writethrough,lookup,memory";
  std::string disk_dir;  // writethrough: where the SSD tier goes (default $TMPDIR)
  bool verify_commit = false;
  bool no_engine_hashes = false;  // events: stores carry no engine hashes (the connector's do)
};

int DataPlane(const Opts& o, nlohmann::json* out) {
  const uint64_t ws = *ParseByteSize(o.working_set);
  for (uint32_t tokens : {2u, 16u}) {  // llama-3.1-8b: 256 KiB and 2 MiB blocks
    const KvLayout l = *LayoutPreset("llama-3.1-8b", tokens);
    const size_t bb = l.bytes_per_block();
    const size_t n = std::max<size_t>(ws / bb, 4);
    ChildDaemon d(HostOnly(l, n, true), TempSocket("dp"), o.verify_commit);
    auto c = Connect(d, l);
    if (!c.ok()) {
      std::fprintf(stderr, "kvtier bench serve: %s\n", c.status().ToString().c_str());
      return 1;
    }
    std::vector<std::byte> src(n * bb), dst(n * bb), base(n * bb);
    for (size_t i = 0; i < src.size(); i += 4096) src[i] = std::byte(i >> 12);
    std::memset(dst.data(), 1, dst.size());
    std::memset(base.data(), 1, base.size());
    std::vector<BlockKey> keys(n);
    std::vector<ConstBlock> in(n);
    std::vector<MutableBlock> outb(n);
    for (size_t i = 0; i < n; ++i) {
      keys[i] = BlockKey{tokens, i + 1};
      in[i] = ConstBlock(src.data() + i * bb, bb);
      outb[i] = MutableBlock(dst.data() + i * bb, bb);
    }
    for (int threads : {1, 2}) {
      std::vector<double> store, load, mc;
      for (int r = 0; r < o.reps; ++r) {
        (void)(*c)->DropAll();
        // Each thread stores and loads its own contiguous part as one batch.
        auto run = [&](auto&& fn) {
          auto t0 = Clock::now();
          std::vector<std::thread> ts;
          for (int t = 0; t < threads; ++t)
            ts.emplace_back([&, t] { fn(n * t / threads, n * (t + 1) / threads); });
          for (auto& t : ts) t.join();
          return n * bb / Seconds(t0) / 1e9;
        };
        bool ok = true;
        store.push_back(run([&](size_t b, size_t e) {
          auto s = (*c)->StoreKeys(std::span(keys).subspan(b, e - b),
                                   std::span(in).subspan(b, e - b), 0);
          ok &= s.ok() && s->stored_blocks == e - b;
        }));
        load.push_back(run([&](size_t b, size_t e) {
          auto lr = (*c)->LookupKeys(std::span(keys).subspan(b, e - b));
          if (!lr.ok() || lr->hit_blocks != e - b) {
            ok = false;
            return;
          }
          auto ld = (*c)->Load(*lr, std::span(outb).subspan(b, e - b));
          ok &= ld.ok() && ld->loaded_blocks == e - b;
        }));
        mc.push_back(run([&](size_t b, size_t e) {
          for (size_t i = b; i < e; ++i) std::memcpy(base.data() + i * bb, src.data() + i * bb, bb);
        }));
        if (!ok || std::memcmp(dst.data(), src.data(), src.size()) != 0) {
          std::fprintf(stderr, "kvtier bench serve: a store or load failed or differed\n");
          return 1;
        }
      }
      const double m = Pct(mc, 0.5);
      // The ratio is the median of each repetition's own ratio (paired: the machine's load
      // drifts between repetitions more than within one).
      auto paired = [&](const std::vector<double>& v) {
        std::vector<double> r;
        for (size_t i = 0; i < v.size(); ++i) r.push_back(v[i] / mc[i]);
        return Pct(r, 0.5);
      };
      for (auto [op, v, ratio] : {std::tuple{"store", Pct(store, 0.5), paired(store)},
                                  std::tuple{"load", Pct(load, 0.5), paired(load)}}) {
        (*out)["data_plane"].push_back({{"op", op},
                                        {"verify_commit", o.verify_commit},
                                        {"block_bytes", bb},
                                        {"threads", threads},
                                        {"gbps", v},
                                        {"memcpy_gbps", m},
                                        {"ratio", ratio}});
        if (!o.json)
          std::printf(
              "data plane %-5s %8s x%d  %6.2f GB/s  memcpy %6.2f GB/s  ratio %.2f (median of "
              "%zu paired)\n",
              op, FormatBytes(bb).c_str(), threads, v, m, ratio, mc.size());
      }
    }
  }
  return 0;
}

// What publishing KV events costs a store at 256 KiB blocks: the same working set stored into a
// daemon without events and one publishing them (to a subscriber that drains them), taking turns
// within each repetition; the ratio is the median of the paired ratios.
int EventsCost(const Opts& o, nlohmann::json* out) {
  const KvLayout l = *LayoutPreset("llama-3.1-8b", 2);
  const size_t bb = l.bytes_per_block();
  const size_t n = std::max<size_t>(*ParseByteSize(o.working_set) / bb, 4);
  CacheOptions with = HostOnly(l, n, true);
  const std::string ep =
      "ipc://" + TempRoot() + "/kvtier-bench-" + std::to_string(getpid()) + ".ev";
  with.events.endpoint = ep;
  ChildDaemon off(HostOnly(l, n, true), TempSocket("ev-off"));
  ChildDaemon on(with, TempSocket("ev-on"));
  auto c_off = Connect(off, l);
  auto c_on = Connect(on, l);
  if (!c_off.ok() || !c_on.ok()) {
    std::fprintf(stderr, "kvtier bench serve: events: cannot connect\n");
    return 1;
  }
  zmq::context_t ctx;
  zmq::socket_t sub(ctx, zmq::socket_type::sub);
  sub.set(zmq::sockopt::subscribe, "");
  sub.set(zmq::sockopt::rcvtimeo, 100);
  sub.connect(ep);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> messages{0};
  std::thread drain([&] {
    zmq::message_t m;
    while (!stop) {
      if (sub.recv(m)) messages.fetch_add(1, std::memory_order_relaxed);
    }
  });
  std::vector<std::byte> src(n * bb);
  for (size_t i = 0; i < src.size(); i += 4096) src[i] = std::byte(i >> 12);
  std::vector<BlockKey> keys(n);
  std::vector<ConstBlock> in(n);
  for (size_t i = 0; i < n; ++i) in[i] = ConstBlock(src.data() + i * bb, bb);
  // Each block carries an engine's hashes as the vLLM connector sends them (vLLM blocks of 16
  // tokens, 32-byte hashes, the parent, the tokens), so the publishing daemon keeps and
  // announces them; a daemon without events is not sent them.
  std::vector<EngineBlockHashes> engine(n);
  const uint32_t per = std::max<uint32_t>(1, l.block_tokens / 16);
  for (size_t i = 0; i < n; ++i) {
    for (uint32_t j = 0; j < per; ++j)
      engine[i].hashes.push_back(std::string(24, 'h') +
                                 std::string(reinterpret_cast<const char*>(&i), 8));
    engine[i].token_ids.assign(l.block_tokens, uint32_t(i));
    if (i > 0) engine[i].parent_hash = engine[i - 1].hashes.back();
  }
  RequestOptions rq;
  if (!o.no_engine_hashes) rq.engine_hashes = engine;
  std::vector<double> g_off, g_on, ratio;
  double client_off = 0, client_on = 0;  // the storing thread's CPU seconds
  bool ok = true;
  // The daemons' CPU over every repetition (the publisher's thread included, after it drained).
  // Only while storing: the flush before each store (and its removal events) is not counted.
  double daemon_off = 0, daemon_on = 0, pub_on_s = 0;
  for (int r = 0; r < o.reps; ++r) {
    for (size_t i = 0; i < n; ++i) keys[i] = BlockKey{uint64_t(r) + 1, i + 1};
    auto store = [&](Client& c) {
      (void)c.DropAll();
      const bool is_on = &c == c_on->get();
      ChildDaemon& d = is_on ? on : off;
      timespec c0{}, c1{};
      const double d0 = d.CpuSeconds(), p0 = is_on ? on.ThreadCpuSeconds("kvtier-events") : 0;
      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
      const auto t0 = Clock::now();
      auto s = c.StoreKeys(keys, in, 0, rq);
      const double gbps = n * bb / Seconds(t0) / 1e9;
      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
      (is_on ? client_on : client_off) +=
          double(c1.tv_sec - c0.tv_sec) + double(c1.tv_nsec - c0.tv_nsec) * 1e-9;
      (is_on ? daemon_on : daemon_off) += d.CpuSeconds() - d0;
      if (is_on) pub_on_s += on.ThreadCpuSeconds("kvtier-events") - p0;
      ok &= s.ok() && s->stored_blocks == n;
      return gbps;
    };
    // Alternate which goes first: neither always finds the caches warm.
    const bool off_first = r % 2 == 0;
    const double a = off_first ? store(**c_off) : 0;
    const double b = store(**c_on);
    const double a2 = off_first ? a : store(**c_off);
    g_off.push_back(a2);
    g_on.push_back(b);
    ratio.push_back(b / a2);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const double gib = double(n * bb) * o.reps / double(1ull << 30);
  const double cpu_off = daemon_off / gib;
  const double cpu_on = daemon_on / gib;
  // The publisher's own thread: off the store path (a store only queues its events).
  const double pub_on = pub_on_s / gib;
  const double path_on = cpu_on - pub_on;
  // CPU on the store path per GiB (the client's copy and the daemon's work, the publisher's
  // thread aside), with events over without: what publishing adds to a store.
  const double path_ratio =
      (client_on / gib + path_on) / std::max(1e-12, client_off / gib + cpu_off);
  stop = true;
  drain.join();
  if (!ok || messages.load() == 0) {
    std::fprintf(stderr, "kvtier bench serve: events: a store failed or no event arrived\n");
    return 1;
  }
  (*out)["events"] = {{"block_bytes", bb},
                      {"gbps_off", Pct(g_off, 0.5)},
                      {"gbps_on", Pct(g_on, 0.5)},
                      {"ratio", Pct(ratio, 0.5)},
                      {"reps", o.reps},
                      {"messages", messages.load()},
                      {"daemon_cpu_s_per_gib_off", cpu_off},
                      {"daemon_cpu_s_per_gib_on", cpu_on},
                      {"publisher_cpu_s_per_gib", pub_on},
                      {"store_path_cpu_s_per_gib_on", path_on},
                      {"client_cpu_s_per_gib_off", client_off / gib},
                      {"client_cpu_s_per_gib_on", client_on / gib},
                      {"store_path_cpu_ratio", path_ratio},
                      {"engine_hashes", !o.no_engine_hashes}};
  if (!o.json)
    std::printf(
        "events     store %8s  off %6.2f GB/s  on %6.2f GB/s  ratio %.3f (median of %d paired, "
        "%llu messages%s); daemon CPU off %.4f on %.4f s/GiB stored (publisher thread %.4f, the "
        "rest %.4f); store-path CPU (client + daemon, publisher aside) on/off %.4f\n",
        FormatBytes(bb).c_str(), Pct(g_off, 0.5), Pct(g_on, 0.5), Pct(ratio, 0.5), o.reps,
        (unsigned long long)messages.load(), o.no_engine_hashes ? "" : ", engine hashes", cpu_off,
        cpu_on, pub_on, path_on, path_ratio);
  return 0;
}

double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

// The daemon's CPU for a working set stored by one client in batches of 8 blocks, from the
// first store until the SSD tier holds every block (host + disk daemon), beside the same run's
// host-only daemon storing the same blocks and an O_DIRECT pwrite loop of the same bytes in
// this process (what writing them costs the kernel at the least).
int WriteThrough(const Opts& o, nlohmann::json* out) {
  const uint64_t ws = *ParseByteSize(o.working_set);
  const KvLayout l = *LayoutPreset("llama-3.1-8b", 16);  // 2 MiB blocks
  const size_t bb = l.bytes_per_block();
  const size_t n = std::max<size_t>(ws / bb, 16);
  const std::string root = o.disk_dir.empty() ? TempRoot() : o.disk_dir;
  std::string dir = root + "/kvtier-bench-wt-XXXXXX";
  if (::mkdtemp(dir.data()) == nullptr) {
    std::fprintf(stderr, "kvtier bench serve: mkdtemp under %s: %s\n", root.c_str(),
                 std::strerror(errno));
    return 1;
  }
  std::vector<std::byte> src(n * bb);
  for (size_t i = 0; i < src.size(); i += 64) src[i] = std::byte(i >> 6);
  std::vector<double> wt, host, odirect;
  bool direct = true;
  int rc = 0;
  for (int r = 0; r < o.reps && rc == 0; ++r) {
    for (bool disk : {true, false}) {
      CacheOptions co = HostOnly(l, n + 8, true);
      if (disk) {
        TierSpec t;
        t.kind = "disk";
        t.capacity_bytes = 2 * n * bb + (uint64_t{256} << 20);
        t.params["path"] = dir + "/ssd-" + std::to_string(r);
        co.tiers.push_back(t);
      }
      ChildDaemon d(co, TempSocket("wt"));
      auto c = Connect(d, l);
      if (!c.ok()) {
        std::fprintf(stderr, "kvtier bench serve: %s\n", c.status().ToString().c_str());
        return 1;
      }
      const double cpu0 = d.CpuSeconds();
      size_t stored = 0;
      for (size_t b = 0; b < n; b += 8) {
        const size_t e = std::min(n, b + 8);
        std::vector<BlockKey> keys;
        std::vector<ConstBlock> in;
        for (size_t i = b; i < e; ++i) {
          keys.push_back(BlockKey{uint64_t(r) + 1, i + 1});
          in.emplace_back(src.data() + i * bb, bb);
        }
        auto s = (*c)->StoreKeys(keys, in, 0);
        if (s.ok()) stored += s->stored_blocks;
      }
      const auto deadline = Clock::now() + std::chrono::seconds(120);
      while (disk) {
        auto st = (*c)->GetDaemonStatus();
        if (st.ok() && st->cache.tiers.size() > 1 && st->cache.tiers[1].tier.puts >= n) break;
        if (Clock::now() > deadline) {
          std::fprintf(stderr, "kvtier bench serve: the SSD tier did not get %zu blocks in 120 s\n",
                       n);
          rc = 1;
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      const double cpu = d.CpuSeconds() - cpu0;
      if (stored != n || cpu0 < 0) {
        std::fprintf(stderr, "kvtier bench serve: %zu of %zu blocks stored\n", stored, n);
        rc = 1;
      }
      (disk ? wt : host).push_back(cpu * double(1 << 30) / double(n * bb));
    }
    // The floor: the same bytes written with O_DIRECT from page-aligned memory, one block at a
    // time, by this thread.
    const std::string path = dir + "/odirect-" + std::to_string(r);
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0600);
    if (fd < 0 && errno == EINVAL) {  // a filesystem without O_DIRECT (tmpfs): as the tier does
      direct = false;
      fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    }
    void* mem = nullptr;
    if (fd < 0 || posix_memalign(&mem, 4096, bb) != 0) {
      std::fprintf(stderr, "kvtier bench serve: O_DIRECT file %s: %s\n", path.c_str(),
                   std::strerror(errno));
      if (fd >= 0) ::close(fd);
      rc = 1;
      break;
    }
    const double t0 = ThreadCpuSeconds();
    for (size_t i = 0; i < n && rc == 0; ++i) {
      std::memcpy(mem, src.data() + i * bb, 64);  // touch: not a copy of the block
      if (::pwrite(fd, mem, bb, static_cast<off_t>(i * bb)) != static_cast<ssize_t>(bb)) rc = 1;
    }
    odirect.push_back((ThreadCpuSeconds() - t0) * double(1 << 30) / double(n * bb));
    std::free(mem);
    ::close(fd);
    ::unlink(path.c_str());
  }
  std::filesystem::remove_all(dir);
  if (rc != 0) return rc;
  std::vector<double> extra;
  for (size_t i = 0; i < wt.size(); ++i) extra.push_back(wt[i] - host[i]);
  (*out)["write_through"] = {{"block_bytes", bb},
                             {"blocks", n},
                             {"daemon_cpu_s_per_gib", Pct(wt, 0.5)},
                             {"host_only_daemon_cpu_s_per_gib", Pct(host, 0.5)},
                             {"write_through_cpu_s_per_gib", Pct(extra, 0.5)},
                             {"odirect_cpu_s_per_gib", Pct(odirect, 0.5)},
                             {"o_direct", direct}};
  if (!o.json)
    std::printf(
        "write-through %s x%zu  daemon CPU %.3f s/GiB (host-only daemon %.3f): %.3f s/GiB for the "
        "SSD copy  %s loop %.3f s/GiB (median of %zu)\n",
        FormatBytes(bb).c_str(), n, Pct(wt, 0.5), Pct(host, 0.5), Pct(extra, 0.5),
        direct ? "O_DIRECT" : "buffered (no O_DIRECT here)", Pct(odirect, 0.5), wt.size());
  return 0;
}

int ControlPlane(const Opts& o, nlohmann::json* out) {
  // 2,000 blocks of 64 tokens (a 128K-token prompt); small blocks: bytes do not matter here.
  KvLayout l;
  l.num_layers = 1;
  l.num_kv_heads = 1;
  l.head_dim = 4;
  l.dtype = DType::kFp32;
  l.block_tokens = 64;
  ChildDaemon d(HostOnly(l, 4096, true), TempSocket("cp"));
  auto first = Connect(d, l);
  if (!first.ok()) {
    std::fprintf(stderr, "kvtier bench serve: %s\n", first.status().ToString().c_str());
    return 1;
  }
  std::vector<TokenId> tokens(2000 * 64);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<TokenId>(i * 7 + 1);
  PrefixHasher h((*first)->Root(), l.block_tokens);
  for (size_t at = 0; at < tokens.size(); at += 4096)  // incrementally, as turns arrive
    h.Extend(std::span(tokens).subspan(at, std::min<size_t>(4096, tokens.size() - at)));
  const std::vector<BlockKey>& keys = h.keys();
  std::vector<std::byte> blk(l.bytes_per_block() * keys.size(), std::byte{7});
  std::vector<ConstBlock> blocks;
  for (size_t i = 0; i < keys.size(); ++i)
    blocks.emplace_back(blk.data() + i * l.bytes_per_block(), l.bytes_per_block());
  auto s = (*first)->StoreKeys(keys, blocks);
  if (!s.ok() || s->stored_blocks != keys.size()) {
    std::fprintf(stderr, "kvtier bench serve: storing the chain failed\n");
    return 1;
  }
  for (int clients : {1, 8}) {
    std::vector<std::unique_ptr<Client>> cs;
    for (int i = 0; i < clients; ++i) {
      auto c = Connect(d, l);
      if (!c.ok()) return 1;
      cs.push_back(std::move(c).value());
    }
    const int per = std::max(1, o.lookups / clients);
    std::vector<std::vector<double>> lk(clients), fl(clients);
    std::vector<std::thread> ts;
    bool ok = true;
    for (int i = 0; i < clients; ++i) {
      ts.emplace_back([&, i] {
        for (int k = 0; k < per; ++k) {
          auto t0 = Clock::now();
          auto lr = cs[i]->LookupKeys(keys);
          lk[i].push_back(Seconds(t0) * 1e6);
          if (!lr.ok() || lr->hit_blocks != keys.size()) ok = false;
          // The lease's release is one-way: an untimed ping takes whatever the daemon does
          // for it, so the floor is an empty round trip alone.
          if (lr.ok()) lr->pins.Release();
          (void)cs[i]->Ping();
          t0 = Clock::now();
          (void)cs[i]->Ping();
          fl[i].push_back(Seconds(t0) * 1e6);
        }
      });
    }
    for (auto& t : ts) t.join();
    if (!ok) {
      std::fprintf(stderr, "kvtier bench serve: a lookup missed\n");
      return 1;
    }
    std::vector<double> all, floor;
    for (int i = 0; i < clients; ++i) {
      all.insert(all.end(), lk[i].begin(), lk[i].end());
      floor.insert(floor.end(), fl[i].begin(), fl[i].end());
    }
    const double p50 = Pct(all, 0.5), p99 = Pct(all, 0.99), f50 = Pct(floor, 0.5);
    (*out)["lookup"].push_back({{"clients", clients},
                                {"blocks", keys.size()},
                                {"calls", all.size()},
                                {"p50_us", p50},
                                {"p99_us", p99},
                                {"floor_p50_us", f50},
                                {"bar_us", 2 * f50 + 20}});
    if (!o.json)
      std::printf(
          "lookup 2000 blocks, %d clients: p50 %.1f us  p99 %.1f us  (empty round trip "
          "p50 %.1f us; bar p50 <= %.1f us)\n",
          clients, p50, p99, f50, 2 * f50 + 20);
  }
  return 0;
}

int Memory(const Opts& o, nlohmann::json* out) {
  KvLayout l;  // 128-byte blocks: a million of them in a 128 MiB arena
  l.num_layers = 1;
  l.num_kv_heads = 1;
  l.head_dim = 4;
  l.dtype = DType::kFp32;
  l.block_tokens = 4;
  const uint64_t n = o.rss_blocks;
  ChildDaemon d(HostOnly(l, n, false), TempSocket("rss"));
  auto c = Connect(d, l);
  if (!c.ok()) return 1;
  const uint64_t before = d.RssOutsideArena();
  std::vector<std::byte> blk(l.bytes_per_block() * 4096, std::byte{3});
  std::vector<BlockKey> keys(4096);
  std::vector<ConstBlock> blocks;
  for (size_t i = 0; i < 4096; ++i)
    blocks.emplace_back(blk.data() + i * l.bytes_per_block(), l.bytes_per_block());
  uint64_t stored = 0;
  for (uint64_t at = 0; at < n; at += 4096) {
    const size_t m = static_cast<size_t>(std::min<uint64_t>(4096, n - at));
    for (size_t i = 0; i < m; ++i) keys[i] = BlockKey{0xbe, at + i + 1};
    auto s = (*c)->StoreKeys(std::span(keys).first(m), std::span(blocks).first(m));
    if (s.ok()) stored += s->stored_blocks;
  }
  auto st = (*c)->GetDaemonStatus();
  const uint64_t resident = st.ok() ? st->cache.tiers[0].resident_blocks : 0;
  const uint64_t after = d.RssOutsideArena();
  (*out)["rss_outside_arena_bytes"] = after;
  (*out)["rss_outside_arena_before_bytes"] = before;
  (*out)["resident_blocks"] = resident;
  (*out)["rss_outside_arena_per_block"] = resident ? double(after) / resident : 0;
  if (!o.json)
    std::printf(
        "daemon RSS outside the arena: %s with %llu resident blocks = %.1f B/block "
        "(%s before any block; bar <= 256 B/block)\n",
        FormatBytes(after).c_str(), (unsigned long long)resident,
        resident ? double(after) / resident : 0.0, FormatBytes(before).c_str());
  return stored == n ? 0 : 1;
}

}  // namespace

KVTIER_REGISTER_COMMAND(
    bench_serve, ({"bench", "serve"}),
    "Daemon data plane, lookup latency and memory beside same-run baselines",
    [](CLI::App* app) -> RunFn {
      auto o = std::make_shared<Opts>();
      app->add_flag("--json", o->json, "JSON on stdout");
      app->add_option("--reps", o->reps, "repetitions (median), default 5");
      app->add_option("--lookups", o->lookups, "lookups per client count, default 10000");
      app->add_option("--rss-blocks", o->rss_blocks,
                      "resident blocks for the memory figure, default 1M");
      app->add_option("--working-set", o->working_set,
                      "bytes per data-plane repetition, default 128MiB");
      app->add_flag("--verify-commit", o->verify_commit,
                    "daemon with serve.verify_commit on (store rows)");
      app->add_option("--phases", o->phases,
                      "which of data,writethrough,lookup,memory,events to run (default all "
                      "but events)");
      app->add_option("--disk-dir", o->disk_dir,
                      "writethrough: directory for the SSD tier (default $TMPDIR or /tmp)");
      app->add_flag("--no-engine-hashes", o->no_engine_hashes,
                    "events: stores carry no engine hashes (kvtier's keys are announced)");
      return [o] {
        nlohmann::json out;
        out["data_plane"] = nlohmann::json::array();
        out["lookup"] = nlohmann::json::array();
        auto on = [&](const char* p) { return o->phases.find(p) != std::string::npos; };
        int rc = on("data") ? DataPlane(*o, &out) : 0;
        if (rc == 0 && on("writethrough")) rc = WriteThrough(*o, &out);
        if (rc == 0 && on("lookup")) rc = ControlPlane(*o, &out);
        if (rc == 0 && on("memory")) rc = Memory(*o, &out);
        if (rc == 0 && on("events")) rc = EventsCost(*o, &out);
        if (o->json) std::printf("%s\n", out.dump(2).c_str());
        return rc;
      };
    });

}  // namespace kvtier::cli
