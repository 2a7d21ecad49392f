// RemoteTierOptions: the remote tier's settings, their checks, and their parsing from a
// config's params.
#include <charconv>
#include <map>
#include <string>

#include "tiers/remote/remote_tier_internal.h"

namespace kvtier::remote {
namespace {

Result<int64_t> ParamInt(const std::map<std::string, std::string>& params, const std::string& key,
                         int64_t fallback, int64_t min, int64_t max) {
  auto it = params.find(key);
  if (it == params.end()) return fallback;
  const std::string& text = it->second;
  int64_t v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || p != text.data() + text.size() || text.empty() || v < min || v > max) {
    return Status::InvalidArgument("params." + key + ": '" + text + "' is not an integer in [" +
                                   std::to_string(min) + ", " + std::to_string(max) + "]");
  }
  return v;
}

}  // namespace

Status RemoteTierOptions::Validate() const {
  KVTIER_RETURN_IF_ERROR(layout.Validate().WithContext("layout"));
  if (capacity_bytes == 0) return Status::InvalidArgument("capacity_bytes: must be > 0");
  if (capacity_bytes < layout.bytes_per_block()) {
    return Status::InvalidArgument("capacity_bytes: smaller than one block");
  }
  Result<RedisUrl> parsed = ParseRedisUrl(url);
  if (!parsed.ok()) return parsed.status();
  if (mode != "auto" && mode != "single" && mode != "cluster") {
    return Status::InvalidArgument("mode: '" + mode + "' is not auto, single or cluster");
  }
  if (mode == "cluster" && parsed->db != 0) {
    return Status::InvalidArgument("url: a cluster has only database 0");
  }
  if (ttl_s < 0) return Status::InvalidArgument("ttl_s: must be >= 0");
  if (connect_timeout_ms < 1) return Status::InvalidArgument("connect_timeout_ms: must be >= 1");
  if (timeout_ms < 1) return Status::InvalidArgument("timeout_ms: must be >= 1");
  if (max_redirects < 1) return Status::InvalidArgument("max_redirects: must be >= 1");
  if (connections_per_node < 1 || connections_per_node > 64) {
    return Status::InvalidArgument("connections_per_node: must be in [1, 64]");
  }
  if (set_window < 0) return Status::InvalidArgument("set_window: must be >= 0");
  if (get_window < 0) return Status::InvalidArgument("get_window: must be >= 0");
  if (max_idle_connections < 0) {
    return Status::InvalidArgument("max_idle_connections: must be >= 0");
  }
  if (key_prefix.find_first_of("{}") != std::string::npos) {
    // A hash tag in the prefix would put every block in one slot.
    return Status::InvalidArgument("key_prefix: must not contain '{' or '}'");
  }
  return breaker.Validate();
}

Result<RemoteTierOptions> RemoteTierOptionsFromParams(
    std::string name, const KvLayout& layout, uint64_t capacity_bytes,
    const std::map<std::string, std::string>& params) {
  static const char* const kKnown[] = {"url",
                                       "user",
                                       "password",
                                       "mode",
                                       "key_prefix",
                                       "ttl_s",
                                       "connect_timeout_ms",
                                       "timeout_ms",
                                       "max_redirects",
                                       "max_idle_connections",
                                       "breaker_failures",
                                       "breaker_backoff_ms",
                                       "breaker_max_backoff_ms",
                                       "lazy_connect",
                                       "connections_per_node",
                                       "set_window",
                                       "get_window"};
  for (const auto& [key, value] : params) {
    if (std::find(std::begin(kKnown), std::end(kKnown), key) == std::end(kKnown)) {
      std::string known;
      for (const char* k : kKnown) known += std::string(known.empty() ? "" : ", ") + k;
      return Status::InvalidArgument("params." + key +
                                     ": unknown for a remote tier (known: " + known + ")");
    }
  }
  RemoteTierOptions o;
  o.name = std::move(name);
  o.layout = layout;
  o.capacity_bytes = capacity_bytes;
  auto get = [&](const char* key, std::string* out) {
    if (auto it = params.find(key); it != params.end()) *out = it->second;
  };
  get("url", &o.url);
  if (o.url.empty()) return Status::InvalidArgument("params.url: required (redis://host:port)");
  if (Result<RedisUrl> u = ParseRedisUrl(o.url); !u.ok()) {
    return u.status().WithContext("params");
  }
  get("user", &o.user);
  get("password", &o.password);
  get("mode", &o.mode);
  get("key_prefix", &o.key_prefix);
  constexpr int64_t kIntMax = std::numeric_limits<int>::max();
  KVTIER_ASSIGN_OR_RETURN(o.ttl_s, ParamInt(params, "ttl_s", 0, 0, int64_t{1} << 40));
  KVTIER_ASSIGN_OR_RETURN(int64_t ct, ParamInt(params, "connect_timeout_ms", 500, 1, kIntMax));
  KVTIER_ASSIGN_OR_RETURN(int64_t t, ParamInt(params, "timeout_ms", 1000, 1, kIntMax));
  KVTIER_ASSIGN_OR_RETURN(int64_t r, ParamInt(params, "max_redirects", 5, 1, 100));
  KVTIER_ASSIGN_OR_RETURN(int64_t idle, ParamInt(params, "max_idle_connections", 8, 0, 1024));
  KVTIER_ASSIGN_OR_RETURN(int64_t bf, ParamInt(params, "breaker_failures", 3, 1, 1000));
  KVTIER_ASSIGN_OR_RETURN(int64_t bb, ParamInt(params, "breaker_backoff_ms", 100, 1, kIntMax));
  KVTIER_ASSIGN_OR_RETURN(int64_t bm, ParamInt(params, "breaker_max_backoff_ms", 5000, 1, kIntMax));
  KVTIER_ASSIGN_OR_RETURN(int64_t cpn, ParamInt(params, "connections_per_node", 2, 1, 64));
  KVTIER_ASSIGN_OR_RETURN(int64_t sw, ParamInt(params, "set_window", 1, 0, 1 << 20));
  KVTIER_ASSIGN_OR_RETURN(int64_t gw, ParamInt(params, "get_window", 1, 0, 1 << 20));
  o.connections_per_node = static_cast<int>(cpn);
  o.set_window = static_cast<int>(sw);
  o.get_window = static_cast<int>(gw);
  o.connect_timeout_ms = static_cast<int>(ct);
  o.timeout_ms = static_cast<int>(t);
  o.max_redirects = static_cast<int>(r);
  o.max_idle_connections = static_cast<int>(idle);
  o.breaker.failure_threshold = static_cast<int>(bf);
  o.breaker.initial_backoff_ns = bb * kMs;
  o.breaker.max_backoff_ns = bm * kMs;
  if (auto it = params.find("lazy_connect"); it != params.end()) {
    if (it->second == "true" || it->second == "1") {
      o.lazy_connect = true;
    } else if (it->second == "false" || it->second == "0") {
      o.lazy_connect = false;
    } else {
      return Status::InvalidArgument("params.lazy_connect: '" + it->second +
                                     "' is not true or false");
    }
  }
  if (Status s = o.Validate(); !s.ok()) return s.WithContext("params");
  return o;
}

}  // namespace kvtier::remote
