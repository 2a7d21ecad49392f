// The engine wired to a Cache: a turn whose prefix comes from the host tier, the pool, a split
// plan or a write-back gives next-token logits identical (memcmp) to a full recompute of the
// same tokens; failed loads become recompute; the planner's choice is what runs.
#include "engine/engine.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "kvtier/cache.h"
#include "kvtier/planner.h"
#include "testing/redis_harness.h"
#include "testing/test_util.h"

namespace kvtier::engine {
namespace {

constexpr uint32_t kBlockTokens = 16;

EngineOptions Options(uint64_t pool_blocks = 64, bool write_back = false) {
  EngineOptions o;
  o.model = "tiny";
  o.seed = 11;
  o.block_tokens = kBlockTokens;
  o.pool_blocks = pool_blocks;
  o.threads = 1;
  o.write_back = write_back;
  return o;
}

std::unique_ptr<Cache> HostCache(const Engine& e, uint64_t blocks = 256,
                                 std::shared_ptr<Tier> instance = nullptr) {
  CacheOptions co;
  co.layout = e.layout();
  co.model_id = "tiny";
  TierSpec host;
  host.kind = "host";
  host.capacity_bytes = blocks * e.layout().bytes_per_block();
  host.instance = std::move(instance);
  if (host.instance) host.name = host.instance->name();
  co.tiers.push_back(host);
  Result<std::unique_ptr<Cache>> c = Cache::Open(co);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return std::move(c).value();
}

std::vector<TokenId> Tokens(uint32_t n, uint32_t salt) {
  std::vector<TokenId> t(n);
  for (uint32_t i = 0; i < n; ++i) t[i] = (i * 2654435761u + salt * 97u) % 512;
  return t;
}

std::vector<TokenId> Extend(std::vector<TokenId> prompt, const TurnResult& r, uint32_t more,
                            uint32_t salt) {
  prompt.insert(prompt.end(), r.generated.begin(), r.generated.end());
  auto add = Tokens(more, salt);
  prompt.insert(prompt.end(), add.begin(), add.end());
  return prompt;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class EngineWithCache : public ::testing::Test {
 protected:
  void SetUp() override {
    engine_ = Engine::Create(Options()).value();
    reference_ = Engine::CreateSharing(*engine_, Options()).value();
  }
  // Full recompute of prompt on the reference engine (no pool reuse, no cache).
  TurnResult Recompute(const std::vector<TokenId>& prompt) {
    TurnOptions o;
    o.use_pool = false;
    o.use_cache = false;
    Result<TurnResult> r = reference_->RunTurn(prompt, o);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->computed_tokens, prompt.size());
    return std::move(r).value();
  }

  std::unique_ptr<Engine> engine_, reference_;
};

TEST_F(EngineWithCache, HostHitIsBitExactWithFullRecompute) {
  for (int threads : {1, 2}) {
    SetBlasThreads(threads);
    auto cache = HostCache(*engine_);
    ASSERT_TRUE(engine_->AttachCache(cache.get()).ok());
    auto p1 = Tokens(100, threads);
    TurnResult t1 = engine_->RunTurn(p1).value();
    EXPECT_EQ(t1.computed_tokens, 100u);
    EXPECT_EQ(t1.stored_blocks, 6u);  // 6 full blocks of 16
    EXPECT_EQ(t1.bytes_stored, 6 * engine_->layout().bytes_per_block());
    engine_->pool().DropUnreferenced();  // the "HBM" forgot them: host must serve

    auto p2 = Extend(p1, t1, 37, 5);
    TurnResult t2 = engine_->RunTurn(p2).value();
    EXPECT_EQ(t2.pool_hit_blocks, 0u);
    EXPECT_EQ(t2.tier_hit_blocks, 6u);
    EXPECT_EQ(t2.loaded_blocks, 6u);
    EXPECT_EQ(t2.loaded_by_tier[0], 6u);
    EXPECT_EQ(t2.bytes_loaded, 6 * engine_->layout().bytes_per_block());
    EXPECT_EQ(t2.computed_tokens, p2.size() - 6 * kBlockTokens);
    TurnResult ref = Recompute(p2);
    EXPECT_TRUE(SameBits(t2.logits, ref.logits)) << "threads " << threads;
    EXPECT_EQ(t2.generated, ref.generated);
    ASSERT_TRUE(engine_->AttachCache(nullptr).ok());
    engine_->pool().DropUnreferenced();
  }
  SetBlasThreads(1);
}

// A Cache over one tier of `kind` (64 MiB) with `params`.
std::unique_ptr<Cache> SingleTierCache(const Engine& e, const std::string& kind,
                                       std::map<std::string, std::string> params) {
  CacheOptions co;
  co.layout = e.layout();
  co.model_id = "tiny";
  TierSpec spec;
  spec.kind = kind;
  spec.capacity_bytes = 64ull << 20;
  spec.params = std::move(params);
  co.tiers.push_back(spec);
  Result<std::unique_ptr<Cache>> c = Cache::Open(co);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(c).value() : nullptr;
}

// Each tier adds itself here: the disk tier (segment files) serves the prefix.
TEST_F(EngineWithCache, DiskHitIsBitExactWithFullRecompute) {
  testing::TempDir dir;
  auto cache = SingleTierCache(*engine_, "disk", {{"path", dir.path()}});
  ASSERT_NE(cache, nullptr);
  ASSERT_TRUE(engine_->AttachCache(cache.get()).ok());
  auto p1 = Tokens(100, 21);
  TurnResult t1 = engine_->RunTurn(p1).value();
  EXPECT_EQ(t1.stored_blocks, 6u);
  engine_->pool().DropUnreferenced();
  auto p2 = Extend(p1, t1, 29, 22);
  TurnResult t2 = engine_->RunTurn(p2).value();
  EXPECT_EQ(t2.loaded_blocks, 6u);
  EXPECT_EQ(t2.loaded_by_tier[0], 6u);
  EXPECT_TRUE(SameBits(t2.logits, Recompute(p2).logits));
  ASSERT_TRUE(engine_->AttachCache(nullptr).ok());
}

// The remote tier (a real redis-server) serves the prefix to a second Cache that never saw the
// first turn, as a replica resuming another replica's session would.
TEST_F(EngineWithCache, RemoteHitFromAnotherCacheIsBitExact) {
  std::string reason = testing::RedisMissingReason();
  if (!reason.empty()) GTEST_SKIP() << reason;
  Result<std::unique_ptr<testing::RedisServer>> server = testing::RedisServer::Start({});
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  auto remote_cache = [&] {
    return SingleTierCache(*engine_, "remote", {{"url", (*server)->url()}});
  };
  auto writer = remote_cache();
  ASSERT_TRUE(engine_->AttachCache(writer.get()).ok());
  auto p1 = Tokens(100, 31);
  TurnResult t1 = engine_->RunTurn(p1).value();
  EXPECT_EQ(t1.stored_blocks, 6u);
  ASSERT_TRUE(engine_->AttachCache(nullptr).ok());
  engine_->pool().DropUnreferenced();

  auto reader = remote_cache();  // an empty index: only Redis knows the blocks
  ASSERT_TRUE(engine_->AttachCache(reader.get()).ok());
  auto p2 = Extend(p1, t1, 23, 32);
  TurnResult t2 = engine_->RunTurn(p2).value();
  EXPECT_EQ(t2.pool_hit_blocks, 0u);
  EXPECT_EQ(t2.loaded_blocks, 6u);
  EXPECT_EQ(t2.loaded_by_tier[0], 6u);
  EXPECT_EQ(t2.computed_tokens, p2.size() - 6 * kBlockTokens);
  TurnResult ref = Recompute(p2);
  EXPECT_TRUE(SameBits(t2.logits, ref.logits));
  EXPECT_EQ(t2.generated, ref.generated);
  ASSERT_TRUE(engine_->AttachCache(nullptr).ok());
}

// A resumed turn loaded layer by layer under the compute gives the same bits as the synchronous
// load and as a full recompute, from every tier kind (the remote one delivers blocks whole).
void ExpectLayerwiseMatches(Engine* engine, Cache* cache, const std::vector<TokenId>& p1,
                            const std::vector<TokenId>& p2, const TurnResult& ref) {
  ASSERT_TRUE(engine->AttachCache(cache).ok());
  TurnOptions store;
  store.mode = ReuseMode::kRecompute;
  ASSERT_TRUE(engine->RunTurn(p1, store).ok());
  cache->WaitForWrites();
  for (bool layerwise : {false, true}) {
    engine->pool().DropUnreferenced();
    TurnOptions o;
    o.mode = ReuseMode::kLoad;
    o.layerwise = layerwise;
    TurnResult t = engine->RunTurn(p2, o).value();
    cache->WaitForWrites();
    // The synchronous turn stores p2's blocks 6..8 too: the layer-wise one loads all 9.
    const uint32_t want = layerwise ? 9 : 6;
    EXPECT_EQ(t.loaded_blocks, want) << "layerwise " << layerwise;
    EXPECT_EQ(t.load_failed_blocks, 0u);
    EXPECT_EQ(t.layerwise_fallbacks, 0u);
    EXPECT_EQ(t.computed_tokens, p2.size() - want * kBlockTokens);
    EXPECT_TRUE(SameBits(t.logits, ref.logits)) << "layerwise " << layerwise;
    EXPECT_EQ(t.generated, ref.generated);
  }
  ASSERT_TRUE(engine->AttachCache(nullptr).ok());
  engine->pool().DropUnreferenced();
}

TEST_F(EngineWithCache, LayerwiseLoadIsBitExactFromEveryTier) {
  auto p1 = Tokens(100, 41);
  auto p2 = p1;
  auto more = Tokens(45, 42);
  p2.insert(p2.end(), more.begin(), more.end());
  TurnResult ref = Recompute(p2);
  {
    auto cache = HostCache(*engine_);
    ExpectLayerwiseMatches(engine_.get(), cache.get(), p1, p2, ref);
  }
  {
    testing::TempDir dir;
    auto cache = SingleTierCache(*engine_, "disk", {{"path", dir.path()}});
    ASSERT_NE(cache, nullptr);
    ExpectLayerwiseMatches(engine_.get(), cache.get(), p1, p2, ref);
  }
  std::string reason = testing::RedisMissingReason();
  if (!reason.empty()) GTEST_SKIP() << "remote part: " << reason;
  Result<std::unique_ptr<testing::RedisServer>> server = testing::RedisServer::Start({});
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  auto cache = SingleTierCache(*engine_, "remote", {{"url", (*server)->url()}});
  ASSERT_NE(cache, nullptr);
  ExpectLayerwiseMatches(engine_.get(), cache.get(), p1, p2, ref);
}

// A block that fails under a layer-wise pass is recomputed, with every chunk that attended to
// it: the logits still match a full recompute.
TEST_F(EngineWithCache, LayerwiseLoadThatFailsIsRecomputed) {
  auto host = HostCache(*engine_);
  auto p1 = Tokens(100, 51);
  auto p2 = p1;
  auto more = Tokens(30, 52);
  p2.insert(p2.end(), more.begin(), more.end());
  ASSERT_TRUE(engine_->AttachCache(host.get()).ok());
  ASSERT_TRUE(engine_->RunTurn(p1).ok());
  engine_->pool().DropUnreferenced();
  // Lookup pins, then the tier loses block 2 behind the Cache's back: its slice read misses.
  std::vector<BlockKey> keys;
  HashPrefix(host->Root(), kBlockTokens, p1, &keys);
  const BlockKey gone[1] = {keys[2]};
  ASSERT_TRUE(host->tier(0).Erase(gone).ok());
  TurnOptions o;
  o.mode = ReuseMode::kLoad;
  o.layerwise = true;
  TurnResult t = engine_->RunTurn(p2, o).value();
  EXPECT_EQ(t.tier_hit_blocks, 6u);
  EXPECT_EQ(t.loaded_blocks, 2u);  // the leading run before the missing block
  EXPECT_EQ(t.load_failed_blocks, 4u);
  EXPECT_EQ(t.layerwise_fallbacks, 1u);
  EXPECT_EQ(t.computed_tokens, p2.size() - 2 * kBlockTokens);
  EXPECT_TRUE(SameBits(t.logits, Recompute(p2).logits));
  ASSERT_TRUE(engine_->AttachCache(nullptr).ok());
}

TEST_F(EngineWithCache, PoolHitIsBitExactAndTouchesNoTier) {
  auto cache = HostCache(*engine_);
  ASSERT_TRUE(engine_->AttachCache(cache.get()).ok());
  auto p1 = Tokens(64, 1);  // block-aligned: its last block is full, computed and stored
  TurnResult t1 = engine_->RunTurn(p1).value();
  EXPECT_EQ(t1.stored_blocks, 4u);
  auto p2 = Extend(p1, t1, 20, 2);
  TurnResult t2 = engine_->RunTurn(p2).value();
  EXPECT_EQ(t2.pool_hit_blocks, 4u);
  EXPECT_EQ(t2.loaded_blocks, 0u);
  EXPECT_EQ(t2.computed_tokens, p2.size() - 64);
  EXPECT_TRUE(SameBits(t2.logits, Recompute(p2).logits));
}

TEST_F(EngineWithCache, SplitAndRecomputeModesAreBitExact) {
  auto cache = HostCache(*engine_);
  ASSERT_TRUE(engine_->AttachCache(cache.get()).ok());
  auto p1 = Tokens(130, 3);
  TurnResult t1 = engine_->RunTurn(p1).value();
  auto p2 = Extend(p1, t1, 10, 4);
  TurnResult ref = Recompute(p2);
  for (ReuseMode mode : {ReuseMode::kSplit, ReuseMode::kRecompute, ReuseMode::kLoad}) {
    engine_->pool().DropUnreferenced();
    TurnOptions o;
    o.mode = mode;
    o.split_blocks = 3;
    TurnResult t = engine_->RunTurn(p2, o).value();
    EXPECT_EQ(t.tier_hit_blocks, 8u);
    const uint32_t want_loaded = mode == ReuseMode::kSplit ? 5 : mode == ReuseMode::kLoad ? 8 : 0;
    EXPECT_EQ(t.loaded_blocks, want_loaded);
    EXPECT_EQ(t.computed_tokens, p2.size() - want_loaded * kBlockTokens);
    EXPECT_TRUE(SameBits(t.logits, ref.logits)) << "mode " << static_cast<int>(mode);
  }
}

TEST_F(EngineWithCache, WriteBackStoresBlocksWhenThePoolEvictsThem) {
  auto engine =
      Engine::CreateSharing(*engine_, Options(/*pool_blocks=*/12, /*write_back=*/true)).value();
  auto cache = HostCache(*engine);
  ASSERT_TRUE(engine->AttachCache(cache.get()).ok());
  auto p1 = Tokens(100, 7);
  TurnResult t1 = engine->RunTurn(p1).value();
  EXPECT_EQ(t1.stored_blocks, 0u);  // nothing written yet
  EXPECT_EQ(cache->stats().stored_blocks, 0u);
  // 150 tokens need 10 of the 12 blocks; 6 are free, so 4 of p1's 6 are evicted and stored.
  TurnResult other = engine->RunTurn(Tokens(150, 8)).value();
  EXPECT_EQ(other.stored_blocks, 0u);
  EXPECT_EQ(engine->pool().stats().evictions, 4u);
  EXPECT_EQ(cache->stats().stored_blocks, 4u);
  engine->pool().DropUnreferenced();  // writes back the other prompt's blocks too
  auto p2 = Extend(p1, t1, 25, 9);
  TurnResult t2 = engine->RunTurn(p2).value();
  EXPECT_EQ(t2.pool_hit_blocks, 0u);
  EXPECT_EQ(t2.loaded_blocks, 6u);
  EXPECT_TRUE(SameBits(t2.logits, Recompute(p2).logits));
}

// A tier that stores blocks in a map and can be told to fail every Get.
class FlakyTier final : public Tier {
 public:
  FlakyTier(const KvLayout& layout, uint64_t capacity)
      : Tier("flaky", TierKind::kHost, layout, capacity) {}
  bool fail_gets = false;

 protected:
  void PutImpl(std::span<const BlockKey> keys, std::span<const ConstBlock> blocks,
               std::span<Status> results) override {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < keys.size(); ++i) {
      map_[keys[i]].assign(blocks[i].begin(), blocks[i].end());
      results[i] = Status::Ok();
    }
  }
  void GetImpl(std::span<const BlockKey> keys, std::span<const MutableBlock> out,
               std::span<Status> results) override {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < keys.size(); ++i) {
      auto it = map_.find(keys[i]);
      if (fail_gets) {
        results[i] = Status::Unavailable("flaky: injected failure");
      } else if (it == map_.end()) {
        results[i] = Status::NotFound("flaky: absent");
      } else {
        std::memcpy(out[i].data(), it->second.data(), out[i].size());
        results[i] = Status::Ok();
      }
    }
  }
  Status ExistsImpl(std::span<const BlockKey> keys, std::span<bool> out) override {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < keys.size(); ++i) out[i] = map_.count(keys[i]) != 0;
    return Status::Ok();
  }
  Status EraseImpl(std::span<const BlockKey> keys) override {
    std::lock_guard<std::mutex> lock(mu_);
    for (const BlockKey& k : keys) map_.erase(k);
    return Status::Ok();
  }
  uint64_t UsedBytesImpl() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return map_.size() * block_bytes();
  }
  TierCapabilities CapabilitiesImpl() const override { return {}; }

 private:
  mutable std::mutex mu_;
  std::map<BlockKey, std::vector<std::byte>> map_;
};

TEST_F(EngineWithCache, FailedLoadsAreRecomputedAndStillBitExact) {
  auto flaky =
      std::make_shared<FlakyTier>(engine_->layout(), 64 * engine_->layout().bytes_per_block());
  auto cache = HostCache(*engine_, 64, flaky);
  ASSERT_TRUE(engine_->AttachCache(cache.get()).ok());
  auto p1 = Tokens(80, 10);
  TurnResult t1 = engine_->RunTurn(p1).value();
  engine_->pool().DropUnreferenced();
  flaky->fail_gets = true;
  auto p2 = Extend(p1, t1, 30, 11);
  TurnResult t2 = engine_->RunTurn(p2).value();
  EXPECT_EQ(t2.tier_hit_blocks, 5u);
  EXPECT_EQ(t2.loaded_blocks, 0u);
  EXPECT_EQ(t2.load_failed_blocks, 5u);
  EXPECT_EQ(t2.computed_tokens, p2.size());
  EXPECT_TRUE(SameBits(t2.logits, Recompute(p2).logits));
}

TEST_F(EngineWithCache, PlannerDecidesWhatRuns) {
  auto cache = HostCache(*engine_);
  ASSERT_TRUE(engine_->AttachCache(cache.get()).ok());
  CostProfile slow;
  slow.block_tokens = kBlockTokens;
  slow.block_bytes = engine_->layout().bytes_per_block();
  slow.prefill = {0, 1e-5, 0};
  slow.tiers.push_back({"host", 1.0, 1e3});  // a second per load: never worth it
  CostProfile fast = slow;
  fast.tiers[0] = {"host", 0, 1e12};
  auto p1 = Tokens(90, 12);
  TurnResult t1 = engine_->RunTurn(p1).value();
  auto p2 = Extend(p1, t1, 12, 13);
  TurnResult ref = Recompute(p2);
  for (const CostProfile* profile : {&slow, &fast}) {
    engine_->SetPlanner(std::make_shared<const Planner>(*profile));
    engine_->pool().DropUnreferenced();
    TurnResult t = engine_->RunTurn(p2).value();
    ASSERT_TRUE(t.planned);
    if (profile == &slow) {
      EXPECT_EQ(t.plan.choice, PlanChoice::kRecompute);
      EXPECT_EQ(t.loaded_blocks, 0u);
    } else {
      EXPECT_EQ(t.plan.choice, PlanChoice::kLoad);
      EXPECT_EQ(t.loaded_blocks, 6u);  // 106 tokens: 6 full blocks, the 7th holds the last
    }
    EXPECT_TRUE(SameBits(t.logits, ref.logits));
  }
}

TEST_F(EngineWithCache, BadTurnsFailCleanly) {
  EXPECT_EQ(engine_->RunTurn({}).status().code(), StatusCode::kInvalidArgument);
  std::vector<TokenId> bad = {1, 2, 512};
  Status st = engine_->RunTurn(bad).status();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("512"), std::string::npos) << st.message();
  auto tight = Engine::CreateSharing(*engine_, Options(/*pool_blocks=*/2)).value();
  EXPECT_EQ(tight->RunTurn(Tokens(100, 1)).status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(tight->pool().stats().in_use, 0u);  // a failed turn gives its blocks back
  EngineOptions o = Options();
  o.model = "nope";
  EXPECT_EQ(Engine::Create(o).status().code(), StatusCode::kInvalidArgument);
}

// Under a ulimit -v too small for the model the engine hung mid-prefill (OpenBLAS retrying an
// allocation for ever) or aborted on std::bad_alloc building the weights. Now Create refuses,
// naming the limit. Runs in a child, which an alarm kills if it hangs.
TEST(EngineLimits, AddressSpaceTooSmallForTheModelIsRefusedAtCreate) {
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::alarm(20);
    std::FILE* f = std::fopen("/proc/self/statm", "r");
    unsigned long long pages = 0;
    if (f == nullptr || std::fscanf(f, "%llu", &pages) != 1) _exit(10);
    std::fclose(f);
    rlimit lim{};
    ::getrlimit(RLIMIT_AS, &lim);
    // 100 MiB more than the process maps now: 'small' needs about 300 MiB of weights.
    lim.rlim_cur = pages * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE)) + (100ull << 20);
    if (::setrlimit(RLIMIT_AS, &lim) != 0) _exit(11);
    EngineOptions o = Options();
    o.model = "small";
    Result<std::unique_ptr<Engine>> e = Engine::Create(o);
    if (e.ok()) _exit(12);
    if (e.status().code() != StatusCode::kResourceExhausted) _exit(13);
    if (e.status().message().find("ulimit -v") == std::string::npos) _exit(14);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0) << "check failed";
}

}  // namespace
}  // namespace kvtier::engine
