#include "kvtier/cache.h"

#include <gtest/gtest.h>

#include <future>
#include <mutex>

#include "testing/test_util.h"

namespace kvtier {
namespace {

using testing::HostSpec;
using testing::InstanceSpec;

using testing::FaultyTier;
using testing::FillBlock;
using testing::SmallLayout;
using testing::Tokens;

constexpr uint32_t kBt = 4;  // tokens per block in these tests

std::unique_ptr<Cache> OpenCache(std::vector<TierSpec> tiers,
                                 WriteMode mode = WriteMode::kWriteThrough,
                                 KvEventCallback cb = nullptr) {
  CacheOptions o;
  o.layout = SmallLayout(kBt);
  o.model_id = "test-model";
  o.tiers = std::move(tiers);
  o.write_mode = mode;
  o.on_event = std::move(cb);
  auto c = Cache::Open(std::move(o));
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return std::move(c).value();
}

// Blocks whose bytes are a function of their key: any mix-up shows.
struct Blocks {
  std::vector<std::vector<std::byte>> data;
  std::vector<ConstBlock> views;
  Blocks(const Cache& c, std::span<const TokenId> tokens, size_t first, size_t n) {
    std::vector<BlockKey> keys;
    HashPrefix(c.Root(), kBt, tokens, &keys);
    for (size_t i = first; i < first + n; ++i) {
      data.emplace_back(c.layout().bytes_per_block());
      FillBlock(data.back(), keys[i].lo);
    }
    for (auto& d : data) views.emplace_back(d);
  }
};

struct Buffers {
  std::vector<std::vector<std::byte>> data;
  std::vector<MutableBlock> views;
  Buffers(const Cache& c, size_t n)
      : data(n, std::vector<std::byte>(c.layout().bytes_per_block())) {
    for (auto& d : data) views.emplace_back(d);
  }
};

void ExpectBlockBytes(const Cache& c, std::span<const TokenId> tokens, const Buffers& b, size_t n) {
  std::vector<BlockKey> keys;
  HashPrefix(c.Root(), kBt, tokens, &keys);
  for (size_t i = 0; i < n; ++i) {
    std::vector<std::byte> want(c.layout().bytes_per_block());
    FillBlock(want, keys[i].lo);
    ASSERT_EQ(b.data[i], want) << "block " << i;
  }
}

TEST(CacheTest, StoreThenLoadIsByteExact) {
  auto cache = OpenCache({HostSpec(64)});
  auto tokens = Tokens(10 * kBt + 3);  // 10 full blocks and a partial one
  Blocks blocks(*cache, tokens, 0, 10);
  auto st = cache->Store(tokens, blocks.views);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(st->stored_blocks, 10u);

  auto lk = cache->Lookup(tokens);
  ASSERT_TRUE(lk.ok());
  EXPECT_EQ(lk->keys.size(), 10u);
  EXPECT_EQ(lk->hit_blocks, 10u);
  EXPECT_EQ(lk->hit_tokens(), 40u);
  EXPECT_EQ(lk->blocks_by_tier[0], 10u);
  Buffers out(*cache, 10);
  auto ld = cache->Load(*lk, out.views);
  ASSERT_TRUE(ld.ok());
  EXPECT_EQ(ld->loaded_blocks, 10u);
  ExpectBlockBytes(*cache, tokens, out, 10);

  // Storing again copies nothing.
  auto again = cache->Store(tokens, blocks.views);
  EXPECT_EQ(again->present_blocks, 10u);
  EXPECT_EQ(again->stored_blocks, 0u);
}

TEST(CacheTest, LongerRequestHitsTheSharedPrefix) {
  auto cache = OpenCache({HostSpec(64)});
  auto first = Tokens(6 * kBt);
  Blocks b(*cache, first, 0, 6);
  ASSERT_TRUE(cache->Store(first, b.views).ok());
  auto next = Tokens(9 * kBt);  // same first 6 blocks, 3 more
  auto lk = cache->Lookup(next);
  EXPECT_EQ(lk->hit_blocks, 6u);
  auto other = Tokens(9 * kBt, 1000);
  EXPECT_EQ(cache->Lookup(other)->hit_blocks, 0u);
  // Only the new blocks are stored for the next turn.
  Blocks nb(*cache, next, 6, 3);
  auto st = cache->Store(next, nb.views, 6);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->stored_blocks, 3u);
  EXPECT_EQ(cache->Lookup(next)->hit_blocks, 9u);
}

TEST(CacheTest, TenantsNeverHitEachOther) {
  auto cache = OpenCache({HostSpec(64)});
  auto tokens = Tokens(4 * kBt);
  RequestOptions a{"tenant-a", "", 0}, b{"tenant-b", "", 0};
  std::vector<BlockKey> keys_a;
  HashPrefix(cache->Root(a), kBt, tokens, &keys_a);
  std::vector<std::vector<std::byte>> data(
      4, std::vector<std::byte>(cache->layout().bytes_per_block()));
  std::vector<ConstBlock> views(data.begin(), data.end());
  ASSERT_TRUE(cache->Store(tokens, views, 0, a).ok());
  EXPECT_EQ(cache->Lookup(tokens, a)->hit_blocks, 4u);
  EXPECT_EQ(cache->Lookup(tokens, b)->hit_blocks, 0u);
  EXPECT_EQ(cache->Lookup(tokens)->hit_blocks, 0u);  // the default tenant is another tenant
  RequestOptions lora{"tenant-a", "adapter-1", 0};
  EXPECT_EQ(cache->Lookup(tokens, lora)->hit_blocks, 0u);
}

TEST(CacheTest, CapacityIsNeverExceededAndTailGoesFirst) {
  auto cache = OpenCache({HostSpec(8)});
  for (uint32_t r = 0; r < 20; ++r) {
    auto tokens = Tokens(5 * kBt, 100 * r);
    Blocks b(*cache, tokens, 0, 5);
    ASSERT_TRUE(cache->Store(tokens, b.views).ok());
    EXPECT_LE(cache->tier(0).used_bytes(), cache->tier(0).capacity_bytes());
  }
  // The last request (5 blocks) is whole; of the one before only its head survives (3 of 5),
  // because its tail was evicted first.
  EXPECT_EQ(cache->Lookup(Tokens(5 * kBt, 1900))->hit_blocks, 5u);
  EXPECT_EQ(cache->Lookup(Tokens(5 * kBt, 1800))->hit_blocks, 3u);
  CacheStats s = cache->stats();
  EXPECT_EQ(s.tiers[0].evictions, 100u - 8u);
}

// Issue 28: a Store of a chain's next blocks evicted the head the same request had just hit
// (its Lookup touched the head before the Store inserted the tail), so a context longer than
// the tier left nothing usable behind. Positions past the capacity are refused instead.
TEST(CacheTest, AStoreNeverEvictsThePrefixItExtends) {
  auto cache = OpenCache({HostSpec(8)});
  auto tokens = Tokens(12 * kBt);
  Blocks head(*cache, tokens, 0, 8);
  ASSERT_EQ(cache->Store(tokens, head.views)->stored_blocks, 8u);
  EXPECT_EQ(cache->Lookup(tokens)->hit_blocks, 8u);
  Blocks tail(*cache, tokens, 8, 4);
  auto st = cache->Store(tokens, tail.views, 8);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->stored_blocks, 0u);
  EXPECT_EQ(st->failed_blocks, 4u);
  EXPECT_EQ(st->first_error.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(cache->Lookup(tokens)->hit_blocks, 8u);
  EXPECT_EQ(cache->stats().tiers[0].evictions, 0u);
}

TEST(CacheTest, WriteThroughServesFromTheLowerTierAfterEviction) {
  auto cache = OpenCache({HostSpec(4, "hbm"), HostSpec(64, "dram")});
  auto tokens = Tokens(10 * kBt);
  Blocks b(*cache, tokens, 0, 10);
  auto st = cache->Store(tokens, b.views);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->stored_blocks, 10u);
  cache->WaitForWrites();  // the lower tier is written in the background
  auto lk = cache->Lookup(tokens);
  ASSERT_EQ(lk->hit_blocks, 10u);
  EXPECT_EQ(lk->blocks_by_tier[0], 4u);  // head still in the small tier
  EXPECT_EQ(lk->blocks_by_tier[1], 6u);
  Buffers out(*cache, 10);
  auto ld = cache->Load(*lk, out.views);
  EXPECT_EQ(ld->loaded_blocks, 10u);
  ExpectBlockBytes(*cache, tokens, out, 10);
}

TEST(CacheTest, WriteBackMovesVictimsDown) {
  std::mutex mu;
  std::vector<KvEvent> events;
  auto cache = OpenCache({HostSpec(4, "hbm"), HostSpec(64, "dram")}, WriteMode::kWriteBack,
                         [&](const KvEvent& e) {
                           std::lock_guard<std::mutex> l(mu);
                           events.push_back(e);
                         });
  const uint64_t bb = cache->layout().bytes_per_block();
  auto tokens = Tokens(10 * kBt);
  Blocks b(*cache, tokens, 0, 10);
  ASSERT_TRUE(cache->Store(tokens, b.views).ok());
  cache->WaitForWrites();  // victims move down in the background
  CacheStats s = cache->stats();
  // The head stays in the first tier; the tail, which could not stay, went down.
  EXPECT_EQ(s.tiers[0].tier.used_bytes, 4 * bb);
  EXPECT_EQ(s.tiers[1].tier.puts, 6u);
  EXPECT_EQ(s.tiers[0].writebacks, 6u);
  // A second request evicts the first one's head from hbm: written back, not lost.
  auto t2 = Tokens(4 * kBt, 700);
  Blocks b2(*cache, t2, 0, 4);
  ASSERT_TRUE(cache->Store(t2, b2.views).ok());
  cache->WaitForWrites();
  s = cache->stats();
  EXPECT_EQ(s.tiers[0].writebacks, 10u);
  EXPECT_EQ(s.tiers[0].evictions, 4u);
  EXPECT_EQ(s.tiers[1].tier.puts, 10u);
  auto lk = cache->Lookup(tokens);
  ASSERT_EQ(lk->hit_blocks, 10u);
  EXPECT_EQ(lk->blocks_by_tier[1], 10u);
  Buffers out(*cache, 10);
  EXPECT_EQ(cache->Load(*lk, out.views)->loaded_blocks, 10u);
  ExpectBlockBytes(*cache, tokens, out, 10);
  cache->WaitForWrites();  // the promotion runs in the background
  // Events: numbered 1..n without gaps.
  std::sort(events.begin(), events.end(),
            [](const KvEvent& x, const KvEvent& y) { return x.seq < y.seq; });
  for (size_t i = 0; i < events.size(); ++i) EXPECT_EQ(events[i].seq, i + 1);
  int stored0 = 0, stored1 = 0, removed0 = 0;
  for (const auto& e : events) {
    if (e.type == KvEvent::Type::kStored)
      (e.tier == 0 ? stored0 : stored1)++;
    else if (e.tier == 0)
      ++removed0;
  }
  // hbm: 4 + 4 stored by the two requests, 4 promoted by the load; each eviction of 4
  // (by the second request, then by the promotion) wrote its victims back to dram.
  EXPECT_EQ(stored0, 4 + 4 + 4);
  EXPECT_EQ(removed0, 4 + 4);
  EXPECT_EQ(stored1, 6 + 4 + 4);
}

// Regression: moving a victim down could evict from the tier below, and both levels shared
// one scratch buffer, so the first victim was stored with the second victim's bytes.
TEST(CacheTest, WriteBackCascadeKeepsEachVictimsBytes) {
  auto cache = OpenCache({HostSpec(2, "hbm"), HostSpec(3, "dram"), HostSpec(64, "ssd")},
                         WriteMode::kWriteBack);
  std::vector<std::vector<TokenId>> reqs;
  for (uint32_t r = 0; r < 6; ++r) {
    reqs.push_back(Tokens(2 * kBt, 1000 * (r + 1)));
    Blocks b(*cache, reqs.back(), 0, 2);
    ASSERT_TRUE(cache->Store(reqs.back(), b.views).ok());
  }
  cache->WaitForWrites();
  EXPECT_GT(cache->stats().tiers[1].writebacks, 0u);  // the cascade happened
  for (const auto& t : reqs) {
    // Each Load promotes its blocks into hbm in the background, evicting others down the
    // cascade; a block between its erase and its write below is a miss by design (design.md),
    // so wait for the writer before each Lookup.
    cache->WaitForWrites();
    auto lk = cache->Lookup(t);
    ASSERT_EQ(lk->hit_blocks, 2u);
    Buffers out(*cache, 2);
    ASSERT_EQ(cache->Load(*lk, out.views)->loaded_blocks, 2u);
    ExpectBlockBytes(*cache, t, out, 2);
  }
}

TEST(CacheTest, PromotionBringsLowerTierBlocksUp) {
  auto cache = OpenCache({HostSpec(8, "hbm"), HostSpec(64, "dram")});
  auto a = Tokens(6 * kBt), bt = Tokens(6 * kBt, 500);
  Blocks ba(*cache, a, 0, 6), bb(*cache, bt, 0, 6);
  ASSERT_TRUE(cache->Store(a, ba.views).ok());
  cache->WaitForWrites();                        // a stays pinned in hbm until dram has it
  ASSERT_TRUE(cache->Store(bt, bb.views).ok());  // pushes most of a out of hbm
  cache->WaitForWrites();
  auto lk = cache->Lookup(a);
  ASSERT_EQ(lk->hit_blocks, 6u);
  ASSERT_GT(lk->blocks_by_tier[1], 0u);
  Buffers out(*cache, 6);
  ASSERT_EQ(cache->Load(*lk, out.views)->loaded_blocks, 6u);
  cache->WaitForWrites();  // the promotion runs in the background
  lk = cache->Lookup(a);
  EXPECT_EQ(lk->blocks_by_tier[0], 6u);  // promoted
}

TEST(CacheTest, CorruptLowerTierBlockIsNeverServed) {
  auto faulty = FaultyTier::Make(SmallLayout(kBt), 64 * SmallLayout(kBt).bytes_per_block(), "disk");
  auto cache = OpenCache({HostSpec(2, "dram"), InstanceSpec(faulty)});
  auto tokens = Tokens(6 * kBt);
  Blocks b(*cache, tokens, 0, 6);
  ASSERT_TRUE(cache->Store(tokens, b.views).ok());
  cache->WaitForWrites();
  auto lk = cache->Lookup(tokens);
  ASSERT_EQ(lk->hit_blocks, 6u);
  ASSERT_EQ(lk->blocks_by_tier[0], 2u);
  faulty->corrupt_reads = true;
  Buffers out(*cache, 6);
  auto ld = cache->Load(*lk, out.views);
  ASSERT_TRUE(ld.ok());
  EXPECT_EQ(ld->loaded_blocks, 2u);  // blocks 2.. failed verification: recompute them
  EXPECT_EQ(ld->block_status[2].code(), StatusCode::kCorruption);
  ExpectBlockBytes(*cache, tokens, out, 2);
  EXPECT_EQ(cache->stats().tiers[1].corruptions, 4u);
  lk = cache->Lookup(tokens);  // the bad copies are gone from the index
  EXPECT_EQ(lk->hit_blocks, 2u);
}

TEST(CacheTest, CorruptCopyFallsBackToAnotherTier) {
  auto faulty = FaultyTier::Make(SmallLayout(kBt), 64 * SmallLayout(kBt).bytes_per_block(), "ssd");
  auto cache = OpenCache({InstanceSpec(faulty), HostSpec(64, "dram")});
  auto tokens = Tokens(3 * kBt);
  Blocks b(*cache, tokens, 0, 3);
  ASSERT_TRUE(cache->Store(tokens, b.views).ok());
  cache->WaitForWrites();
  faulty->corrupt_reads = true;
  auto lk = cache->Lookup(tokens);
  Buffers out(*cache, 3);
  auto ld = cache->Load(*lk, out.views);
  EXPECT_EQ(ld->loaded_blocks, 3u);
  ExpectBlockBytes(*cache, tokens, out, 3);
}

TEST(CacheTest, UnavailableTierBecomesRecompute) {
  auto faulty =
      FaultyTier::Make(SmallLayout(kBt), 64 * SmallLayout(kBt).bytes_per_block(), "remote");
  auto cache = OpenCache({InstanceSpec(faulty)});
  auto tokens = Tokens(3 * kBt);
  Blocks b(*cache, tokens, 0, 3);
  ASSERT_TRUE(cache->Store(tokens, b.views).ok());
  faulty->fail_reads = true;
  auto lk = cache->Lookup(tokens);
  Buffers out(*cache, 3);
  auto ld = cache->Load(*lk, out.views);
  ASSERT_TRUE(ld.ok());
  EXPECT_EQ(ld->loaded_blocks, 0u);
  EXPECT_EQ(ld->block_status[0].code(), StatusCode::kUnavailable);
  faulty->fail_writes = true;
  auto t2 = Tokens(3 * kBt, 77);
  Blocks b2(*cache, t2, 0, 3);
  auto st = cache->Store(t2, b2.views);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->failed_blocks, 3u);
  EXPECT_EQ(st->first_error.code(), StatusCode::kUnavailable);
}

TEST(CacheTest, PinnedBlocksAreNotEvicted) {
  auto cache = OpenCache({HostSpec(4)});
  auto a = Tokens(4 * kBt);
  Blocks ba(*cache, a, 0, 4);
  ASSERT_TRUE(cache->Store(a, ba.views).ok());
  auto lk = cache->Lookup(a);  // pins all 4
  auto b = Tokens(2 * kBt, 900);
  Blocks bb(*cache, b, 0, 2);
  auto st = cache->Store(b, bb.views);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->failed_blocks, 2u);
  EXPECT_EQ(st->first_error.code(), StatusCode::kResourceExhausted);
  Buffers out(*cache, 4);
  EXPECT_EQ(cache->Load(*lk, out.views)->loaded_blocks, 4u);
  lk->pins.Release();
  st = cache->Store(b, bb.views);
  EXPECT_EQ(st->stored_blocks, 2u);
}

// A Store's copy into a cache-managed tier runs outside the tier's lock: while one Put is held
// in flight, a Lookup and a Load of that tier, and a Store of other blocks, still complete, and
// room reserved for the held Put is not handed out twice.
TEST(CacheTest, LookupsAndStoresProceedWhileAPutIsInFlight) {
  auto tier = FaultyTier::Make(SmallLayout(kBt), 6 * SmallLayout(kBt).bytes_per_block());
  auto cache = OpenCache({InstanceSpec(tier)});
  auto a = Tokens(3 * kBt, 100);
  Blocks ba(*cache, a, 0, 3);
  ASSERT_TRUE(cache->Store(a, ba.views).ok());

  std::promise<void> entered, release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<bool> hold{true};
  tier->on_put = [&] {
    if (hold.exchange(false)) {
      entered.set_value();
      released.wait();
    }
  };
  auto b = Tokens(2 * kBt, 200);
  Blocks bb(*cache, b, 0, 2);
  auto held = std::async(std::launch::async, [&] { return cache->Store(b, bb.views); });
  entered.get_future().wait();

  // Under the old lock these would wait for the held Put; a timeout fails instead of hanging.
  auto other = std::async(std::launch::async, [&] {
    auto lk = cache->Lookup(a);
    EXPECT_TRUE(lk.ok());
    EXPECT_EQ(lk->hit_blocks, 3u);
    Buffers out(*cache, 3);
    EXPECT_EQ(cache->Load(*lk, out.views)->loaded_blocks, 3u);
    ExpectBlockBytes(*cache, a, out, 3);
    lk->pins.Release();
    EXPECT_EQ(cache->Lookup(b)->hit_blocks, 0u);  // not published while its Put is held
    // 3 resident + 2 reserved leave room for one more block, not two.
    auto c = Tokens(2 * kBt, 300);
    Blocks bc(*cache, c, 0, 2);
    auto st = cache->Store(c, bc.views);
    EXPECT_TRUE(st.ok());
    EXPECT_EQ(st->stored_blocks, 2u);
    EXPECT_EQ(cache->Lookup(c)->hit_blocks, 2u);
  });
  const bool done = other.wait_for(std::chrono::seconds(30)) == std::future_status::ready;
  release.set_value();
  ASSERT_TRUE(done) << "a Lookup or Store waited on another Store's Put";
  other.get();
  auto st = held.get();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->stored_blocks, 2u);
  EXPECT_EQ(cache->Lookup(b)->hit_blocks, 2u);
  EXPECT_EQ(cache->Lookup(a)->hit_blocks, 2u);  // c's room came from a's tail
  EXPECT_EQ(cache->stats().tiers[0].resident_blocks, 6u);
  EXPECT_LE(tier->used_bytes(), tier->capacity_bytes());
}

TEST(CacheTest, AdmissionKeepsShortPrefixesOutOfALowerTier) {
  TierSpec low = HostSpec(64, "ssd");
  low.admission.min_prefix_tokens = 8 * kBt;
  auto cache = OpenCache({HostSpec(64, "dram"), low});
  auto short_req = Tokens(2 * kBt, 10), long_req = Tokens(8 * kBt, 20);
  Blocks bs(*cache, short_req, 0, 2), bl(*cache, long_req, 0, 8);
  ASSERT_TRUE(cache->Store(short_req, bs.views).ok());
  ASSERT_TRUE(cache->Store(long_req, bl.views).ok());
  cache->WaitForWrites();
  CacheStats s = cache->stats();
  EXPECT_EQ(s.tiers[1].tier.puts, 8u);
  EXPECT_EQ(s.tiers[1].rejected, 2u);
}

TEST(CacheTest, BadInputSaysWhatIsWrong) {
  auto cache = OpenCache({HostSpec(16)});
  auto tokens = Tokens(3 * kBt + 1);
  Blocks b(*cache, Tokens(8 * kBt), 0, 4);
  auto st = cache->Store(tokens, b.views);  // 4 blocks, 3 full blocks of tokens
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.status().message().find("only 3 full blocks"), std::string::npos)
      << st.status().message();
  std::vector<std::byte> tiny(3);
  std::vector<ConstBlock> wrong = {tiny};
  st = cache->Store(tokens, wrong);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.status().message().find("3 bytes"), std::string::npos);

  auto lk = cache->Lookup(tokens);
  Buffers out(*cache, 2);
  auto ld = cache->Load(*lk, out.views);  // nothing cached, 2 buffers
  ASSERT_FALSE(ld.ok());
  EXPECT_NE(ld.status().message().find("hit blocks"), std::string::npos);
}

TEST(CacheTest, InvalidOptionsNameTheKey) {
  auto open = [](CacheOptions o) { return Cache::Open(std::move(o)).status(); };
  CacheOptions o;
  o.layout = SmallLayout(kBt);
  EXPECT_NE(open(o).message().find("tiers"), std::string::npos);
  o.tiers = {HostSpec(4)};
  o.tiers[0].capacity_bytes = 0;
  EXPECT_NE(open(o).message().find("tiers[0].capacity_bytes"), std::string::npos);
  o.tiers = {HostSpec(4), HostSpec(4)};
  EXPECT_NE(open(o).message().find("tiers[1].name"), std::string::npos);
  o.tiers = {HostSpec(4)};
  o.tiers[0].eviction = "fifo-ish";
  EXPECT_NE(open(o).message().find("tiers[0].eviction"), std::string::npos);
  o.tiers = {HostSpec(4)};
  o.tiers[0].kind = "tape";
  Status s = open(o);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("unknown kind 'tape'"), std::string::npos);
  o.tiers = {HostSpec(4)};
  o.tiers[0].params["flavour"] = "x";
  EXPECT_NE(open(o).message().find("params.flavour: unknown host tier param"), std::string::npos);
  o.tiers = {HostSpec(4)};
  o.layout.head_dim = 0;
  EXPECT_NE(open(o).message().find("head_dim"), std::string::npos);
}

TEST(CacheTest, PrometheusTextHasPerTierSeries) {
  auto cache = OpenCache({HostSpec(8, "dram")});
  auto tokens = Tokens(2 * kBt);
  Blocks b(*cache, tokens, 0, 2);
  ASSERT_TRUE(cache->Store(tokens, b.views).ok());
  auto lk = cache->Lookup(tokens);
  Buffers out(*cache, 2);
  ASSERT_TRUE(cache->Load(*lk, out.views).ok());
  std::string text = cache->PrometheusText();
  EXPECT_NE(text.find("# TYPE kvtier_tier_hit_blocks_total counter"), std::string::npos);
  EXPECT_NE(text.find("kvtier_tier_hit_blocks_total{tier=\"dram\"} 2"), std::string::npos);
  EXPECT_NE(text.find("kvtier_tier_get_latency_seconds_bucket{tier=\"dram\",le=\"+Inf\"} 1"),
            std::string::npos);
  EXPECT_NE(text.find("kvtier_lookups_total 1"), std::string::npos);
}

TEST(CacheTest, DeclinedBlocksAreCountedPerTierAndExported) {
  auto cache = OpenCache({HostSpec(8, "dram"), HostSpec(8, "slow")});
  const uint32_t declined[] = {0, 3, 7};  // a third tier the cache does not have: ignored
  cache->NoteDeclined(declined);
  cache->NoteDeclined(std::span<const uint32_t>(declined + 1, 1));
  CacheStats s = cache->stats();
  EXPECT_EQ(s.tiers[0].declined_blocks, 3u);
  EXPECT_EQ(s.tiers[1].declined_blocks, 3u);
  EXPECT_NE(cache->PrometheusText().find("kvtier_tier_declined_blocks_total{tier=\"slow\"} 3"),
            std::string::npos);
}

}  // namespace
}  // namespace kvtier
