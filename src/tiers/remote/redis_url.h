// The address of a Redis / Valkey deployment:
//
//   redis://[user[:password]@]host[:port][,host[:port]...][/db]
//
// Several hosts are cluster seeds (any one that answers gives the whole topology); one host may
// be a single node or a cluster (found out at connect time). user and password may be
// percent-encoded. The default port is 6379. rediss:// (TLS) is refused: Debian's hiredis 0.14
// is built without TLS.
//
// Thread-safety: a value type and pure functions.
#ifndef KVTIER_TIERS_REMOTE_REDIS_URL_H_
#define KVTIER_TIERS_REMOTE_REDIS_URL_H_

#include <string>
#include <string_view>
#include <vector>

#include "kvtier/status.h"
#include "tiers/remote/cluster_slots.h"

namespace kvtier::remote {

struct RedisUrl {
  std::vector<NodeAddress> seeds;
  std::string user;      // empty: AUTH with the password only (or no AUTH)
  std::string password;  // empty: no AUTH
  int db = 0;            // SELECT on a single node; a cluster only has db 0

  // The URL again, with the password shown as "***".
  std::string Redacted() const;
};

// InvalidArgument naming what is wrong ("url: port 'x' is not a number in 1..65535").
Result<RedisUrl> ParseRedisUrl(std::string_view url);

}  // namespace kvtier::remote

#endif  // KVTIER_TIERS_REMOTE_REDIS_URL_H_
