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
//   4. active sessions (a request of theirs is running), least recently touched first.
// Until a kThinking or kFinished arrives every session looks running, and the shared list
// ranks among them by its last touch instead of going first.
// Inside a session, blocks go least recently touched first, and when a request ends the blocks
// it touched are ordered by chain position, so its tail goes before its head whatever order
// the caller touched them in (a Lookup touches the hit prefix, a later Store the new tail).
//
// What it needs to know: a session id on every touch (AccessHint). A touch of a session that
// is not active starts a request of it (kActive is implied); kThinking says the request ended,
// kFinished that the session will not return. Time is the policy's own: the number of
// requests started (not the caller's clock, which a replay compresses and which differs
// between a daemon and its clients), so gaps are counted in requests.
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
    uint32_t list = 0;      // index of the list (sentinel node) holding it
    uint32_t position = 0;  // chain position of its last touch
    uint64_t stamp = 0;     // request (clock_) of its last touch
  };
  struct Session {
    uint64_t id = 0;
    uint32_t sentinel = 0;  // node index of its list's sentinel
    uint64_t blocks = 0;
    State state = State::kActive;
    double last_start = -1;  // clock_ when its latest request started; < 0 = none yet
    double gap = -1;         // average inter-request gap in requests; < 0 = none yet
    double finished = 0;
    uint64_t last_touch = 0;  // touches_ at its latest touch
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
  // Starts a request of the session: advances the clock and its gap estimate.
  void Activate(Session& s);
  // Orders the blocks its current request touched by chain position, head most recent.
  void SortRun(Session& s);

  std::vector<Node> nodes_;
  std::vector<uint32_t> free_nodes_;
  std::unordered_map<BlockKey, uint32_t, BlockKeyHash> map_;
  std::vector<Session> sessions_;  // slot 0 is the shared list
  std::vector<uint32_t> free_slots_;
  std::unordered_map<uint64_t, uint32_t> slot_of_;
  std::vector<uint32_t> list_owner_;  // sentinel node -> session slot
  uint64_t clock_ = 0;                // requests started
  uint64_t touches_ = 0;              // touches, for the recency of active sessions
  bool told_ends_ = false;            // a kThinking or kFinished ever arrived
  double global_gap_ = 10;
  uint64_t epoch_ = 0;  // bumps on every session event
  uint64_t chosen_epoch_ = UINT64_MAX;
  uint32_t chosen_list_ = 0;
  uint64_t chosen_touch_ = 0;  // the chosen session's last_touch when it was chosen
  std::vector<uint32_t> run_scratch_;
};

std::unique_ptr<EvictionPolicy> MakeSessionAwarePolicy(uint64_t capacity_blocks);

}  // namespace kvtier

#endif  // KVTIER_POLICY_SESSION_AWARE_H_
