// Eviction and admission policies.
//
// An EvictionPolicy orders the blocks resident in one tier and names the next victim. It only
// tracks keys; the Cache (or the simulator) owns the bytes and the index. A policy sees every
// key resident in its tier: OnInsert once when it becomes resident, OnAccess on each hit,
// OnErase when it leaves other than through PickVictim. Only tiers the Cache manages have one;
// self-managed tiers (disk, remote) evict by themselves.
//
// Chains: a block helps only while all blocks before it are resident, so callers touch a
// request's blocks last-to-first (the head is then the most recent) and the tail goes first.
//
// Thread-safety: none. The owner serializes calls (the Cache holds a per-tier mutex).
#ifndef KVTIER_POLICY_H_
#define KVTIER_POLICY_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/block_key.h"
#include "kvtier/status.h"

namespace kvtier {

// What an agentic server knows about a block's owner, for policies that use it.
struct AccessHint {
  uint64_t session_id = 0;  // 0 = unknown
  uint32_t position = 0;    // block index in its request's chain
  double now_s = 0;         // the caller's clock
};

enum class SessionEvent : uint8_t {
  kThinking,  // waiting on the client or a tool call: will come back
  kActive,    // a request of the session is running
  kFinished,  // the session or sub-agent ended: its private blocks will not return
  kReset,     // the context was reset: old blocks will not return
};

class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;

  virtual std::string_view name() const = 0;
  virtual void OnInsert(const BlockKey& key, const AccessHint& hint) = 0;
  virtual void OnAccess(const BlockKey& key, const AccessHint& hint) = 0;
  // A hit on a whole chain prefix, keys[0..n) all resident: the same as OnAccess of each,
  // last to first, with hint.position = i. A policy may get there in fewer steps.
  virtual void OnAccessChain(std::span<const BlockKey> keys, AccessHint hint) {
    for (size_t i = keys.size(); i-- > 0;) {
      hint.position = static_cast<uint32_t>(i);
      OnAccess(keys[i], hint);
    }
  }
  virtual void OnErase(const BlockKey& key) = 0;
  // Removes and returns the next victim for which evictable(key) is true (pinned blocks are
  // skipped and keep their place). nullopt when none qualifies.
  virtual std::optional<BlockKey> PickVictim(
      const std::function<bool(const BlockKey&)>& evictable) = 0;
  virtual size_t size() const = 0;
  // Session lifecycle hints; policies that ignore them keep this default.
  virtual void OnSessionEvent(uint64_t /*session_id*/, SessionEvent /*event*/, double /*now_s*/) {}
};

// "lru", "s3fifo", "arc", "session" (session_aware.h). capacity_blocks sizes the ghost lists
// of S3-FIFO and ARC.
// InvalidArgument names the unknown policy and lists the known ones.
Result<std::unique_ptr<EvictionPolicy>> MakeEvictionPolicy(std::string_view name,
                                                           uint64_t capacity_blocks);
std::vector<std::string> EvictionPolicyNames();

// Which blocks a tier takes (doc/design.md, "Admission"): a block goes in only when every rule
// set holds; 0 turns a rule off, so the default admits everything. Judged whenever a block is
// offered to the tier: at a store or commit, when a write-back victim comes down, and (for
// min_reuse, write-through) when a lookup hit brings a block's reuse up to min_reuse.
struct AdmissionOptions {
  // Lookups that must have hit the block (served it to a later request) first, 0..65535.
  uint32_t min_reuse = 0;
  // Tokens of the request the block belongs to (a write-back victim: up to its block).
  uint64_t min_prefix_tokens = 0;
  // With min_reuse: a block refused for too little reuse is remembered after it leaves the
  // cache, and a lookup that misses it counts as a reuse, so its next store takes it down (the
  // index counts reuse only while some tier holds the block). false: only hits count.
  bool count_reuse_after_eviction = true;
  bool admits_all() const { return min_reuse == 0 && min_prefix_tokens == 0; }
  Status Validate() const;
};

// Refused on tiers[0]: the first tier takes every stored block (through the daemon, a client
// has written it there already); admission selects what goes below it.
inline constexpr const char* kFirstTierAdmits =
    "the first tier takes every block; set admission on the tiers below it";

// Why a block was refused; the prefix rule is judged first.
enum class AdmissionVerdict : uint8_t { kAdmit, kSkipPrefix, kSkipReuse };
// Pure: a block hit `reuse` times, of a request of prefix_tokens tokens.
AdmissionVerdict JudgeAdmission(const AdmissionOptions& options, uint32_t reuse,
                                uint64_t prefix_tokens);

}  // namespace kvtier

#endif  // KVTIER_POLICY_H_
