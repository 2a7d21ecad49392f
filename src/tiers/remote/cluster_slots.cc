#include "tiers/remote/cluster_slots.h"

#include <hiredis/hiredis.h>

#include <array>
#include <charconv>

namespace kvtier::remote {
namespace {

constexpr std::array<uint16_t, 256> MakeCrcTable() {
  std::array<uint16_t, 256> table{};
  for (int i = 0; i < 256; ++i) {
    uint16_t crc = static_cast<uint16_t>(i << 8);
    for (int b = 0; b < 8; ++b) {
      crc = (crc & 0x8000) ? static_cast<uint16_t>((crc << 1) ^ 0x1021)
                           : static_cast<uint16_t>(crc << 1);
    }
    table[i] = crc;
  }
  return table;
}
constexpr std::array<uint16_t, 256> kCrcTable = MakeCrcTable();

std::optional<int64_t> ParseInt(std::string_view s) {
  int64_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || s.empty()) return std::nullopt;
  return v;
}

Status Malformed(size_t i, std::string_view what) {
  return Status::Corruption("CLUSTER SLOTS reply: element " + std::to_string(i) + ": " +
                            std::string(what));
}

}  // namespace

uint16_t Crc16(std::string_view bytes) {
  uint16_t crc = 0;
  for (unsigned char c : bytes) {
    crc = static_cast<uint16_t>((crc << 8) ^ kCrcTable[((crc >> 8) ^ c) & 0xff]);
  }
  return crc;
}

int KeyHashSlot(std::string_view key) {
  size_t open = key.find('{');
  if (open != std::string_view::npos) {
    size_t close = key.find('}', open + 1);
    if (close != std::string_view::npos && close > open + 1) {
      key = key.substr(open + 1, close - open - 1);
    }
  }
  return Crc16(key) & (kClusterSlots - 1);
}

std::optional<NodeAddress> ParseHostPort(std::string_view text) {
  size_t colon = text.rfind(':');
  if (colon == std::string_view::npos) return std::nullopt;
  std::string_view host = text.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  // Redis 7 may append "@busport" to an address.
  std::string_view port_text = text.substr(colon + 1);
  if (size_t at = port_text.find('@'); at != std::string_view::npos) {
    port_text = port_text.substr(0, at);
  }
  std::optional<int64_t> port = ParseInt(port_text);
  if (!port || *port < 1 || *port > 65535) return std::nullopt;
  return NodeAddress{std::string(host), static_cast<int>(*port)};
}

Result<std::vector<SlotRange>> ParseClusterSlots(const redisReply* reply,
                                                 std::string_view default_host) {
  if (reply == nullptr) return Status::Corruption("CLUSTER SLOTS reply: missing");
  if (reply->type == REDIS_REPLY_ERROR) {
    return Status::Unavailable("CLUSTER SLOTS: " + std::string(reply->str, reply->len));
  }
  if (reply->type != REDIS_REPLY_ARRAY)
    return Status::Corruption("CLUSTER SLOTS reply: not an array");
  std::vector<SlotRange> ranges;
  ranges.reserve(reply->elements);
  for (size_t i = 0; i < reply->elements; ++i) {
    const redisReply* e = reply->element[i];
    if (e == nullptr || e->type != REDIS_REPLY_ARRAY || e->elements < 3) {
      return Malformed(i, "expected [first, last, master, ...]");
    }
    const redisReply* first = e->element[0];
    const redisReply* last = e->element[1];
    const redisReply* master = e->element[2];
    if (first == nullptr || last == nullptr || first->type != REDIS_REPLY_INTEGER ||
        last->type != REDIS_REPLY_INTEGER) {
      return Malformed(i, "slot bounds are not integers");
    }
    if (first->integer < 0 || last->integer >= kClusterSlots || first->integer > last->integer) {
      return Malformed(i, "slot range " + std::to_string(first->integer) + "-" +
                              std::to_string(last->integer) + " outside [0, 16383]");
    }
    if (master == nullptr || master->type != REDIS_REPLY_ARRAY || master->elements < 2 ||
        master->element[0] == nullptr || master->element[1] == nullptr ||
        master->element[1]->type != REDIS_REPLY_INTEGER) {
      return Malformed(i, "master is not [host, port, ...]");
    }
    const redisReply* host = master->element[0];
    std::string host_text;
    if (host->type == REDIS_REPLY_STRING) {
      host_text.assign(host->str, host->len);
    } else if (host->type != REDIS_REPLY_NIL) {
      return Malformed(i, "master host is not a string");
    }
    if (host_text.empty() || host_text == "?") host_text = std::string(default_host);
    int64_t port = master->element[1]->integer;
    if (port < 1 || port > 65535) return Malformed(i, "master port out of range");
    ranges.push_back(SlotRange{static_cast<int>(first->integer), static_cast<int>(last->integer),
                               NodeAddress{std::move(host_text), static_cast<int>(port)}});
  }
  return ranges;
}

std::optional<Redirect> ParseRedirect(std::string_view error, std::string_view default_host) {
  Redirect r;
  if (error.starts_with("MOVED ")) {
    error.remove_prefix(6);
  } else if (error.starts_with("ASK ")) {
    r.ask = true;
    error.remove_prefix(4);
  } else {
    return std::nullopt;
  }
  size_t space = error.find(' ');
  if (space == std::string_view::npos) return std::nullopt;
  std::optional<int64_t> slot = ParseInt(error.substr(0, space));
  if (!slot || *slot < 0 || *slot >= kClusterSlots) return std::nullopt;
  r.slot = static_cast<int>(*slot);
  std::string_view addr = error.substr(space + 1);
  std::optional<NodeAddress> target = ParseHostPort(addr);
  if (!target) return std::nullopt;
  if (target->host.empty()) target->host = std::string(default_host);
  r.target = std::move(*target);
  return r;
}

}  // namespace kvtier::remote
