#include "config/tier_params.h"

#include <charconv>
#include <cstdint>
#include <limits>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

#include "kvtier/layout.h"
#include "tiers/remote/redis_url.h"

namespace kvtier {
namespace {

constexpr int64_t kIntMax = std::numeric_limits<int>::max();
constexpr int64_t kU32Max = std::numeric_limits<uint32_t>::max();

// A key's failure: which key and why ("" when no single key is at fault).
struct ParamError {
  std::string key;
  std::string why;
};

// One row of a kind's table. The member's type gives the value type: bool, optional<bool>,
// an integer in [min, max], uint64_t is a size, std::string is free text or, with choices, one
// of them (an alias maps to its canonical name).
// The member types each struct has (only these are instantiated: g++ 12 warns about the
// branches of a member type the struct lacks).
template <class T>
struct Members;
template <>
struct Members<HostTierParams> {
  using T = HostTierParams;
  using Type = std::variant<bool T::*, std::optional<bool> T::*, uint64_t T::*>;
};
template <>
struct Members<DiskTierParams> {
  using T = DiskTierParams;
  using Type = std::variant<bool T::*, uint32_t T::*, uint64_t T::*, std::string T::*>;
};
template <>
struct Members<RemoteTierParams> {
  using T = RemoteTierParams;
  using Type = std::variant<bool T::*, int T::*, int64_t T::*, std::string T::*>;
};

template <class T>
struct Field {
  using Member = typename Members<T>::Type;
  const char* key;
  Member member;
  int64_t min = 0;
  int64_t max = 0;
  std::vector<std::pair<std::string_view, std::string_view>> choices;  // alias, canonical
};

std::string ChoiceList(const std::vector<std::pair<std::string_view, std::string_view>>& c) {
  std::string out;
  for (size_t i = 0; i < c.size(); ++i) {
    if (i > 0) out += i + 1 == c.size() ? " or " : ", ";
    out += c[i].first;
  }
  return out;
}

// Text -> member; "" or why it is not a value of the field's type.
template <class T>
std::string Parse(const Field<T>& f, const std::string& v, T* out) {
  return std::visit(
      [&](auto member) -> std::string {
        using V = std::remove_reference_t<decltype(out->*member)>;
        if constexpr (std::is_same_v<V, bool> || std::is_same_v<V, std::optional<bool>>) {
          auto b = ParseBoolWord(v);
          if (!b) return "'" + v + "' is not true or false";
          out->*member = *b;
        } else if constexpr (std::is_same_v<V, uint64_t>) {
          Result<uint64_t> r = ParseByteSize(v);
          if (!r.ok()) return "'" + v + "' is not a byte size";
          out->*member = *r;
        } else if constexpr (std::is_integral_v<V>) {
          int64_t x = 0;
          auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
          if (v.empty() || ec != std::errc() || p != v.data() + v.size() || x < f.min ||
              x > f.max) {
            return "'" + v + "' is not an integer in [" + std::to_string(f.min) + ", " +
                   std::to_string(f.max) + "]";
          }
          out->*member = static_cast<V>(x);
        } else {
          if (f.choices.empty()) {
            out->*member = v;
            return "";
          }
          for (const auto& [alias, canonical] : f.choices) {
            if (v == alias) {
              out->*member = std::string(canonical);
              return "";
            }
          }
          return "'" + v + "' is not " + ChoiceList(f.choices);
        }
        return "";
      },
      f.member);
}

// A typed value's range; "" or why not.
template <class T>
std::string Check(const Field<T>& f, const T& t) {
  return std::visit(
      [&](auto member) -> std::string {
        using V = std::remove_cvref_t<decltype(t.*member)>;
        const V& v = t.*member;
        if constexpr (std::is_integral_v<V> && !std::is_same_v<V, bool> &&
                      !std::is_same_v<V, uint64_t>) {
          if (static_cast<int64_t>(v) < f.min || static_cast<int64_t>(v) > f.max) {
            return "must be in [" + std::to_string(f.min) + ", " + std::to_string(f.max) +
                   "], got " + std::to_string(v);
          }
        } else if constexpr (std::is_same_v<V, std::string>) {
          if (f.choices.empty()) return "";
          for (const auto& c : f.choices)
            if (v == c.first) return "";
          return "'" + v + "' is not " + ChoiceList(f.choices);
        }
        return "";
      },
      f.member);
}

const std::vector<Field<HostTierParams>>& HostTable() {
  static const std::vector<Field<HostTierParams>> t = {
      {"prefault", &HostTierParams::prefault},
      {"huge_pages", &HostTierParams::huge_pages},
      {"pin", &HostTierParams::pin},
      {"prefault_background", &HostTierParams::prefault_background},
      {"warm_ahead", &HostTierParams::warm_ahead},
  };
  return t;
}

const std::vector<Field<DiskTierParams>>& DiskTable() {
  using D = DiskTierParams;
  static const std::vector<Field<D>> t = {
      {"path", &D::path},
      {"segment_bytes", &D::segment_bytes},
      {"buffer_bytes", &D::buffer_bytes},
      {"queue_depth", &D::queue_depth, 1, 4096},
      {"sync", &D::sync, 0, 0, {{"none", "none"}, {"batch", "batch"}, {"interval", "interval"}}},
      {"sync_interval_ms", &D::sync_interval_ms, 0, kU32Max},
      {"io",
       &D::io,
       0,
       0,
       {{"auto", "auto"},
        {"uring", "uring"},
        {"io_uring", "uring"},
        {"sync", "sync"},
        {"pread", "sync"}}},
      {"register_buffers", &D::register_buffers},
      {"direct_io", &D::direct_io},
      {"reinsert_hot", &D::reinsert_hot},
  };
  return t;
}

const std::vector<Field<RemoteTierParams>>& RemoteTable() {
  using R = RemoteTierParams;
  static const std::vector<Field<R>> t = {
      {"url", &R::url},
      {"user", &R::user},
      {"password", &R::password},
      {"mode", &R::mode, 0, 0, {{"auto", "auto"}, {"single", "single"}, {"cluster", "cluster"}}},
      {"key_prefix", &R::key_prefix},
      {"ttl_s", &R::ttl_s, 0, int64_t{1} << 40},
      {"connect_timeout_ms", &R::connect_timeout_ms, 1, kIntMax},
      {"timeout_ms", &R::timeout_ms, 1, kIntMax},
      {"max_redirects", &R::max_redirects, 1, 100},
      {"max_idle_connections", &R::max_idle_connections, 0, 1024},
      {"breaker_failures", &R::breaker_failures, 1, 1000},
      {"breaker_backoff_ms", &R::breaker_backoff_ms, 1, kIntMax},
      {"breaker_max_backoff_ms", &R::breaker_max_backoff_ms, 1, kIntMax},
      {"lazy_connect", &R::lazy_connect},
      {"connections_per_node", &R::connections_per_node, 1, 64},
      {"set_window", &R::set_window, 0, 1 << 20},
      {"get_window", &R::get_window, 0, 1 << 20},
  };
  return t;
}

// Checks between keys, beyond each key's own range.
std::optional<ParamError> CrossCheck(const HostTierParams&) { return std::nullopt; }

std::optional<ParamError> CrossCheck(const DiskTierParams& d) {
  if (d.path.empty()) return ParamError{"path", "the disk tier needs a directory"};
  if (d.sync == "interval" && d.sync_interval_ms == 0)
    return ParamError{"sync_interval_ms", "must be > 0 with sync=interval"};
  return std::nullopt;
}

std::optional<ParamError> CrossCheck(const RemoteTierParams& r) {
  if (r.url.empty()) return ParamError{"url", "required (redis://host:port)"};
  if (Result<remote::RedisUrl> u = remote::ParseRedisUrl(r.url); !u.ok())
    return ParamError{"url", std::string(u.status().message())};
  if (r.key_prefix.find_first_of("{}") != std::string::npos) {
    // A hash tag in the prefix would put every block in one slot.
    return ParamError{"key_prefix", "must not contain '{' or '}'"};
  }
  return std::nullopt;
}

template <class T>
std::optional<ParamError> CheckAll(const std::vector<Field<T>>& table, const T& t) {
  for (const Field<T>& f : table) {
    std::string why = Check(f, t);
    if (!why.empty()) return ParamError{f.key, why};
  }
  return CrossCheck(t);
}

Status Fail(const ParamError& e, std::string* bad_key) {
  if (bad_key != nullptr) *bad_key = e.key;
  return Status::InvalidArgument("params." + e.key + ": " + e.why);
}

template <class T>
Result<T> Read(const std::vector<Field<T>>& table, std::string_view kind, const ParamMap& params,
               std::string* bad_key) {
  T t;
  for (const auto& [key, value] : params) {
    const Field<T>* field = nullptr;
    for (const Field<T>& f : table)
      if (key == f.key) field = &f;
    if (field == nullptr) {
      std::string known;
      for (const Field<T>& f : table) known += std::string(known.empty() ? "" : ", ") + f.key;
      return Fail({key, "unknown " + std::string(kind) + " tier param (known: " + known + ")"},
                  bad_key);
    }
    std::string why = Parse(*field, value, &t);
    if (!why.empty()) return Fail({key, why}, bad_key);
  }
  if (auto e = CheckAll(table, t)) return Fail(*e, bad_key);
  return t;
}

template <class T>
Status Validated(const std::vector<Field<T>>& table, const T& t) {
  if (auto e = CheckAll(table, t)) return Status::InvalidArgument(e->key + ": " + e->why);
  return Status::Ok();
}

// spec.<kind> or spec.params, never both; no typed params of another kind.
template <class T>
Result<T> ParamsOf(const TierSpec& spec, const std::optional<T>& typed,
                   const std::vector<Field<T>>& table, std::string_view kind,
                   std::string* bad_key) {
  const int typed_count = spec.host.has_value() + spec.disk.has_value() + spec.remote.has_value();
  if (typed_count > (typed ? 1 : 0)) {
    return Status::InvalidArgument("typed params of another kind than '" + spec.kind + "'");
  }
  if (!typed) return Read(table, kind, spec.params, bad_key);
  if (!spec.params.empty()) {
    return Status::InvalidArgument("params: give the typed " + std::string(kind) +
                                   " params or the params map, not both");
  }
  if (auto e = CheckAll(table, *typed)) return Fail(*e, bad_key);
  return *typed;
}

template <class T>
std::vector<std::string> Keys(const std::vector<Field<T>>& table) {
  std::vector<std::string> out;
  for (const Field<T>& f : table) out.emplace_back(f.key);
  return out;
}

}  // namespace

std::optional<bool> ParseBoolWord(std::string_view v) {
  if (v == "true" || v == "yes" || v == "on" || v == "1") return true;
  if (v == "false" || v == "no" || v == "off" || v == "0") return false;
  return std::nullopt;
}

Status HostTierParams::Validate() const { return Validated(HostTable(), *this); }
Status DiskTierParams::Validate() const { return Validated(DiskTable(), *this); }
Status RemoteTierParams::Validate() const { return Validated(RemoteTable(), *this); }

std::vector<std::string> TierParamKeys(std::string_view kind) {
  if (IsHostArenaKind(kind)) return Keys(HostTable());
  if (kind == "disk") return Keys(DiskTable());
  if (kind == "remote") return Keys(RemoteTable());
  return {};
}

Result<HostTierParams> ReadHostTierParams(const ParamMap& params, std::string* bad_key) {
  return Read(HostTable(), "host", params, bad_key);
}
Result<DiskTierParams> ReadDiskTierParams(const ParamMap& params, std::string* bad_key) {
  return Read(DiskTable(), "disk", params, bad_key);
}
Result<RemoteTierParams> ReadRemoteTierParams(const ParamMap& params, std::string* bad_key) {
  return Read(RemoteTable(), "remote", params, bad_key);
}

Result<HostTierParams> HostParamsOf(const TierSpec& spec, std::string* bad_key) {
  return ParamsOf(spec, spec.host, HostTable(), IsHostArenaKind(spec.kind) ? spec.kind : "host",
                  bad_key);
}
Result<DiskTierParams> DiskParamsOf(const TierSpec& spec, std::string* bad_key) {
  return ParamsOf(spec, spec.disk, DiskTable(), "disk", bad_key);
}
Result<RemoteTierParams> RemoteParamsOf(const TierSpec& spec, std::string* bad_key) {
  return ParamsOf(spec, spec.remote, RemoteTable(), "remote", bad_key);
}

Status CheckTierSpecParams(const TierSpec& spec, std::string* bad_key) {
  if (spec.instance) return Status::Ok();  // a pre-built tier: kind and params are ignored
  if (IsHostArenaKind(spec.kind)) return HostParamsOf(spec, bad_key).status();
  if (spec.kind == "disk") return DiskParamsOf(spec, bad_key).status();
  if (spec.kind == "remote") return RemoteParamsOf(spec, bad_key).status();
  if (spec.host || spec.disk || spec.remote) {
    return Status::InvalidArgument("typed params of another kind than '" + spec.kind + "'");
  }
  return Status::Ok();
}

}  // namespace kvtier
