// The payload of one vLLM KV-event message: a msgpack KVEventBatch as vLLM 0.32's msgspec
// classes encode it (vllm/distributed/kv_events.py): an array [ts, events, data_parallel_rank]
// whose events are maps tagged {"type": "BlockStored" | "BlockRemoved" | "AllBlocksCleared"},
// with every required field written (None as nil) and the optional ones left out.
//
// Thread-safety: none; one encoder per batch. The medium strings passed in must outlive it.
#ifndef KVTIER_EVENTS_KV_EVENT_CODEC_H_
#define KVTIER_EVENTS_KV_EVENT_CODEC_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/events.h"

namespace kvtier::events {

// kvtier's key as a block hash: 16 bytes, hi then lo, big-endian.
std::string KeyBytes(const BlockKey& key);

// vLLM's ExternalBlockHash as an int: the low 64 bits of the hash's big-endian bytes
// (vllm.v1.core.kv_cache_utils.maybe_convert_block_hash).
uint64_t EngineHashInt(std::string_view hash);

class BatchEncoder {
 public:
  // block_size: tokens per kvtier block (BlockStored.block_size for kvtier keys). int_hashes:
  // engine hashes as vLLM's int form (EngineHashInt), else as bytes; kvtier keys are bytes.
  BatchEncoder(uint32_t block_size, uint32_t data_parallel_rank, bool int_hashes = false);

  void Cleared();
  // Consecutive stores (or removals) to one medium become one event with several hashes.
  void Stored(const BlockKey& key, std::string_view medium);
  void Removed(const BlockKey& key, std::string_view medium);
  // With the engine's hashes: one event per kvtier block. *engine must outlive Finish().
  void EngineStored(const EngineBlockHashes* engine, std::string_view medium);
  void EngineRemoved(const EngineBlockHashes* engine, std::string_view medium);

  bool empty() const { return groups_.empty(); }
  // The msgpack bytes; ts is seconds since the epoch.
  std::string Finish(double ts) const;

 private:
  enum class Kind : uint8_t { kStored, kRemoved, kCleared };
  struct Group {
    Kind kind;
    std::string_view medium;
    std::vector<BlockKey> keys;
    const EngineBlockHashes* engine = nullptr;
  };
  void Add(Kind kind, const BlockKey& key, std::string_view medium);
  uint32_t block_size_;
  uint32_t dp_rank_;
  bool int_hashes_;
  std::vector<Group> groups_;
};

}  // namespace kvtier::events

#endif  // KVTIER_EVENTS_KV_EVENT_CODEC_H_
