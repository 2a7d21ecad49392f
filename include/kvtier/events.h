// KV events: a block became resident in a tier or left it, numbered in one sequence per Cache,
// for cache-aware routers and for tests that follow residency.
//
// Thread-safety: the callback is invoked from the thread doing the operation, with no kvtier
// lock held; it must be thread-safe and must not call back into the same Cache. Two threads may
// deliver their events in either order, but seq is taken when the index changes: ordering by
// seq gives each block's changes in the order they happened, and every number is delivered
// once (no gaps), so a consumer can wait for the next.
#ifndef KVTIER_EVENTS_H_
#define KVTIER_EVENTS_H_

#include <cstdint>
#include <functional>
#include <string_view>

#include "kvtier/block_key.h"

namespace kvtier {

struct KvEvent {
  enum class Type : uint8_t { kStored, kRemoved };
  uint64_t seq = 0;  // 1, 2, 3, ... per Cache, in the order the index changed
  Type type = Type::kStored;
  BlockKey key;
  int tier = 0;  // index in CacheOptions::tiers
};

using KvEventCallback = std::function<void(const KvEvent&)>;

std::string_view KvEventTypeName(KvEvent::Type type);

}  // namespace kvtier

#endif  // KVTIER_EVENTS_H_
