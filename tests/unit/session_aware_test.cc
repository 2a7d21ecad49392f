// The session-aware policy evicts what an agentic server knows will not come back soon.
#include <gtest/gtest.h>

#include "policy/session_aware.h"
#include "testing/test_util.h"

namespace kvtier {
namespace {

using testing::Key;

const std::function<bool(const BlockKey&)> kAny = [](const BlockKey&) { return true; };

void Request(SessionAwarePolicy& p, uint64_t session, double t, std::vector<uint64_t> keys,
             bool finish = false) {
  p.OnSessionEvent(session, SessionEvent::kActive, t);
  for (uint32_t i = 0; i < keys.size(); ++i) p.OnInsert(Key(keys[i]), {session, i, t});
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
  for (uint64_t want : {31, 21, 22, 11, 12, 13}) EXPECT_EQ(p.PickVictim(kAny), Key(want));
  EXPECT_EQ(p.size(), 0u);
  EXPECT_EQ(p.PickVictim(kAny), std::nullopt);
}

TEST(SessionAwarePolicy, SharedBlocksOutliveThinkingSessionsActiveOnesGoLast) {
  SessionAwarePolicy p(16);
  Request(p, 1, 0, {1, 2});  // 1 will be shared (a system prompt)
  p.OnSessionEvent(2, SessionEvent::kActive, 1);
  p.OnAccess(Key(1), {2, 0, 1});
  p.OnInsert(Key(3), {2, 1, 1});
  p.OnSessionEvent(2, SessionEvent::kThinking, 1);
  p.OnSessionEvent(4, SessionEvent::kActive, 2);  // running now
  p.OnInsert(Key(9), {4, 0, 2});
  // Thinking sessions' private blocks (2, 3) first, then the shared 1, then the active 9.
  auto a = p.PickVictim(kAny), b = p.PickVictim(kAny);
  ASSERT_TRUE(a && b);
  EXPECT_TRUE((*a == Key(2) && *b == Key(3)) || (*a == Key(3) && *b == Key(2)));
  EXPECT_EQ(p.PickVictim(kAny), Key(1));
  EXPECT_EQ(p.PickVictim(kAny), Key(9));
}

TEST(SessionAwarePolicy, PinnedBlocksKeepTheirPlaceAndEraseForgets) {
  SessionAwarePolicy p(16);
  Request(p, 1, 0, {1, 2, 3}, /*finish=*/true);
  auto not_two = [](const BlockKey& k) { return !(k == Key(1)); };
  EXPECT_EQ(p.PickVictim(not_two), Key(2));  // 1 is pinned: skipped, not removed
  p.OnErase(Key(3));
  EXPECT_EQ(p.size(), 1u);
  EXPECT_EQ(p.PickVictim(not_two), std::nullopt);
  EXPECT_EQ(p.PickVictim(kAny), Key(1));
}

}  // namespace
}  // namespace kvtier
