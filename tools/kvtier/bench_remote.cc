// kvtier bench remote: the remote tier's put/get GB/s beside what redis-benchmark reaches on the
// same server in the same run (its best over pipeline depths 1 and 16 and 1, 4 and 8 clients,
// against the tier's best of six configurations; medians over interleaved repetitions), and raw
// loopback TCP stream bandwidth as the physical ceiling. Without --url it starts its own
// redis-server on a free loopback port and stops it at the end.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "command.h"
#include "subprocess.h"
#include "tiers/remote/redis_url.h"
#include "tiers/remote/remote_tier.h"

namespace kvtier::cli {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

double CpuSeconds(const rusage& ru) {
  return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec +
         1e-6 * (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

// Runs argv to completion; its stdout, or nullopt when it failed. *cpu_s: its CPU seconds.
std::optional<std::string> RunCapture(const std::vector<std::string>& argv, double* cpu_s) {
  int fd = -1;
  pid_t pid = Spawn(argv, &fd);
  if (pid < 0) return std::nullopt;
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof buf)) > 0) out.append(buf, n);
  close(fd);
  int status = 0;
  rusage ru{};
  wait4(pid, &status, 0, &ru);
  if (cpu_s != nullptr) *cpu_s = CpuSeconds(ru);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return std::nullopt;
  return out;
}

// Raw loopback TCP stream: one sender, one receiver, 1 MiB writes; best of three.
double TcpLoopbackGbps(double seconds) {
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (bind(ls, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || listen(ls, 1) != 0 ||
        getsockname(ls, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      close(ls);
      return 0;
    }
    std::atomic<uint64_t> received{0};
    std::thread rx([&] {
      int s = accept(ls, nullptr, nullptr);
      std::vector<char> buf(1 << 20);
      ssize_t n;
      while ((n = recv(s, buf.data(), buf.size(), 0)) > 0) received += n;
      close(s);
    });
    int tx = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(tx, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      close(tx);
      close(ls);
      rx.join();
      return 0;
    }
    std::vector<char> buf(1 << 20, 'x');
    auto t0 = Clock::now();
    while (Seconds(Clock::now() - t0) < seconds) {
      if (send(tx, buf.data(), buf.size(), MSG_NOSIGNAL) <= 0) break;
    }
    shutdown(tx, SHUT_WR);
    close(tx);
    rx.join();
    double dt = Seconds(Clock::now() - t0);
    close(ls);
    best = std::max(best, static_cast<double>(received.load()) / dt / 1e9);
  }
  return best;
}

struct Figure {
  double gbps = 0;
  double ops = 0;
  std::string config;
};

// redis-benchmark's best SET and GET over -P {1,16} x -c {1,4,8}.
Status RedisBenchmarkBest(const remote::RedisUrl& url, bool cluster, uint64_t value_bytes,
                          double seconds_each, double guess_gbps, bool verbose, Figure* set,
                          Figure* get) {
  std::string bin = FindInPath("redis-benchmark");
  if (bin.empty()) return Status::Unavailable("redis-benchmark not found (install redis-tools)");
  for (int pipeline : {1, 16}) {
    for (int clients : {1, 4, 8}) {
      // Enough requests for about seconds_each per test at the rate the tier just reached.
      uint64_t n = static_cast<uint64_t>(guess_gbps * 1e9 * seconds_each / value_bytes);
      n = std::max<uint64_t>(n, uint64_t(pipeline) * clients * 2);
      std::vector<std::string> argv = {bin,
                                       "-h",
                                       url.seeds[0].host,
                                       "-p",
                                       std::to_string(url.seeds[0].port),
                                       "-t",
                                       "set,get",
                                       "-d",
                                       std::to_string(value_bytes),
                                       "-P",
                                       std::to_string(pipeline),
                                       "-c",
                                       std::to_string(clients),
                                       "-n",
                                       std::to_string(n),
                                       "--csv"};
      if (!url.password.empty()) {
        argv.insert(argv.end(), {"-a", url.password});
        if (!url.user.empty()) argv.insert(argv.end(), {"--user", url.user});
      }
      if (cluster) argv.push_back("--cluster");
      double cpu = 0;
      std::optional<std::string> out = RunCapture(argv, &cpu);
      if (!out)
        return Status::Unavailable("redis-benchmark failed: -P " + std::to_string(pipeline) +
                                   " -c " + std::to_string(clients));
      std::stringstream lines(*out);
      std::string line;
      while (std::getline(lines, line)) {
        // "SET","1234.56",...
        bool is_set = line.rfind("\"SET\"", 0) == 0, is_get = line.rfind("\"GET\"", 0) == 0;
        if (!is_set && !is_get) continue;
        size_t q1 = line.find('"', 5), q2 = line.find('"', q1 + 1);
        if (q1 == std::string::npos || q2 == std::string::npos) continue;
        double rps = std::atof(line.substr(q1 + 1, q2 - q1 - 1).c_str());
        Figure f{rps * value_bytes / 1e9, rps,
                 "-P " + std::to_string(pipeline) + " -c " + std::to_string(clients)};
        if (verbose) {
          std::fprintf(stderr, "  redis-benchmark %s %s: %.2f GB/s (client CPU %.2f s/GB, both)\n",
                       is_set ? "SET" : "GET", f.config.c_str(), f.gbps,
                       cpu / (2.0 * n * value_bytes / 1e9));
        }
        Figure* dst = is_set ? set : get;
        if (f.gbps > dst->gbps) *dst = f;
      }
    }
  }
  return Status::Ok();
}

struct TierRun {
  double put_gbps = 0, get_gbps = 0;
  double put_cpu_per_gb = 0, get_cpu_per_gb = 0;  // client CPU seconds per GB moved
};

// Puts then gets blocks with `threads` callers in batches of `batch`, over a small key set
// that is overwritten (as redis-benchmark overwrites its one key, so neither side pays for the
// server's first touch of fresh memory). One untimed pass first checks every byte; the timed
// passes then cycle for `seconds` each (the tier still verifies every checksum).
Result<TierRun> RunTier(remote::RemoteTier& tier, int threads, int batch, double seconds,
                        uint64_t salt) {
  const size_t bytes = tier.block_bytes();
  std::vector<std::vector<std::byte>> data(threads, std::vector<std::byte>(bytes * batch));
  std::mt19937_64 rng(salt);
  for (auto& d : data) {
    for (size_t i = 0; i < d.size(); i += 8) {
      uint64_t x = rng();
      std::memcpy(d.data() + i, &x, std::min<size_t>(8, d.size() - i));
    }
  }
  const size_t per_thread = static_cast<size_t>(batch);
  auto key_of = [&](int t, size_t i) { return BlockKey{salt, uint64_t(t) << 32 | i}; };
  std::atomic<uint64_t> failures{0};
  double last_cpu_per_gb = 0;
  // Get buffers, touched once here: fresh pages would charge page faults to the timed loop.
  std::vector<std::vector<std::vector<std::byte>>> landing(
      threads, std::vector<std::vector<std::byte>>(batch, std::vector<std::byte>(bytes)));
  // seconds == 0: one checked pass over the keys.
  auto phase = [&](bool put, double secs) {
    std::vector<std::thread> pool;
    std::vector<uint64_t> moved(threads, 0);
    rusage ru0{}, ru1{};
    getrusage(RUSAGE_SELF, &ru0);
    auto t0 = Clock::now();
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        std::vector<BlockKey> k(batch);
        std::vector<ConstBlock> cb(batch);
        std::vector<std::byte>* in = landing[t].data();
        std::vector<MutableBlock> mb(batch);
        std::vector<Status> st(batch);
        for (int j = 0; j < batch; ++j) {
          cb[j] = ConstBlock(data[t].data() + j * bytes, bytes);
          if (!put) mb[j] = in[j];
        }
        size_t next = 0;
        do {
          for (int j = 0; j < batch; ++j) k[j] = key_of(t, next + j);
          Status call = put ? tier.Put(k, cb, st) : tier.Get(k, mb, st);
          for (int j = 0; j < batch; ++j) {
            bool ok = call.ok() && st[j].ok() &&
                      (put || secs > 0 || std::memcmp(in[j].data(), cb[j].data(), bytes) == 0);
            if (ok) {
              moved[t] += bytes;
            } else {
              failures.fetch_add(1);
            }
          }
          next += batch;
          if (next >= per_thread) {
            next = 0;
            if (secs == 0) break;
          }
        } while (secs == 0 || Seconds(Clock::now() - t0) < secs);
      });
    }
    for (auto& th : pool) th.join();
    double dt = Seconds(Clock::now() - t0);
    getrusage(RUSAGE_SELF, &ru1);
    uint64_t total = 0;
    for (uint64_t m : moved) total += m;
    last_cpu_per_gb = (CpuSeconds(ru1) - CpuSeconds(ru0)) / (total / 1e9);
    return static_cast<double>(total) / dt / 1e9;
  };
  TierRun r;
  phase(true, 0);
  phase(false, 0);
  r.put_gbps = phase(true, seconds);
  r.put_cpu_per_gb = last_cpu_per_gb;
  r.get_gbps = phase(false, seconds);
  r.get_cpu_per_gb = last_cpu_per_gb;
  if (failures.load() > 0) {
    return Status::Internal(std::to_string(failures.load()) +
                            " blocks failed or came back different");
  }
  return r;
}

struct Options {
  std::string url;
  bool json = false;
  std::vector<std::string> sizes = {"256KiB", "2MiB"};
  double seconds = 0.3;
  bool verbose = false;
  int reps = 5;
  int connections = 2;
  int set_window = 1;
  int get_window = 1;
};

int Run(const Options& opt) {
  RedisServer own;
  std::string url_text = opt.url;
  if (url_text.empty()) {
    Status s = own.Start();
    if (!s.ok()) {
      std::fprintf(stderr, "kvtier bench remote: %s (or give --url)\n", s.ToString().c_str());
      return 1;
    }
    url_text = own.url();
  }
  Result<remote::RedisUrl> url = remote::ParseRedisUrl(url_text);
  if (!url.ok()) {
    std::fprintf(stderr, "kvtier bench remote: --%s\n", url.status().message().c_str());
    return 2;
  }
  double tcp = TcpLoopbackGbps(0.4);
  nlohmann::json rows = nlohmann::json::array();
  bool all_ok = true;
  if (!opt.json) {
    std::printf("remote tier at %s; loopback TCP %.2f GB/s\n", url->Redacted().c_str(), tcp);
    std::printf("%-4s %10s %10s %10s %8s  %-22s %s\n", "op", "value", "GB/s", "base GB/s", "ratio",
                "kvtier config", "redis-benchmark config");
  }
  for (const std::string& size_text : opt.sizes) {
    Result<uint64_t> size = ParseByteSize(size_text);
    if (!size.ok() || *size < 64 || *size % 64 != 0) {
      std::fprintf(stderr,
                   "kvtier bench remote: --sizes: '%s' is not a byte size (multiple of 64)\n",
                   size_text.c_str());
      return 2;
    }
    // One layer, one head of fp32: head_dim * 512 bytes per 64-token block.
    KvLayout layout;
    layout.num_layers = 1;
    layout.num_kv_heads = 1;
    layout.dtype = DType::kFp32;
    layout.block_tokens = 64;
    layout.head_dim = static_cast<uint32_t>(*size / 512);
    if (layout.bytes_per_block() != *size) {
      std::fprintf(stderr, "kvtier bench remote: --sizes: %s is not a multiple of 512 bytes\n",
                   size_text.c_str());
      return 2;
    }
    remote::RemoteTierOptions to;
    to.name = "bench";
    to.layout = layout;
    to.capacity_bytes = uint64_t{1} << 40;
    to.url = url_text;
    to.key_prefix = "kvtier-bench:";
    to.timeout_ms = 10000;
    to.connections_per_node = opt.connections;
    to.set_window = opt.set_window;
    to.get_window = opt.get_window;
    Result<std::unique_ptr<remote::RemoteTier>> tier = remote::RemoteTier::Open(to);
    if (!tier.ok()) {
      std::fprintf(stderr, "kvtier bench remote: %s\n", tier.status().ToString().c_str());
      return 1;
    }
    struct Config {
      int threads, batch;
    };
    // Each repetition runs the tier's six configurations, then redis-benchmark's six, and
    // keeps each side's best of that repetition. Reported: the median over repetitions of
    // those bests, and the median of the paired per-repetition ratios, so one lucky or
    // unlucky spell on this shared machine moves neither side alone.
    struct Rep {
      Figure put, get, set, bget;
    };
    std::vector<Rep> reps;
    for (int rep = 0; rep < opt.reps; ++rep) {
      Rep r;
      // Six configurations, as many as redis-benchmark gets: 1 to 8 callers of one block each
      // (one value per connection in flight, as its 1 to 8 clients at -P 1, and a working set
      // as small as its single key's), and batches of 4 and 16 (pipelined, like -P 16).
      for (Config c :
           {Config{1, 1}, Config{2, 1}, Config{4, 1}, Config{8, 1}, Config{4, 4}, Config{2, 16}}) {
        Result<TierRun> run = RunTier(**tier, c.threads, c.batch, opt.seconds, *size);
        if (!run.ok()) {
          std::fprintf(stderr, "kvtier bench remote: %s\n", run.status().ToString().c_str());
          return 1;
        }
        std::string cfg = std::to_string(c.threads) + " threads, batch " + std::to_string(c.batch);
        if (opt.verbose) {
          std::fprintf(
              stderr,
              "  kvtier %s %s: put %.2f GB/s (CPU %.2f s/GB), get %.2f GB/s (CPU %.2f s/GB)\n",
              size_text.c_str(), cfg.c_str(), run->put_gbps, run->put_cpu_per_gb, run->get_gbps,
              run->get_cpu_per_gb);
        }
        if (run->put_gbps > r.put.gbps) r.put = {run->put_gbps, run->put_gbps * 1e9 / *size, cfg};
        if (run->get_gbps > r.get.gbps) r.get = {run->get_gbps, run->get_gbps * 1e9 / *size, cfg};
      }
      // Drop our keys before the baseline runs so both see the same server memory.
      {
        std::vector<BlockKey> ks;
        for (int t = 0; t < 8; ++t) {  // every caller of every configuration above
          for (size_t i = 0; i < 16; ++i) ks.push_back(BlockKey{*size, uint64_t(t) << 32 | i});
        }
        for (size_t off = 0; off < ks.size(); off += 256) {
          (void)(*tier)->Erase(std::span(ks).subspan(off, std::min<size_t>(256, ks.size() - off)));
        }
      }
      Status b = RedisBenchmarkBest(*url, (*tier)->is_cluster(), *size, opt.seconds,
                                    std::max(r.put.gbps, 0.3), opt.verbose, &r.set, &r.bget);
      if (!b.ok()) {
        std::fprintf(stderr, "kvtier bench remote: %s\n", b.ToString().c_str());
        return 1;
      }
      if (opt.verbose) {
        std::fprintf(stderr, "  repetition %d: put %.2f/%.2f GB/s, get %.2f/%.2f GB/s\n", rep + 1,
                     r.put.gbps, r.set.gbps, r.get.gbps, r.bget.gbps);
      }
      reps.push_back(r);
    }
    for (int op = 0; op < 2; ++op) {
      auto tier_of = [op](const Rep& r) -> const Figure& { return op == 0 ? r.put : r.get; };
      auto base_of = [op](const Rep& r) -> const Figure& { return op == 0 ? r.set : r.bget; };
      std::vector<double> tg, bg, ratios;
      for (const Rep& r : reps) {
        tg.push_back(tier_of(r).gbps);
        bg.push_back(base_of(r).gbps);
        ratios.push_back(base_of(r).gbps > 0 ? tier_of(r).gbps / base_of(r).gbps : 0);
      }
      // The configurations named are those of the repetition nearest the median ratio.
      size_t mid = 0;
      const double ratio = Median(ratios);
      for (size_t i = 0; i < ratios.size(); ++i) {
        if (std::abs(ratios[i] - ratio) < std::abs(ratios[mid] - ratio)) mid = i;
      }
      const Figure& f = tier_of(reps[mid]);
      const Figure& base = base_of(reps[mid]);
      const double gbps = Median(tg), base_gbps = Median(bg);
      all_ok &= ratio >= 0.9;
      rows.push_back({{"op", op == 0 ? "put" : "get"},
                      {"value_bytes", *size},
                      {"gbps", gbps},
                      {"ops_per_s", gbps * 1e9 / *size},
                      {"baseline_gbps", base_gbps},
                      {"baseline_ops_per_s", base_gbps * 1e9 / *size},
                      {"ratio", ratio},
                      {"config", f.config},
                      {"baseline_config", base.config},
                      {"repetitions", reps.size()}});
      if (!opt.json) {
        std::printf("%-4s %10s %10.2f %10.2f %8.2f  %-22s %s\n", op == 0 ? "put" : "get",
                    FormatBytes(*size).c_str(), gbps, base_gbps, ratio, f.config.c_str(),
                    base.config.c_str());
      }
    }
  }
  if (opt.json) {
    nlohmann::json out = {{"remote", rows}, {"tcp_loopback_gbps", tcp}};
    std::printf("%s\n", out.dump(2).c_str());
  } else {
    std::printf("bar (>= 0.9x redis-benchmark's best, put and get): %s\n",
                all_ok ? "met" : "MISSED");
  }
  return 0;
}

}  // namespace
}  // namespace kvtier::cli

KVTIER_REGISTER_COMMAND(bench_remote, ({"bench", "remote"}),
                        "Remote tier put/get GB/s beside redis-benchmark and loopback TCP",
                        [](CLI::App* app) -> kvtier::cli::RunFn {
                          auto opt = std::make_shared<kvtier::cli::Options>();
                          app->add_option("--url", opt->url,
                                          "redis://[user:pass@]host:port[,host:port...]; "
                                          "default: start a redis-server on loopback");
                          app->add_flag("--json", opt->json, "Print JSON");
                          app->add_flag("--verbose", opt->verbose,
                                        "Print every configuration's figure to stderr");
                          app->add_option("--sizes", opt->sizes, "Value sizes")->delimiter(',');
                          app->add_option("--connections", opt->connections,
                                          "Tier connections per node for large blocks");
                          app->add_option("--set-window", opt->set_window,
                                          "SETs in flight per connection (0: no limit)");
                          app->add_option("--get-window", opt->get_window,
                                          "GETs in flight per connection (0: no limit)");
                          app->add_option("--reps", opt->reps,
                                          "Repetitions of the whole comparison (medians kept)")
                              ->check(CLI::Range(1, 100));
                          app->add_option("--seconds", opt->seconds, "Seconds per measured phase");
                          return [opt] { return kvtier::cli::Run(*opt); };
                        });
