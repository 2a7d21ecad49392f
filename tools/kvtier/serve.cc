// kvtier serve: the node daemon (doc/serve.md); kvtier status / flush: its operator commands.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "command.h"
#include "common/log_format.h"
#include "kvtier/client.h"
#include "obs/prometheus.h"
#include "serve/sd_notify.h"
#include "serve/serve_options.h"
#include "serve/server.h"
#include "serve_export.h"
#include "status_format.h"

namespace kvtier::cli {
namespace {

int g_signal_pipe[2] = {-1, -1};

void OnSignal(int sig) {
  const unsigned char byte = static_cast<unsigned char>(sig);
  (void)!write(g_signal_pipe[1], &byte, 1);  // async-signal-safe
}

Result<serve::ServeConfig> ReadConfig(const std::string& path) {
  if (path.empty()) {
    std::string why;
    serve::ServeConfig c = serve::DefaultServeConfig(&why);
    spdlog::info("kvtier serve: {}", why);
    return c;
  }
  return serve::LoadServeConfigFile(path);
}

// GET /metrics on addr (checked by ServeOptions::Validate): the cache's text and the daemon's.
Result<std::unique_ptr<MetricsServer>> StartMetrics(std::string addr, serve::Server* srv) {
  if (addr.find(':') == std::string::npos) addr = "127.0.0.1:" + addr;  // a port alone
  if (addr[0] == ':') addr = "127.0.0.1" + addr;
  KVTIER_ASSIGN_OR_RETURN(auto http, MetricsServer::Start(addr, [srv] {
                            const ServeCounters c = srv->counters();
                            std::string t = PrometheusText(srv->cache().stats(), &c);
                            t += EventsPrometheusText(srv->cache().events_info());
                            t += srv->TenantPrometheusText();
                            return t;
                          }));
  spdlog::info("kvtier serve: metrics on http://{}:{}/metrics", addr.substr(0, addr.rfind(':')),
               http->port());
  return http;
}

struct ServeFlags {
  std::string config, socket, metrics, events, log_level;
  bool log_json = false;
};

int RunServe(const ServeFlags& flags) {
  const std::string& config = flags.config;
  const std::string& socket = flags.socket;
  const std::string& events = flags.events;
  // First, so that every line (a bad config's too) has the asked level and format.
  if (Status st = ConfigureLogging(flags.log_level, flags.log_json); !st.ok()) {
    spdlog::error("kvtier serve: --log-level: {}", st.message());
    return 2;
  }
  auto cfg = ReadConfig(config);
  if (!cfg.ok()) {
    spdlog::error("kvtier serve: {}", cfg.status().message());
    return 2;
  }
  if (!socket.empty()) cfg->serve.socket_path = socket;
  if (!flags.metrics.empty()) cfg->serve.metrics_addr = flags.metrics;
  if (!events.empty()) cfg->serve.events_addr = events;
  if (Status st = cfg->serve.Validate(); !st.ok()) {
    spdlog::error("kvtier serve: serve.{}", st.message());
    return 2;
  }
  // Signals reach this thread through a pipe: whichever thread the kernel picks (libraries
  // such as the CUDA runtime start threads of their own) only writes the signal number.
  if (pipe2(g_signal_pipe, O_CLOEXEC) != 0) {
    spdlog::error("kvtier serve: pipe: {}", std::strerror(errno));
    return 1;
  }
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  for (int s : {SIGTERM, SIGINT, SIGHUP}) sigaction(s, &sa, nullptr);
  if (Status st = serve::ApplyEventOptions(cfg->serve, &cfg->cache); !st.ok()) {
    spdlog::error("kvtier serve: {}", st.message());
    return 2;
  }
  auto server = serve::Server::Start(cfg->cache, cfg->serve);
  if (!server.ok()) {
    spdlog::error("kvtier serve: {}", server.status().message());
    return 1;
  }
  if (const KvEventsInfo e = (*server)->cache().events_info(); !e.endpoint.empty()) {
    spdlog::info("kvtier serve: KV events on {} topic '{}' (kvtier keys: '{}')", e.endpoint,
                 e.topic, e.keys_topic);
    if (!e.replay_endpoint.empty())
      spdlog::info("kvtier serve: KV event replay on {}", e.replay_endpoint);
  }
  std::unique_ptr<MetricsServer> http;
  if (!cfg->serve.metrics_addr.empty()) {
    auto m = StartMetrics(cfg->serve.metrics_addr, server->get());
    if (!m.ok()) {
      spdlog::error("kvtier serve: serve.metrics_addr: {}", m.status().message());
      return 1;
    }
    http = std::move(m).value();
  }
  spdlog::info("kvtier serve: pid {} serving {} on {} (protocol {}, lease {} ms)", getpid(),
               cfg->cache.layout.ToString(), (*server)->socket_path(), serve::kProtocolVersion,
               cfg->serve.lease_ms);
  // Type=notify: systemd starts the units that need the daemon only now, with the socket bound
  // and the exporters up.
  if (Status st = serve::NotifySystemd("READY=1\nSTATUS=serving on " + (*server)->socket_path());
      !st.ok())
    spdlog::warn("kvtier serve: {}", st.message());
  for (;;) {
    unsigned char byte = 0;
    if (read(g_signal_pipe[0], &byte, 1) != 1) continue;  // EINTR
    const int sig = byte;
    if (sig == SIGHUP) {
      if (config.empty()) {
        spdlog::info("kvtier serve: SIGHUP: no --config to reload");
        continue;
      }
      auto again = serve::LoadServeConfigFile(config);
      if (!again.ok()) {
        spdlog::error("kvtier serve: SIGHUP: keeping the running config: {}",
                      again.status().message());
        continue;
      }
      if (!socket.empty()) again->serve.socket_path = socket;
      if (!events.empty()) again->serve.events_addr = events;
      for (const std::string& line : (*server)->Reload(again->cache, again->serve))
        spdlog::warn("kvtier serve: SIGHUP: {}", line);
      spdlog::info("kvtier serve: SIGHUP: reloaded {}", config);
      continue;
    }
    spdlog::info("kvtier serve: {}: draining", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    (void)serve::NotifySystemd("STOPPING=1");
    http.reset();
    (*server)->Stop();
    server->reset();  // its Cache's publisher sends the last events as it goes
    spdlog::info("kvtier serve: stopped");
    return 0;
  }
}

Result<std::unique_ptr<Client>> Operator(const std::string& socket, uint32_t timeout_ms) {
  ClientOptions o;
  o.socket_path = socket;
  o.timeout_ms = timeout_ms;
  KVTIER_ASSIGN_OR_RETURN(auto c, Client::Open(o));
  if (!c->connected())
    return Status::Unavailable("no daemon answers on " +
                               (socket.empty() ? DefaultSocketPath() : socket));
  return c;
}

RunFn SetupServe(CLI::App* app) {
  auto f = std::make_shared<ServeFlags>();
  app->add_option("--config", f->config, "YAML config (cache keys + serve: section)");
  app->add_option("--socket", f->socket, "Unix socket path (default " + DefaultSocketPath() + ")");
  app->add_option("--metrics-addr", f->metrics,
                  "HOST:PORT for GET /metrics (overrides the config)");
  app->add_option("--events", f->events,
                  "ZeroMQ endpoint for KV events, vLLM's format (overrides serve.events_addr)");
  app->add_option("--log-level", f->log_level,
                  "trace, debug, info (default), warn, error, critical or off");
  app->add_flag("--log-json", f->log_json,
                "One JSON object per log line (time, level, logger, pid, thread, msg)");
  return [f] { return RunServe(*f); };
}

int RunStatus(const std::string& socket, bool json, uint32_t timeout_ms) {
  auto c = Operator(socket, timeout_ms);
  if (!c.ok()) {
    std::fprintf(stderr, "kvtier status: %s\n", c.status().message().c_str());
    return 1;
  }
  auto d = (*c)->GetDaemonStatus();
  if (!d.ok()) {
    std::fprintf(stderr, "kvtier status: %s\n", d.status().message().c_str());
    return 1;
  }
  if (json)
    std::printf("%s\n", StatusJson(*d).dump(2).c_str());
  else
    std::printf("%s", StatusText(*d).c_str());
  return 0;
}

RunFn SetupStatus(CLI::App* app) {
  auto socket = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  auto timeout = std::make_shared<uint32_t>(2000);
  app->add_option("--socket", *socket, "the daemon's socket");
  app->add_flag("--json", *json, "JSON on stdout");
  app->add_option("--timeout-ms", *timeout, "deadline (default 2000)");
  return [=] { return RunStatus(*socket, *json, *timeout); };
}

RunFn SetupFlush(CLI::App* app) {
  auto socket = std::make_shared<std::string>();
  app->add_option("--socket", *socket, "the daemon's socket");
  return [=] {
    auto c = Operator(*socket, 10000);
    if (!c.ok()) {
      std::fprintf(stderr, "kvtier flush: %s\n", c.status().message().c_str());
      return 1;
    }
    auto n = (*c)->DropAll();
    if (!n.ok()) {
      std::fprintf(stderr, "kvtier flush: %s\n", n.status().message().c_str());
      return 1;
    }
    std::printf("flushed %llu blocks\n", (unsigned long long)*n);
    return 0;
  };
}

RunFn SetupDrop(CLI::App* app) {
  auto socket = std::make_shared<std::string>();
  auto tenant = std::make_shared<std::string>();
  app->add_option("--socket", *socket, "the daemon's socket");
  app->add_option("--tenant", *tenant,
                  "the tenant whose blocks to drop (every model and LoRA it declared)")
      ->required();
  return [=] {
    auto c = Operator(*socket, 10000);
    if (!c.ok()) {
      std::fprintf(stderr, "kvtier drop: %s\n", c.status().message().c_str());
      return 1;
    }
    auto r = (*c)->DropTenant(*tenant);
    if (!r.ok()) {
      std::fprintf(stderr, "kvtier drop: %s\n", r.status().message().c_str());
      return 1;
    }
    std::printf("dropped %llu blocks of tenant '%s'", (unsigned long long)r->dropped_blocks,
                tenant->c_str());
    if (r->pinned_blocks)
      std::printf("; %llu pinned by a lease stay in the arena (run again)",
                  (unsigned long long)r->pinned_blocks);
    std::printf("\n");
    return 0;
  };
}

}  // namespace

KVTIER_REGISTER_COMMAND(serve, ({"serve"}), "Run the node daemon: one KV cache for every engine",
                        SetupServe);
KVTIER_REGISTER_COMMAND(status, ({"status"}), "The daemon's tiers, occupancy, clients, hit rates",
                        SetupStatus);
KVTIER_REGISTER_COMMAND(flush, ({"flush"}),
                        "Drop every unpinned block of the daemon's memory tiers", SetupFlush);
KVTIER_REGISTER_COMMAND(drop, ({"drop"}),
                        "Drop every block of one tenant from all of the daemon's tiers", SetupDrop);

}  // namespace kvtier::cli
