// The session-aware policy evicts what an agentic server knows will not come back soon.
#include <gtest/gtest.h>

#include "policy/session_aware.h"

namespace kvtier {
namespace {

BlockKey K(uint64_t i) { return BlockKey{i, i * 7919}; }
const std::function<bool(const BlockKey&)> kAny = [](const BlockKey&) { return true; };

void Request(SessionAwarePolicy& p, uint64_t session, double t, std::vector<uint64_t> keys,
             bool finish = false) {
  p.OnSessionEvent(session, SessionEvent::kActive, t);
  for (uint32_t i = 0; i < keys.size(); ++i) p.OnInsert(K(keys[i]), {session, i, t});
  p.OnSessionEvent(session, finish ? SessionEvent::kFinished : SessionEvent::kThinking, t);
}

TEST(SessionAwarePolicy, FinishedFirstThenTheSessionExpectedBackLast) {
  SessionAwarePolicy p(16);
  // Session 1: a fast tool loop (2 s gaps), last seen at 4 s. Session 2: 100 s gaps, last seen
  // at 100 s. Session 3 finished at 101 s.
  Request(p, 1, 0, {11});
  Request(p, 1, 2, {12});
  Request(p, 1, 4, {13});
  Request(p, 2, 0, {21});
  Request(p, 2, 100, {22});
  Request(p, 3, 101, {31}, /*finish=*/true);
  ASSERT_EQ(p.size(), 6u);
  // At 101 s: session 2 is due back at 200 s; session 1 was due at 6 s, has waited 97 s and is
  // expected to wait as long again (198 s). So: 31, then session 2 oldest first, then session 1.
  for (uint64_t want : {31, 21, 22, 11, 12, 13}) EXPECT_EQ(p.PickVictim(kAny), K(want));
  EXPECT_EQ(p.size(), 0u);
  EXPECT_EQ(p.PickVictim(kAny), std::nullopt);
}

TEST(SessionAwarePolicy, SharedBlocksOutliveThinkingSessionsActiveOnesGoLast) {
  SessionAwarePolicy p(16);
  Request(p, 1, 0, {1, 2});  // 1 will be shared (a system prompt)
  p.OnSessionEvent(2, SessionEvent::kActive, 1);
  p.OnAccess(K(1), {2, 0, 1});
  p.OnInsert(K(3), {2, 1, 1});
  p.OnSessionEvent(2, SessionEvent::kThinking, 1);
  p.OnSessionEvent(4, SessionEvent::kActive, 2);  // running now
  p.OnInsert(K(9), {4, 0, 2});
  // Thinking sessions' private blocks (2, 3) first, then the shared 1, then the active 9.
  auto a = p.PickVictim(kAny), b = p.PickVictim(kAny);
  ASSERT_TRUE(a && b);
  EXPECT_TRUE((*a == K(2) && *b == K(3)) || (*a == K(3) && *b == K(2)));
  EXPECT_EQ(p.PickVictim(kAny), K(1));
  EXPECT_EQ(p.PickVictim(kAny), K(9));
}

TEST(SessionAwarePolicy, PinnedBlocksKeepTheirPlaceAndEraseForgets) {
  SessionAwarePolicy p(16);
  Request(p, 1, 0, {1, 2, 3}, /*finish=*/true);
  auto not_two = [](const BlockKey& k) { return !(k == K(1)); };
  EXPECT_EQ(p.PickVictim(not_two), K(2));  // 1 is pinned: skipped, not removed
  p.OnErase(K(3));
  EXPECT_EQ(p.size(), 1u);
  EXPECT_EQ(p.PickVictim(not_two), std::nullopt);
  EXPECT_EQ(p.PickVictim(kAny), K(1));
}

}  // namespace
}  // namespace kvtier
