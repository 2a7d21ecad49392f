// The `serve:` section of the daemon's YAML config, read apart from the cache's keys.
#include <grp.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "config/tier_params.h"
#include "kvtier/config.h"
#include "serve/serve_options.h"

namespace kvtier::serve {
namespace {

Status Error(std::string_view source, const YAML::Node& n, const std::string& path,
             const std::string& what) {
  std::string where(source);
  if (n.IsDefined() && n.Mark().line >= 0) where += ":" + std::to_string(n.Mark().line + 1);
  return Status::InvalidArgument(where + ": " + path + ": " + what);
}

Result<uint64_t> Uint(std::string_view src, const YAML::Node& n, const std::string& path) {
  if (!n.IsScalar()) return Error(src, n, path, "want a non-negative integer");
  const std::string s = n.as<std::string>();
  size_t used = 0;
  uint64_t v = 0;
  try {
    if (!s.empty() && s[0] != '-') v = std::stoull(s, &used, 0);
  } catch (...) {
    used = 0;
  }
  if (used == 0 || used != s.size())
    return Error(src, n, path, "want a non-negative integer, got '" + s + "'");
  return v;
}

Result<std::string> Str(std::string_view src, const YAML::Node& n, const std::string& path) {
  if (!n.IsScalar()) return Error(src, n, path, "want a scalar");
  return n.as<std::string>();
}

Status CheckKeys(std::string_view src, const YAML::Node& n, const std::string& path,
                 std::initializer_list<const char*> known) {
  if (!n.IsMap()) return Error(src, n, path, "want a mapping");
  for (const auto& kv : n) {
    const std::string key = kv.first.as<std::string>();
    bool ok = false;
    std::string list;
    for (const char* k : known) {
      ok |= key == k;
      list += std::string(list.empty() ? "" : ", ") + k;
    }
    if (!ok) return Error(src, kv.first, path + "." + key, "unknown key (known: " + list + ")");
  }
  return Status::Ok();
}

// serve.<key>, when present, into *out: an integer in lo..hi.
Status UintIn(std::string_view src, const YAML::Node& n, const char* key, uint64_t lo, uint64_t hi,
              uint32_t* out) {
  if (!n[key]) return Status::Ok();
  const std::string path = std::string("serve.") + key;
  KVTIER_ASSIGN_OR_RETURN(uint64_t v, Uint(src, n[key], path));
  if (v < lo || v > hi)
    return Error(src, n[key], path, "must be in " + std::to_string(lo) + ".." + std::to_string(hi));
  *out = static_cast<uint32_t>(v);
  return Status::Ok();
}

// <path>, when present, into *out: a fraction in 0..1.
Status Share(std::string_view src, const YAML::Node& n, const std::string& path, double* out) {
  if (!n) return Status::Ok();
  KVTIER_ASSIGN_OR_RETURN(std::string s, Str(src, n, path));
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || *end != '\0' || !(v >= 0 && v <= 1))
    return Error(src, n, path, "want a fraction in 0..1, got '" + s + "'");
  *out = v;
  return Status::Ok();
}

Result<std::vector<uint32_t>> Uids(std::string_view src, const YAML::Node& n,
                                   const std::string& path) {
  if (!n.IsSequence()) return Error(src, n, path, "want a list of uids");
  std::vector<uint32_t> out;
  for (size_t i = 0; i < n.size(); ++i) {
    KVTIER_ASSIGN_OR_RETURN(uint64_t v, Uint(src, n[i], path + "[" + std::to_string(i) + "]"));
    out.push_back(static_cast<uint32_t>(v));
  }
  return out;
}

// serve.events_* (all but events_addr).
Status ParseEvents(std::string_view src, const YAML::Node& n, ServeOptions* o) {
  KvEventsOptions& e = o->events;
  const std::pair<const char*, std::string*> strings[] = {
      {"events_topic", &e.topic},
      {"events_keys_topic_suffix", &e.keys_topic_suffix},
      {"events_topic_host", &e.topic_host},
      {"events_topic_port", &e.topic_port},
      {"events_replay_addr", &e.replay_endpoint}};
  for (const auto& [key, out] : strings) {
    if (!n[key]) continue;
    KVTIER_ASSIGN_OR_RETURN(*out, Str(src, n[key], std::string("serve.") + key));
  }
  if (n["events_socket"]) {
    KVTIER_ASSIGN_OR_RETURN(std::string s, Str(src, n["events_socket"], "serve.events_socket"));
    if (s == "auto") {
      e.socket = KvEventsOptions::Socket::kAuto;
    } else if (s == "bind") {
      e.socket = KvEventsOptions::Socket::kBind;
    } else if (s == "connect") {
      e.socket = KvEventsOptions::Socket::kConnect;
    } else {
      return Error(src, n["events_socket"], "serve.events_socket", "want auto, bind or connect");
    }
  }
  KVTIER_RETURN_IF_ERROR(UintIn(src, n, "events_replay_batches", 1, 10000000, &e.replay_batches));
  KVTIER_RETURN_IF_ERROR(UintIn(src, n, "events_batch_events", 1, 1000000, &e.max_batch_events));
  KVTIER_RETURN_IF_ERROR(UintIn(src, n, "events_batch_ms", 0, 60000, &e.batch_interval_ms));
  KVTIER_RETURN_IF_ERROR(UintIn(src, n, "events_queue_events", 1, 100000000, &e.queue_events));
  KVTIER_RETURN_IF_ERROR(UintIn(src, n, "events_dp_rank", 0, 65535, &e.data_parallel_rank));
  if (n["events_engine_hash_blocks"]) {
    KVTIER_ASSIGN_OR_RETURN(e.engine_hash_blocks, Uint(src, n["events_engine_hash_blocks"],
                                                       "serve.events_engine_hash_blocks"));
  }
  if (n["events_int_hashes"]) {
    const YAML::Node& v = n["events_int_hashes"];
    KVTIER_ASSIGN_OR_RETURN(std::string word, Str(src, v, "serve.events_int_hashes"));
    std::optional<bool> b = ParseBoolWord(word);
    if (!b) return Error(src, v, "serve.events_int_hashes", "want true or false");
    e.int_hashes = *b;
  }
  if (n["events_media"]) {
    const YAML::Node& m = n["events_media"];
    if (!m.IsMap()) return Error(src, m, "serve.events_media", "want a map of tier -> medium");
    for (const auto& kv : m) {
      const std::string tier = kv.first.as<std::string>();
      KVTIER_ASSIGN_OR_RETURN(o->events_media[tier],
                              Str(src, kv.second, "serve.events_media." + tier));
    }
  }
  return Status::Ok();
}

// serve.tenants: the bound tenant names.
Result<std::vector<TenantBinding>> Tenants(std::string_view src, const YAML::Node& t) {
  if (!t.IsSequence()) return Error(src, t, "serve.tenants", "want a list");
  std::vector<TenantBinding> out;
  for (size_t i = 0; i < t.size(); ++i) {
    const std::string path = "serve.tenants[" + std::to_string(i) + "]";
    KVTIER_RETURN_IF_ERROR(
        CheckKeys(src, t[i], path, {"name", "uids", "token", "max_share", "reserved_share"}));
    TenantBinding b;
    if (!t[i]["name"]) return Error(src, t[i], path + ".name", "missing");
    KVTIER_ASSIGN_OR_RETURN(b.name, Str(src, t[i]["name"], path + ".name"));
    if (t[i]["uids"]) {
      KVTIER_ASSIGN_OR_RETURN(b.uids, Uids(src, t[i]["uids"], path + ".uids"));
    }
    if (t[i]["token"]) {
      KVTIER_ASSIGN_OR_RETURN(b.token, Str(src, t[i]["token"], path + ".token"));
    }
    KVTIER_RETURN_IF_ERROR(Share(src, t[i]["max_share"], path + ".max_share", &b.max_share));
    KVTIER_RETURN_IF_ERROR(
        Share(src, t[i]["reserved_share"], path + ".reserved_share", &b.reserved_share));
    if (b.uids.empty() && b.token.empty())
      return Error(src, t[i], path, "bind the tenant to uids, a token or both");
    out.push_back(std::move(b));
  }
  return out;
}

Result<ServeOptions> ParseServe(std::string_view src, const YAML::Node& n) {
  ServeOptions o;
  KVTIER_RETURN_IF_ERROR(CheckKeys(src, n, "serve",
                                   {"socket",
                                    "group",
                                    "socket_mode",
                                    "allow_uids",
                                    "lease_ms",
                                    "metrics_addr",
                                    "events_addr",
                                    "events_socket",
                                    "events_topic",
                                    "events_keys_topic_suffix",
                                    "events_topic_host",
                                    "events_topic_port",
                                    "events_replay_addr",
                                    "events_replay_batches",
                                    "events_batch_events",
                                    "events_batch_ms",
                                    "events_queue_events",
                                    "events_dp_rank",
                                    "events_media",
                                    "events_int_hashes",
                                    "events_engine_hash_blocks",
                                    "tenants",
                                    "verify_commit",
                                    "max_clients",
                                    "max_pending",
                                    "hello_timeout_ms",
                                    "frame_timeout_ms",
                                    "max_tenants",
                                    "max_tenants_per_uid",
                                    "default_max_share",
                                    "warm_ahead"}));
  if (n["socket"]) {
    KVTIER_ASSIGN_OR_RETURN(o.socket_path, Str(src, n["socket"], "serve.socket"));
  }
  if (n["group"]) {
    KVTIER_ASSIGN_OR_RETURN(o.group, Str(src, n["group"], "serve.group"));
  }
  if (n["socket_mode"]) {
    KVTIER_ASSIGN_OR_RETURN(uint64_t m, Uint(src, n["socket_mode"], "serve.socket_mode"));
    if (m > 0777) return Error(src, n["socket_mode"], "serve.socket_mode", "want 0..0777");
    o.socket_mode = static_cast<uint32_t>(m);
  }
  if (n["allow_uids"]) {
    KVTIER_ASSIGN_OR_RETURN(o.allow_uids, Uids(src, n["allow_uids"], "serve.allow_uids"));
  }
  if (n["lease_ms"]) {
    KVTIER_ASSIGN_OR_RETURN(uint64_t v, Uint(src, n["lease_ms"], "serve.lease_ms"));
    if (v < 10 || v > 3600000)
      return Error(src, n["lease_ms"], "serve.lease_ms", "must be in 10..3600000");
    o.lease_ms = static_cast<uint32_t>(v);
  }
  if (n["metrics_addr"]) {
    KVTIER_ASSIGN_OR_RETURN(o.metrics_addr, Str(src, n["metrics_addr"], "serve.metrics_addr"));
    if (Status st = CheckMetricsAddr(o.metrics_addr); !st.ok())
      return Error(src, n["metrics_addr"], "serve.metrics_addr", st.message());
  }
  if (n["events_addr"]) {
    KVTIER_ASSIGN_OR_RETURN(o.events_addr, Str(src, n["events_addr"], "serve.events_addr"));
    if (Status st = CheckEventsAddr(o.events_addr); !st.ok())
      return Error(src, n["events_addr"], "serve.events_addr", st.message());
  }
  KVTIER_RETURN_IF_ERROR(ParseEvents(src, n, &o));
  if (n["verify_commit"]) {
    KVTIER_ASSIGN_OR_RETURN(std::string v, Str(src, n["verify_commit"], "serve.verify_commit"));
    std::optional<bool> b = ParseBoolWord(v);
    if (!b) return Error(src, n["verify_commit"], "serve.verify_commit", "want true or false");
    o.verify_commit = *b;
  }
  KVTIER_RETURN_IF_ERROR(UintIn(src, n, "max_clients", 1, 65536, &o.max_clients));
  KVTIER_RETURN_IF_ERROR(UintIn(src, n, "max_pending", 1, 65536, &o.max_pending));
  KVTIER_RETURN_IF_ERROR(UintIn(src, n, "hello_timeout_ms", 10, 600000, &o.hello_timeout_ms));
  KVTIER_RETURN_IF_ERROR(UintIn(src, n, "frame_timeout_ms", 10, 600000, &o.frame_timeout_ms));
  KVTIER_RETURN_IF_ERROR(UintIn(src, n, "max_tenants", 1, 4096, &o.max_tenants));
  KVTIER_RETURN_IF_ERROR(UintIn(src, n, "max_tenants_per_uid", 1, 4096, &o.max_tenants_per_uid));
  KVTIER_RETURN_IF_ERROR(
      Share(src, n["default_max_share"], "serve.default_max_share", &o.default_max_share));
  if (n["warm_ahead"]) {
    KVTIER_ASSIGN_OR_RETURN(std::string v, Str(src, n["warm_ahead"], "serve.warm_ahead"));
    auto bytes = ParseByteSize(v);
    if (!bytes.ok())
      return Error(src, n["warm_ahead"], "serve.warm_ahead", bytes.status().message());
    o.warm_ahead_bytes = *bytes;
  }
  if (n["tenants"]) {
    KVTIER_ASSIGN_OR_RETURN(o.tenants, Tenants(src, n["tenants"]));
  }
  Status v = o.Validate();
  if (!v.ok()) return Error(src, n, "serve", v.message());
  return o;
}

// Whether port is a decimal port number (0..65535).
bool IsPort(std::string_view port) {
  if (port.empty() || port.size() > 5) return false;
  uint32_t v = 0;
  for (char ch : port) {
    if (ch < '0' || ch > '9') return false;
    v = v * 10 + static_cast<uint32_t>(ch - '0');
  }
  return v <= 65535;
}

}  // namespace

Status CheckMetricsAddr(std::string_view addr) {
  const size_t colon = addr.rfind(':');
  const std::string_view port = colon == std::string_view::npos ? addr : addr.substr(colon + 1);
  if (!IsPort(port))
    return Status::InvalidArgument("'" + std::string(addr) +
                                   "': want PORT, :PORT or HOST:PORT with PORT in 0..65535");
  return Status::Ok();
}

Status CheckEventsAddr(std::string_view addr) {
  const std::string why = "'" + std::string(addr) +
                          "': want tcp://HOST:PORT (PORT in 0..65535 or *), ipc://PATH or "
                          "inproc://NAME";
  for (std::string_view scheme : {"ipc://", "inproc://"}) {
    if (addr.starts_with(scheme))
      return addr.size() > scheme.size() ? Status::Ok() : Status::InvalidArgument(why);
  }
  if (!addr.starts_with("tcp://")) return Status::InvalidArgument(why);
  const std::string_view rest = addr.substr(6);
  const size_t colon = rest.rfind(':');
  if (colon == std::string_view::npos || colon == 0) return Status::InvalidArgument(why);
  const std::string_view port = rest.substr(colon + 1);
  if (port != "*" && !IsPort(port)) return Status::InvalidArgument(why);
  return Status::Ok();
}

Status ServeOptions::Validate() const {
  if (lease_ms < 10) return Status::InvalidArgument("lease_ms: must be >= 10");
  if (!metrics_addr.empty()) {
    KVTIER_RETURN_IF_ERROR(CheckMetricsAddr(metrics_addr).WithContext("metrics_addr"));
  }
  if (!events_addr.empty()) {
    KVTIER_RETURN_IF_ERROR(CheckEventsAddr(events_addr).WithContext("events_addr"));
  }
  double reserved = 0;
  for (size_t i = 0; i < tenants.size(); ++i) {
    for (size_t j = 0; j < i; ++j)
      if (tenants[i].name == tenants[j].name)
        return Status::InvalidArgument("tenants: '" + tenants[i].name + "' is bound twice");
    if (tenants[i].reserved_share > tenants[i].max_share)
      return Status::InvalidArgument("tenants: '" + tenants[i].name +
                                     "': reserved_share is above max_share");
    reserved += tenants[i].reserved_share;
  }
  if (reserved > 1.0)
    return Status::InvalidArgument("tenants: the reserved_share values add up to more than 1");
  if (tenants.size() > max_tenants)
    return Status::InvalidArgument("tenants: " + std::to_string(tenants.size()) +
                                   " bound, more than max_tenants (" + std::to_string(max_tenants) +
                                   ")");
  return Status::Ok();
}

ServeConfig DefaultServeConfig(std::string* why) {
  ServeConfig c;
  c.cache.layout = *LayoutPreset("llama-3.1-8b");
  const uint64_t pages = static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES));
  const uint64_t mem = pages * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  uint64_t cap = std::clamp<uint64_t>(mem / 4, 64ull << 20, 64ull << 30);
  cap = std::max<uint64_t>(cap / c.cache.layout.bytes_per_block(), 1) *
        c.cache.layout.bytes_per_block();
  TierSpec host;
  host.kind = "host";
  host.capacity_bytes = cap;
  host.threads = 2;
  c.cache.tiers.push_back(host);
  if (why)
    *why = "no --config: host tier of " + FormatBytes(cap) + " (a quarter of this machine's " +
           FormatBytes(mem) + ", within 64 MiB..64 GiB), layout llama-3.1-8b";
  return c;
}

namespace {

// The cache's keys and the serve: section, without the daemon's rules on the cache.
Result<ServeConfig> ParseCacheAndServe(std::string_view text, std::string_view source) {
  ServeConfig c;
  KVTIER_ASSIGN_OR_RETURN(c.cache, ParseCacheOptionsYaml(text, source));
  try {
    YAML::Node root = YAML::Load(std::string(text));
    if (root["serve"]) {
      KVTIER_ASSIGN_OR_RETURN(c.serve, ParseServe(source, root["serve"]));
    }
  } catch (const YAML::Exception& e) {
    return Status::InvalidArgument(std::string(source) + ":" + std::to_string(e.mark.line + 1) +
                                   ": " + e.msg);
  }
  return c;
}

}  // namespace

Result<ServeConfig> ParseServeConfigYaml(std::string_view text, std::string_view source) {
  KVTIER_ASSIGN_OR_RETURN(ServeConfig c, ParseCacheAndServe(text, source));
  if (c.cache.tiers.empty() || c.cache.tiers[0].kind != "host")
    return Status::InvalidArgument(std::string(source) +
                                   ": tiers[0].kind: the daemon's first tier must be a host "
                                   "tier (its arena is what clients map)");
  // Without a queue every commit writes the lower tiers itself: a slow SSD or Redis then holds
  // clients past their deadline.
  if (c.cache.write_queue_blocks == 0 && c.cache.tiers.size() > 1)
    return Status::InvalidArgument(std::string(source) +
                                   ": write_queue_blocks: 0 makes every commit wait on the lower "
                                   "tiers; the daemon needs a write queue (> 0)");
  return c;
}

Status ApplyEventOptions(const ServeOptions& serve, CacheOptions* cache) {
  cache->events = serve.events;
  cache->events.endpoint = serve.events_addr;
  cache->events.media.assign(cache->tiers.size(), "");
  for (const auto& [tier, medium] : serve.events_media) {
    bool found = false;
    for (size_t i = 0; i < cache->tiers.size(); ++i) {
      const TierSpec& t = cache->tiers[i];
      if (tier == (t.name.empty() ? t.kind : t.name) || tier == t.kind) {
        cache->events.media[i] = medium;
        found = true;
      }
    }
    if (!found) return Status::InvalidArgument("serve.events_media: '" + tier + "' names no tier");
  }
  return cache->events.Validate().WithContext("serve.events");
}

Result<CacheOptions> CacheOptionsWithEvents(std::string_view text, std::string_view source) {
  KVTIER_ASSIGN_OR_RETURN(ServeConfig c, ParseCacheAndServe(text, source));
  // Only the events: the daemon's other keys and rules do not concern an in-process cache.
  if (!c.serve.events_addr.empty()) KVTIER_RETURN_IF_ERROR(ApplyEventOptions(c.serve, &c.cache));
  return std::move(c.cache);
}

Result<CacheOptions> CacheOptionsWithEventsFile(const std::string& path) {
  KVTIER_ASSIGN_OR_RETURN(std::string text, ReadConfigFile(path));
  return CacheOptionsWithEvents(text, path);
}

Result<ServeConfig> LoadServeConfigFile(const std::string& path) {
  KVTIER_ASSIGN_OR_RETURN(std::string text, ReadConfigFile(path));
  return ParseServeConfigYaml(text, path);
}

}  // namespace kvtier::serve
