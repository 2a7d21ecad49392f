// SessionAwarePolicy ("session"): eviction that uses what an agentic server knows about the
// sessions that own blocks.
//
// Each block belongs to the session that last touched it, or to a shared list once two sessions
// touched it (system prompts, a sub-agent prompt). Victims are taken, in this order, from
//   1. finished sessions (their private blocks will not return), oldest finish first;
//   2. thinking sessions, the one expected back last first. A session is expected back
//      after its usual gap (an average of its past inter-request gaps); once overdue, after as
//      long again as it has already waited (think times are heavy-tailed: who waited long will
//      likely wait longer);
//   3. the shared list (LRU);
//   4. active sessions (a request of theirs is running), least recently active first.
// Inside a session, blocks go least recently touched first: callers touch a request's blocks
// last to first, so stale blocks of older requests go before the current chain's tail, and the
// head goes last.
//
// Thread-safety: none; the owner serializes calls (EvictionPolicy contract).
#ifndef KVTIER_POLICY_SESSION_AWARE_H_
#define KVTIER_POLICY_SESSION_AWARE_H_

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "kvtier/policy.h"

namespace kvtier {

class SessionAwarePolicy final : public EvictionPolicy {
 public:
  explicit SessionAwarePolicy(uint64_t capacity_blocks);

  std::string_view name() const override { return "session"; }
  void OnInsert(const BlockKey& key, const AccessHint& hint) override;
  void OnAccess(const BlockKey& key, const AccessHint& hint) override;
  void OnErase(const BlockKey& key) override;
  std::optional<BlockKey> PickVictim(
      const std::function<bool(const BlockKey&)>& evictable) override;
  size_t size() const override { return map_.size(); }
  void OnSessionEvent(uint64_t session_id, SessionEvent event, double now_s) override;

 private:
  enum class State : uint8_t { kActive, kThinking, kFinished };
  struct Node {
    BlockKey key;
    uint32_t prev = 0;
    uint32_t next = 0;
    uint32_t list = 0;  // index of the list (sentinel node) holding it
  };
  struct Session {
    uint64_t id = 0;
    uint32_t sentinel = 0;  // node index of its list's sentinel
    uint64_t blocks = 0;
    State state = State::kActive;
    double last_start_s = -1;
    double gap_s = -1;  // average inter-request gap; < 0 = none yet
    double finished_s = 0;
    bool live = false;
  };

  uint32_t NewNode();
  uint32_t SessionSlot(uint64_t session_id);
  void Link(uint32_t node, uint32_t sentinel);
  void Unlink(uint32_t node);
  void Place(uint32_t node, const AccessHint& hint, bool is_new);
  void Remove(uint32_t node);
  // The list to take the next victim from; 0 when no block is held.
  uint32_t ChooseList();
  double ExpectedBack(const Session& s) const;

  std::vector<Node> nodes_;
  std::vector<uint32_t> free_nodes_;
  std::unordered_map<BlockKey, uint32_t, BlockKeyHash> map_;
  std::vector<Session> sessions_;  // slot 0 is the shared list
  std::vector<uint32_t> free_slots_;
  std::unordered_map<uint64_t, uint32_t> slot_of_;
  std::vector<uint32_t> list_owner_;  // sentinel node -> session slot
  double now_s_ = 0;
  double global_gap_s_ = 10;
  uint64_t epoch_ = 0;  // bumps on every session event
  uint64_t chosen_epoch_ = UINT64_MAX;
  uint32_t chosen_list_ = 0;
};

std::unique_ptr<EvictionPolicy> MakeSessionAwarePolicy(uint64_t capacity_blocks);

}  // namespace kvtier

#endif  // KVTIER_POLICY_SESSION_AWARE_H_
