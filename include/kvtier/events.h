// KV events: a block became resident in a tier or left it, numbered in one sequence per Cache,
// for cache-aware routers and for tests that follow residency; and the options of the Cache's
// own publisher, which speaks vLLM's KV-event wire format on ZeroMQ (doc/events.md).
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
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/block_key.h"
#include "kvtier/status.h"
#include "kvtier/tier.h"

namespace kvtier {

// The engine's own hashes for the engine blocks inside one kvtier block (for vLLM: the
// ExternalBlockHash bytes of each vLLM block, oldest first). When an event carries them the
// publisher announces these instead of kvtier's key, on the engine's topic, so a router matches
// them to the hashes it computes from a request.
struct EngineBlockHashes {
  std::vector<std::string> hashes;  // bytes, one per engine block
  std::string parent_hash;          // the engine block before hashes[0]; empty: none
  std::vector<uint32_t> token_ids;  // every token of the kvtier block
  std::string lora_name;            // empty: none
};

struct KvEventBlock {
  BlockKey key;
  int tier = 0;
  std::shared_ptr<const EngineBlockHashes> engine;  // null: announce `key`
};

struct KvEvent {
  // kCleared: every tier of the Cache was cleared (as far as a router should know); the blocks
  // still resident follow in `resident`, to be announced again after the clear.
  enum class Type : uint8_t { kStored, kRemoved, kCleared };
  uint64_t seq = 0;  // 1, 2, 3, ... per Cache, in the order the index changed
  Type type = Type::kStored;
  BlockKey key;
  int tier = 0;  // index in CacheOptions::tiers; -1 for kCleared
  std::shared_ptr<const std::vector<KvEventBlock>> resident;  // kCleared only
  std::shared_ptr<const EngineBlockHashes> engine;            // null: announce `key`
};

using KvEventCallback = std::function<void(const KvEvent&)>;

std::string_view KvEventTypeName(KvEvent::Type type);

// The medium a tier of this kind is announced in unless KvEventsOptions::media says otherwise:
// "GPU" (emulated device), "CPU" (host), "STORAGE" (disk), "REMOTE" (remote).
std::string_view DefaultMedium(TierKind kind);

// The Cache's ZeroMQ publisher in vLLM's format (vllm/distributed/kv_events.py, vLLM 0.32).
// Off while endpoint is empty.
struct KvEventsOptions {
  // A ZeroMQ endpoint. kAuto follows vLLM: bind when it has "*" or "::" or is ipc:// or
  // inproc://, connect otherwise (to a router that binds).
  std::string endpoint;
  enum class Socket : uint8_t { kAuto, kBind, kConnect };
  Socket socket = Socket::kAuto;
  // A ROUTER endpoint (always bound) that replays buffered batches; empty: none.
  std::string replay_endpoint;
  uint32_t replay_batches = 10000;  // batches kept for replay (vLLM's buffer_steps)
  // Data-parallel rank r: published on the endpoints' tcp port + r (vLLM's rule) and in every
  // batch.
  uint32_t data_parallel_rank = 0;
  // The engine-hash topic; fields {host}, {port}, {model}, {dp_rank} are substituted (llm-d
  // expects "kv@{host}:{port}@{model}"). Default "" as vLLM's.
  std::string topic;
  // Blocks announced with kvtier's own keys go to topic + this suffix: no router can compute
  // them, so they stay off the topic a router reads.
  std::string keys_topic_suffix = "@kvtier-keys";
  std::string topic_host;   // {host}; empty: this machine's hostname
  std::string topic_port;   // {port}: the engine's serving port, for llm-d's topic
  std::string topic_model;  // {model}; empty: CacheOptions::model_id
  // A batch goes out when it holds max_batch_events or its oldest event is batch_interval_ms
  // old. At most queue_events wait; more are dropped (counted).
  uint32_t max_batch_events = 1024;
  uint32_t batch_interval_ms = 10;
  uint32_t queue_events = 100000;
  int send_hwm = 100000;  // ZeroMQ high-water mark of the PUB socket, in messages
  // Medium per tier (index in CacheOptions::tiers); missing or empty: by kind, "GPU" for the
  // device tier, "CPU" for host, "STORAGE" for disk, "REMOTE" for remote.
  std::vector<std::string> media;
  // Engine hashes as vLLM 0.32 announces them by default (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1):
  // the low 64 bits of the big-endian bytes, an unsigned int. false: the bytes as given.
  bool int_hashes = true;
  // Blocks whose engine hashes the Cache keeps for its events (Store's engine_hashes), while the
  // block is resident somewhere; past it, a newly stored block is announced with kvtier's key
  // (counted, KvEventsInfo::engine_hashes_dropped).
  uint64_t engine_hash_blocks = uint64_t{1} << 20;

  bool enabled() const { return !endpoint.empty(); }
  // OK, or InvalidArgument naming the field.
  Status Validate() const;
};

// A running publisher: where it is and what it sent.
struct KvEventsInfo {
  std::string endpoint;                // as bound (the real port) or connected; empty: off
  std::string replay_endpoint;         // as bound; empty: none
  std::string topic;                   // the engine-hash topic
  std::string keys_topic;              // the kvtier-key topic
  uint64_t events = 0;                 // events sent
  uint64_t batches = 0;                // messages sent
  uint64_t dropped = 0;                // events dropped on a full queue
  uint64_t engine_hash_blocks = 0;     // blocks whose engine hashes are kept now
  uint64_t engine_hashes_dropped = 0;  // stored blocks whose hashes found the table full
};

}  // namespace kvtier

#endif  // KVTIER_EVENTS_H_
