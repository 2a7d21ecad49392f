#include "tiers/remote/redis_url.h"

#include <charconv>

namespace kvtier::remote {
namespace {

Status Bad(std::string_view what) { return Status::InvalidArgument("url: " + std::string(what)); }

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

Result<std::string> PercentDecode(std::string_view s, std::string_view field) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out += s[i];
      continue;
    }
    int hi = i + 1 < s.size() ? HexValue(s[i + 1]) : -1;
    int lo = i + 2 < s.size() ? HexValue(s[i + 2]) : -1;
    if (hi < 0 || lo < 0)
      return Bad(std::string(field) + ": '%' must be followed by two hex digits");
    out += static_cast<char>(hi * 16 + lo);
    i += 2;
  }
  return out;
}

Result<NodeAddress> ParseHost(std::string_view item) {
  if (item.empty()) return Bad("empty host");
  NodeAddress addr;
  std::string_view port_text;
  if (item.front() == '[') {
    size_t close = item.find(']');
    if (close == std::string_view::npos) return Bad("'" + std::string(item) + "': missing ']'");
    addr.host = std::string(item.substr(1, close - 1));
    std::string_view rest = item.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') return Bad("'" + std::string(item) + "': junk after ']'");
      port_text = rest.substr(1);
    }
  } else {
    size_t colon = item.find(':');
    addr.host = std::string(item.substr(0, colon));
    if (colon != std::string_view::npos) port_text = item.substr(colon + 1);
    if (colon != std::string_view::npos && port_text.empty()) {
      return Bad("'" + std::string(item) + "': empty port");
    }
  }
  if (addr.host.empty()) return Bad("'" + std::string(item) + "': empty host");
  addr.port = 6379;
  if (!port_text.empty()) {
    int port = 0;
    auto [end, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
    if (ec != std::errc() || end != port_text.data() + port_text.size() || port < 1 ||
        port > 65535) {
      return Bad("port '" + std::string(port_text) + "' is not a number in 1..65535");
    }
    addr.port = port;
  }
  return addr;
}

}  // namespace

Result<RedisUrl> ParseRedisUrl(std::string_view url) {
  if (url.starts_with("rediss://")) {
    return Bad("rediss:// (TLS) is not supported: Debian's hiredis 0.14 has no TLS");
  }
  if (!url.starts_with("redis://")) {
    return Bad("'" + std::string(url) + "' does not start with redis://");
  }
  url.remove_prefix(8);
  // "redis://a:1,redis://b:2" lists seeds as whole URLs: drop the inner schemes.
  std::string flat;
  for (size_t at = 0; at <= url.size();) {
    size_t next = url.find(",redis://", at);
    flat += url.substr(at, next == std::string_view::npos ? std::string_view::npos : next - at);
    if (next == std::string_view::npos) break;
    flat += ',';
    at = next + 9;
  }
  url = flat;
  RedisUrl out;
  // Credentials end at the last '@' before the host list.
  if (size_t at = url.rfind('@'); at != std::string_view::npos) {
    std::string_view cred = url.substr(0, at);
    url.remove_prefix(at + 1);
    size_t colon = cred.find(':');
    KVTIER_ASSIGN_OR_RETURN(out.user, PercentDecode(cred.substr(0, colon), "user"));
    if (colon != std::string_view::npos) {
      KVTIER_ASSIGN_OR_RETURN(out.password, PercentDecode(cred.substr(colon + 1), "password"));
    }
    if (out.user.empty() && out.password.empty()) return Bad("empty credentials before '@'");
  }
  if (size_t slash = url.find('/'); slash != std::string_view::npos) {
    std::string_view db_text = url.substr(slash + 1);
    url = url.substr(0, slash);
    if (!db_text.empty()) {
      auto [end, ec] = std::from_chars(db_text.data(), db_text.data() + db_text.size(), out.db);
      if (ec != std::errc() || end != db_text.data() + db_text.size() || out.db < 0) {
        return Bad("database '" + std::string(db_text) + "' is not a number >= 0");
      }
    }
  }
  if (url.empty()) return Bad("no host");
  while (true) {
    size_t comma = url.find(',');
    KVTIER_ASSIGN_OR_RETURN(NodeAddress addr, ParseHost(url.substr(0, comma)));
    out.seeds.push_back(std::move(addr));
    if (comma == std::string_view::npos) break;
    url.remove_prefix(comma + 1);
  }
  return out;
}

std::string RedisUrl::Redacted() const {
  std::string s = "redis://";
  if (!user.empty() || !password.empty()) {
    s += user;
    if (!password.empty()) s += ":***";
    s += "@";
  }
  for (size_t i = 0; i < seeds.size(); ++i) {
    if (i) s += ",";
    const NodeAddress& a = seeds[i];
    s += a.host.find(':') != std::string::npos ? "[" + a.host + "]" : a.host;
    s += ":" + std::to_string(a.port);
  }
  if (db != 0) s += "/" + std::to_string(db);
  return s;
}

}  // namespace kvtier::remote
