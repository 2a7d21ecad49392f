// Cache-only replay: the exact, timing-free definition of doc/replay.md, and its bounds.
//
// Each request, in replay order, counts its longest cached prefix in whole blocks and scores
// hit tokens = min(matched blocks x block size, prompt tokens); then it touches its blocks (a
// cached one is accessed, a missing one is inserted), evicting by the policy whenever the cache
// holds more than floor(capacity_tokens / block size) blocks.
//   "lru"      exact LRU, blocks touched first to last (the reference).
//   "lru-tail" exact LRU, blocks touched last to first (a chain's tail ages before its head).
//   "ideal"    infinite cache: the hit rate no capacity can beat.
//   "min"      Belady's MIN, block-granular, same capacity (ReplayBelady; needs the future).
//   "lib:NAME" the library's MakeEvictionPolicy(NAME) even where a built-in has that name.
//   any other  a library policy from MakeEvictionPolicy ("s3fifo", "arc", "session", ...),
//              touched in `touch` order and told the session events of each request.
//
// Thread-safety: the functions are reentrant; a stream is used by one call at a time.
#ifndef KVTIER_SIM_CACHE_REPLAY_H_
#define KVTIER_SIM_CACHE_REPLAY_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kvtier/block_key.h"
#include "kvtier/policy.h"
#include "kvtier/status.h"
#include "workload/trace.h"

namespace kvtier::sim {

enum class TouchOrder : uint8_t { kHeadFirst, kTailFirst };

// Which session events an engine sends besides the session id on every call.
enum class EngineEvents : uint8_t {
  kNone,        // session ids only
  kRequestEnd,  // + kThinking when each request finishes
  kClose,       // + kFinished instead when the trace says the session ended (its client closed
                //   it, or a sub-agent returned): an engine learns that only when told
};
std::string_view EngineEventsName(EngineEvents e);
// The event an engine sending `e` sends once request q finishes; nullopt for none. One rule for
// the Cache-driven replay and its cache-only model, so the two stay comparable.
std::optional<SessionEvent> EngineEventAfter(EngineEvents e, const workload::ReplayRequest& q);

struct CacheReplayOptions {
  std::string policy = "lru";
  uint64_t capacity_tokens = 0;  // ignored by "ideal"
  // Touch order for library policies (lru and lru-tail fix their own).
  TouchOrder touch = TouchOrder::kTailFirst;
  // Set: drive the library policy as the Cache does for an engine (ReplayThroughApi) instead:
  // the lookup touches the hit prefix, the store then touches the rest (evicting for the
  // missing blocks before inserting them), only these events are sent, and "lru" / "lru-tail"
  // are the library's "lru" (the Cache's).
  std::optional<EngineEvents> engine;

  Status Validate() const;
};

struct CacheReplayResult {
  std::string policy;
  uint64_t capacity_tokens = 0;
  uint64_t capacity_blocks = 0;
  uint64_t requests = 0;
  uint64_t prompt_tokens = 0;
  uint64_t hit_tokens = 0;
  double request_hit_sum = 0;  // sum over requests of hit tokens / prompt tokens
  uint64_t blocks = 0;         // block touches
  uint64_t hit_blocks = 0;     // blocks in matched prefixes
  uint64_t inserted_blocks = 0;
  uint64_t evicted_blocks = 0;
  uint64_t peak_resident_blocks = 0;
  uint64_t table_bytes = 0;  // memory of the replay's own structures at the end
  double seconds = 0;        // wall time of the replay loop

  double hit_rate() const {
    return prompt_tokens ? static_cast<double>(hit_tokens) / static_cast<double>(prompt_tokens) : 0;
  }
  // Mooncake FAST'25's definition: the mean over requests of each one's hit share.
  double per_request_mean_hit_rate() const {
    return requests ? request_hit_sum / static_cast<double>(requests) : 0;
  }
};

using ProgressFn = std::function<void(double fraction)>;

// Adds one request whose leading `matched` blocks hit to r: the one counting of every replay.
void CountRequest(CacheReplayResult* r, const workload::ReplayRequest& q, uint64_t matched);

// Runs one policy over the stream (rewound first and after). InvalidArgument for an unknown
// policy or a zero block size; the stream's own error when it fails.
Result<CacheReplayResult> ReplayCacheOnly(workload::RequestStream& stream,
                                          const CacheReplayOptions& options,
                                          const ProgressFn& progress = {});

// Belady's MIN at the same capacity: after each request, while over capacity, evicts the block
// whose next use is farthest (never = infinitely far); among equal next uses the deepest block
// (a descendant goes before its ancestor, which is used whenever the descendant is).
Result<CacheReplayResult> ReplayBelady(const workload::MaterializedRequests& requests,
                                       uint64_t capacity_tokens);

// The same-run floor of a replay: seconds to read the stream alone (generate or walk it) and to
// read it and chain its keys, with no cache. *blocks = block keys hashed.
struct StreamCost {
  double read_s = 0;
  double read_and_hash_s = 0;
  uint64_t blocks = 0;
};
Result<StreamCost> MeasureStreamCost(workload::RequestStream& stream);

// Chains each request's ids into BlockKeys, hashing only the blocks that differ from the
// session's previous request.
class ChainHasher {
 public:
  // The keys of r's blocks; valid until the next call. *common = blocks shared with the
  // session's previous request (0 for its first).
  std::span<const BlockKey> Keys(const workload::ReplayRequest& r, size_t* common);
  void Clear() { sessions_.clear(); }

 private:
  struct Memo {
    BlockKey root;
    std::vector<uint64_t> ids;
    std::vector<BlockKey> keys;
  };
  std::unordered_map<uint64_t, Memo> sessions_;
  Memo scratch_;
};

}  // namespace kvtier::sim

#endif  // KVTIER_SIM_CACHE_REPLAY_H_
