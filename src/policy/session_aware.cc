#include "policy/session_aware.h"

#include <algorithm>
#include <limits>

namespace kvtier {

SessionAwarePolicy::SessionAwarePolicy(uint64_t capacity_blocks) {
  const uint64_t reserve = std::min<uint64_t>(capacity_blocks + 16, 1 << 22);
  nodes_.reserve(reserve);
  map_.reserve(reserve);
  nodes_.push_back(Node{});  // index 0: "no node"
  // Slot 0 is the shared list.
  Session shared;
  shared.sentinel = NewNode();
  shared.live = true;
  nodes_[shared.sentinel].prev = nodes_[shared.sentinel].next = shared.sentinel;
  list_owner_.resize(nodes_.size(), 0);
  sessions_.push_back(shared);
}

uint32_t SessionAwarePolicy::NewNode() {
  if (!free_nodes_.empty()) {
    const uint32_t n = free_nodes_.back();
    free_nodes_.pop_back();
    return n;
  }
  nodes_.push_back(Node{});
  return static_cast<uint32_t>(nodes_.size() - 1);
}

uint32_t SessionAwarePolicy::SessionSlot(uint64_t session_id) {
  auto [it, inserted] = slot_of_.try_emplace(session_id, 0);
  if (!inserted) return it->second;
  uint32_t slot;
  if (!free_slots_.empty()) {
    slot = free_slots_.back();
    free_slots_.pop_back();
  } else {
    slot = static_cast<uint32_t>(sessions_.size());
    Session s;
    s.sentinel = NewNode();
    nodes_[s.sentinel].prev = nodes_[s.sentinel].next = s.sentinel;
    if (list_owner_.size() <= s.sentinel) list_owner_.resize(s.sentinel + 1, 0);
    list_owner_[s.sentinel] = slot;
    sessions_.push_back(s);
  }
  Session& s = sessions_[slot];
  s.id = session_id;
  s.blocks = 0;
  s.state = State::kActive;
  s.last_start = -1;
  s.gap = -1;
  s.last_touch = 0;
  s.live = true;
  it->second = slot;
  return slot;
}

void SessionAwarePolicy::Link(uint32_t node, uint32_t sentinel) {
  Node& n = nodes_[node];
  n.list = sentinel;
  n.prev = sentinel;
  n.next = nodes_[sentinel].next;
  nodes_[n.next].prev = node;
  nodes_[sentinel].next = node;
  ++sessions_[list_owner_[sentinel]].blocks;
}

void SessionAwarePolicy::Unlink(uint32_t node) {
  Node& n = nodes_[node];
  nodes_[n.prev].next = n.next;
  nodes_[n.next].prev = n.prev;
  --sessions_[list_owner_[n.list]].blocks;
}

void SessionAwarePolicy::Place(uint32_t node, const AccessHint& hint, bool is_new) {
  uint32_t slot = 0;
  uint64_t stamp = 0;
  if (hint.session_id != 0) {
    slot = SessionSlot(hint.session_id);
    Session& s = sessions_[slot];
    // A touch of a session that is not running starts a request of it (kActive implied).
    if (s.state != State::kActive || s.last_start < 0) Activate(s);
    s.last_touch = ++touches_;
    stamp = static_cast<uint64_t>(s.last_start);
  }
  if (!is_new) {
    const uint32_t owner = list_owner_[nodes_[node].list];
    if (owner != slot) slot = 0;  // a second session touched it: shared
    Unlink(node);
    if (owner != 0 && owner != slot && sessions_[owner].state == State::kFinished &&
        sessions_[owner].blocks == 0 && sessions_[owner].live) {
      slot_of_.erase(sessions_[owner].id);
      sessions_[owner].live = false;
      free_slots_.push_back(owner);
    }
  }
  nodes_[node].position = hint.position;
  nodes_[node].stamp = stamp;
  if (slot == 0) sessions_[0].last_touch = ++touches_;
  Link(node, sessions_[slot].sentinel);
}

void SessionAwarePolicy::Activate(Session& s) {
  SortRun(s);
  ++epoch_;
  ++clock_;
  const double now = static_cast<double>(clock_);
  if (s.last_start >= 0) {
    const double gap = now - s.last_start;
    s.gap = s.gap < 0 ? gap : 0.5 * s.gap + 0.5 * gap;
    global_gap_ = 0.95 * global_gap_ + 0.05 * gap;
  }
  s.last_start = now;
  s.state = State::kActive;
}

void SessionAwarePolicy::SortRun(Session& s) {
  if (s.last_start < 0) return;
  const uint64_t stamp = static_cast<uint64_t>(s.last_start);
  std::vector<uint32_t>& run = run_scratch_;
  run.clear();
  for (uint32_t n = nodes_[s.sentinel].next; n != s.sentinel && nodes_[n].stamp == stamp;
       n = nodes_[n].next)
    run.push_back(n);
  if (run.size() < 2) return;
  std::stable_sort(run.begin(), run.end(), [this](uint32_t a, uint32_t b) {
    return nodes_[a].position > nodes_[b].position;
  });
  // Relinked deepest first, each at the head: the chain's head ends most recent.
  for (uint32_t n : run) {
    Unlink(n);
    Link(n, s.sentinel);
  }
}

void SessionAwarePolicy::OnInsert(const BlockKey& key, const AccessHint& hint) {
  auto [it, inserted] = map_.try_emplace(key, 0);
  if (!inserted) {
    Place(it->second, hint, false);
    return;
  }
  const uint32_t node = NewNode();
  nodes_[node].key = key;
  it->second = node;
  Place(node, hint, true);
}

void SessionAwarePolicy::OnAccess(const BlockKey& key, const AccessHint& hint) {
  auto it = map_.find(key);
  if (it == map_.end()) {
    OnInsert(key, hint);
    return;
  }
  Place(it->second, hint, false);
}

void SessionAwarePolicy::Remove(uint32_t node) {
  const uint32_t owner = list_owner_[nodes_[node].list];
  Unlink(node);
  map_.erase(nodes_[node].key);
  free_nodes_.push_back(node);
  Session& s = sessions_[owner];
  if (owner != 0 && s.state == State::kFinished && s.blocks == 0 && s.live) {
    slot_of_.erase(s.id);
    s.live = false;
    free_slots_.push_back(owner);
  }
}

void SessionAwarePolicy::OnErase(const BlockKey& key) {
  auto it = map_.find(key);
  if (it != map_.end()) Remove(it->second);
}

double SessionAwarePolicy::ExpectedBack(const Session& s) const {
  const double now = static_cast<double>(clock_);
  const double gap = s.gap >= 0 ? s.gap : global_gap_;
  double back = s.last_start + gap;
  if (back <= now) back = now + (now - s.last_start);
  return back;
}

uint32_t SessionAwarePolicy::ChooseList() {
  if (chosen_epoch_ == epoch_ && chosen_list_ != 0 &&
      sessions_[list_owner_[chosen_list_]].blocks > 0 &&
      sessions_[list_owner_[chosen_list_]].last_touch == chosen_touch_) {
    return chosen_list_;
  }
  // Rank: lower class goes first; inside a class, higher score goes first.
  int best_class = 5;
  double best_score = -std::numeric_limits<double>::infinity();
  uint32_t best = 0;
  for (uint32_t slot = 0; slot < sessions_.size(); ++slot) {
    const Session& s = sessions_[slot];
    if (!s.live || s.blocks == 0) continue;
    int cls;
    double score;
    if (slot == 0) {
      // Never told a request ended, every session looks running: shared blocks then age
      // among them rather than going first.
      cls = told_ends_ ? 2 : 3;
      score = told_ends_ ? 0 : -static_cast<double>(s.last_touch);
    } else if (s.state == State::kFinished) {
      cls = 0;
      score = -s.finished;
    } else if (s.state == State::kThinking) {
      cls = 1;
      score = ExpectedBack(s);
    } else {
      cls = 3;
      score = -static_cast<double>(s.last_touch);
    }
    if (cls < best_class || (cls == best_class && score > best_score)) {
      best_class = cls;
      best_score = score;
      best = s.sentinel;
    }
  }
  chosen_epoch_ = epoch_;
  chosen_list_ = best;
  chosen_touch_ = best ? sessions_[list_owner_[best]].last_touch : 0;
  return best;
}

std::optional<BlockKey> SessionAwarePolicy::PickVictim(
    const std::function<bool(const BlockKey&)>& evictable) {
  if (map_.empty()) return std::nullopt;
  const uint32_t list = ChooseList();
  if (list != 0) {
    for (uint32_t n = nodes_[list].prev; n != list; n = nodes_[n].prev) {
      if (evictable(nodes_[n].key)) {
        const BlockKey key = nodes_[n].key;
        Remove(n);
        return key;
      }
    }
  }
  // Everything in the chosen list is pinned: take the first evictable block of any list.
  for (uint32_t slot = 0; slot < sessions_.size(); ++slot) {
    const Session& s = sessions_[slot];
    if (!s.live || s.blocks == 0) continue;
    for (uint32_t n = nodes_[s.sentinel].prev; n != s.sentinel; n = nodes_[n].prev) {
      if (evictable(nodes_[n].key)) {
        const BlockKey key = nodes_[n].key;
        Remove(n);
        return key;
      }
    }
  }
  return std::nullopt;
}

void SessionAwarePolicy::OnSessionEvent(uint64_t session_id, SessionEvent event, double /*now_s*/) {
  if (session_id == 0) return;
  ++epoch_;
  const uint32_t slot = SessionSlot(session_id);
  Session& s = sessions_[slot];
  switch (event) {
    case SessionEvent::kActive:
      if (s.state != State::kActive || s.last_start < 0) Activate(s);
      break;
    case SessionEvent::kThinking:
      told_ends_ = true;
      if (s.last_start < 0) Activate(s);
      SortRun(s);
      s.state = State::kThinking;
      break;
    case SessionEvent::kFinished:
      told_ends_ = true;
      SortRun(s);
      s.state = State::kFinished;
      s.finished = static_cast<double>(clock_);
      if (s.blocks == 0) {
        slot_of_.erase(s.id);
        s.live = false;
        free_slots_.push_back(slot);
      }
      break;
    case SessionEvent::kReset:
      // Old blocks are no longer re-touched, so they drift to the cold end of the list.
      break;
  }
}

std::unique_ptr<EvictionPolicy> MakeSessionAwarePolicy(uint64_t capacity_blocks) {
  return std::make_unique<SessionAwarePolicy>(capacity_blocks);
}

}  // namespace kvtier
