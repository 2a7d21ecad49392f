// Redis Cluster routing: CRC16 hash slots, the CLUSTER SLOTS reply, and MOVED / ASK redirects.
//
// A key maps to one of 16384 slots by CRC16 (XMODEM) of the key, or of its {hash tag} when it
// has a non-empty one; each slot is served by one master. These are pure functions over
// caller-owned data; all are safe to call concurrently.
#ifndef KVTIER_TIERS_REMOTE_CLUSTER_SLOTS_H_
#define KVTIER_TIERS_REMOTE_CLUSTER_SLOTS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/status.h"

struct redisReply;

namespace kvtier::remote {

inline constexpr int kClusterSlots = 16384;

struct NodeAddress {
  std::string host;
  int port = 0;
  std::string ToString() const { return host + ":" + std::to_string(port); }
  friend bool operator==(const NodeAddress&, const NodeAddress&) = default;
};

// CRC16-CCITT (XMODEM: polynomial 0x1021, initial value 0), as Redis Cluster uses.
uint16_t Crc16(std::string_view bytes);

// The hash slot of a key, honouring a non-empty {hash tag}.
int KeyHashSlot(std::string_view key);

struct SlotRange {
  int first = 0;  // inclusive
  int last = 0;   // inclusive
  NodeAddress master;
};

// Parses a CLUSTER SLOTS reply. A master with an empty or "?" endpoint is reported at
// `default_host` (Redis's way of saying "the host you asked"). Corruption naming the element
// for a malformed reply; ranges must lie in [0, 16383] with first <= last.
Result<std::vector<SlotRange>> ParseClusterSlots(const redisReply* reply,
                                                 std::string_view default_host);

// A "MOVED <slot> <host>:<port>" or "ASK <slot> <host>:<port>" error reply.
struct Redirect {
  bool ask = false;  // ASK: try the target once after ASKING; MOVED: the slot moved for good
  int slot = 0;
  NodeAddress target;
};

// Parses an error reply's text; nullopt when it is not a well-formed redirect. An empty host
// ("MOVED 12 :7001") means `default_host`.
std::optional<Redirect> ParseRedirect(std::string_view error, std::string_view default_host);

// "host:port" or "[v6]:port" -> address; nullopt when malformed or the port is not 1..65535.
std::optional<NodeAddress> ParseHostPort(std::string_view text);

}  // namespace kvtier::remote

#endif  // KVTIER_TIERS_REMOTE_CLUSTER_SLOTS_H_
