// RemoteTierOptions: the remote tier's settings, their checks, and their parsing from a
// config's params (read by config/tier_params.h).
#include <map>
#include <string>

#include "config/tier_params.h"
#include "tiers/remote/remote_tier_internal.h"

namespace kvtier::remote {

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

Result<RemoteTierOptions> RemoteTierOptionsFrom(std::string name, const KvLayout& layout,
                                                uint64_t capacity_bytes,
                                                const RemoteTierParams& p) {
  RemoteTierOptions o;
  o.name = std::move(name);
  o.layout = layout;
  o.capacity_bytes = capacity_bytes;
  o.url = p.url;
  o.user = p.user;
  o.password = p.password;
  o.mode = p.mode;
  o.key_prefix = p.key_prefix;
  o.ttl_s = p.ttl_s;
  o.connect_timeout_ms = p.connect_timeout_ms;
  o.timeout_ms = p.timeout_ms;
  o.max_redirects = p.max_redirects;
  o.max_idle_connections = p.max_idle_connections;
  o.connections_per_node = p.connections_per_node;
  o.set_window = p.set_window;
  o.get_window = p.get_window;
  o.breaker.failure_threshold = p.breaker_failures;
  o.breaker.initial_backoff_ns = int64_t{p.breaker_backoff_ms} * kMs;
  o.breaker.max_backoff_ns = int64_t{p.breaker_max_backoff_ms} * kMs;
  o.lazy_connect = p.lazy_connect;
  if (Status s = o.Validate(); !s.ok()) {
    // "KEY: why" of a param key reads "params.KEY: why", as the reader's errors do.
    const std::string& m = s.message();
    for (const std::string& key : TierParamKeys("remote")) {
      if (m.starts_with(key + ": ")) return Status::InvalidArgument("params." + m);
    }
    return s.WithContext("params");
  }
  return o;
}

Result<RemoteTierOptions> RemoteTierOptionsFromParams(
    std::string name, const KvLayout& layout, uint64_t capacity_bytes,
    const std::map<std::string, std::string>& params) {
  KVTIER_ASSIGN_OR_RETURN(RemoteTierParams p, ReadRemoteTierParams(params));
  return RemoteTierOptionsFrom(std::move(name), layout, capacity_bytes, p);
}

}  // namespace kvtier::remote
