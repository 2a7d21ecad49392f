// 8 threads doing random Store / Lookup / Load / WaitForWrites with eviction over three tiers, one
// of which corrupts reads at random (and reads slices, for layer-wise loads that run to the end,
// are cancelled, time out or are destroyed in flight), while the background writer moves blocks
// down (small queues make Stores wait for it; the Cache is destroyed with writes still queued).
// Every block's bytes are a function of its key, so the model of what a Load must return is exact:
// any torn, stale or misplaced block fails the test, and a corrupt one must never be served.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "kvtier/cache.h"
#include "testing/test_util.h"

namespace kvtier {
namespace {

using testing::FaultyTier;
using testing::FillBlock;
using testing::SmallLayout;

constexpr uint32_t kBt = 4;

struct StressParams {
  WriteMode mode;
  const char* eviction;
  uint32_t queue_blocks = 256;  // CacheOptions::write_queue_blocks; 0 = synchronous
};

class CacheStressTest : public ::testing::TestWithParam<StressParams> {};

// Loads lk's hits into out one of four ways, picked by `how`: Load; a layer-wise load waited
// through; one cancelled after its first layer; one destroyed in flight after a zero timeout.
// Returns what counts as loaded (0 for a load destroyed without Finish).
Result<LoadResult> LoadSomeWay(Cache& cache, const LookupResult& lk, std::span<MutableBlock> out,
                               uint32_t how) {
  if (how == 0 || out.empty()) return cache.Load(lk, out);
  const auto patience = std::chrono::seconds(30);
  KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<LayerwiseLoad> load, cache.LoadLayerwise(lk, 0, out));
  if (how == 1) {
    for (uint32_t l = 0; l < load->num_layers(); ++l) {
      Status st = load->WaitLayer(l, patience);
      if (!st.ok()) return st;
    }
  } else if (how == 2) {
    (void)load->WaitLayer(0, patience);
    load->Cancel();
  } else {
    Status st = load->WaitLayer(load->num_layers() - 1, std::chrono::milliseconds(0));
    if (!st.ok() && st.message().find("timed out") == std::string::npos) return st;
    load.reset();  // in flight, maybe: no byte may land after this
    LoadResult none;
    none.block_status.assign(out.size(), Status::Unavailable("released"));
    return none;
  }
  return load->Finish(patience);
}

// The workload: 8 threads, every Load checked against the model; `faulty` (when given)
// corrupts its reads at random meanwhile. Returns the blocks loaded.
uint64_t RunWorkload(Cache& cache, uint64_t bb, FaultyTier* faulty) {
  const int kThreads = 8;
  const int kOps = 1500;
  std::atomic<uint64_t> loaded{0}, hits{0}, corrupt_seen{0};
  std::atomic<bool> failed{false};
  std::atomic<bool> done_flipping{false};
  std::thread flipper([&] {
    if (faulty == nullptr) return;
    std::mt19937 rng(99);
    while (!done_flipping) {
      faulty->corrupt_reads = (rng() % 4) == 0;
      std::this_thread::yield();
    }
    faulty->corrupt_reads = false;
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(1000 + t);
      for (int op = 0; op < kOps && !failed; ++op) {
        // 12 "sessions" whose prompts share a prefix and grow.
        const uint32_t session = rng() % 12;
        const size_t blocks = 1 + rng() % 20;
        std::vector<TokenId> tokens(blocks * kBt);
        for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = session * 100000 + i;
        std::vector<BlockKey> keys;
        HashPrefix(cache.Root(), kBt, tokens, &keys);
        if (rng() % 50 == 0) {
          cache.WaitForWrites();
        } else if (rng() % 2) {
          std::vector<std::vector<std::byte>> data(blocks, std::vector<std::byte>(bb));
          std::vector<ConstBlock> views;
          for (size_t i = 0; i < blocks; ++i) {
            FillBlock(data[i], keys[i].lo);
            views.emplace_back(data[i]);
          }
          auto st = cache.StoreKeys(keys, views);
          if (!st.ok()) failed = true;
        } else {
          auto lk = cache.LookupKeys(keys);
          if (!lk.ok()) {
            failed = true;
            break;
          }
          hits += lk->hit_blocks;
          std::vector<std::vector<std::byte>> out(lk->hit_blocks, std::vector<std::byte>(bb));
          std::vector<MutableBlock> views(out.begin(), out.end());
          auto ld = LoadSomeWay(cache, *lk, views, static_cast<uint32_t>(rng() % 4));
          if (!ld.ok() || ld->loaded_blocks > lk->hit_blocks) {
            ADD_FAILURE() << "thread " << t << " op " << op << ": "
                          << (ld.ok() ? "loaded more than hit" : ld.status().ToString());
            failed = true;
            break;
          }
          std::vector<std::byte> want(bb);
          for (uint32_t i = 0; i < ld->loaded_blocks; ++i) {
            FillBlock(want, keys[i].lo);
            if (out[i] != want) {
              ADD_FAILURE() << "thread " << t << " op " << op << ": block " << i
                            << " loaded wrong bytes";
              failed = true;
              break;
            }
          }
          for (const Status& s : ld->block_status)
            corrupt_seen += s.code() == StatusCode::kCorruption;
          loaded += ld->loaded_blocks;
        }
        for (int i = 0; i < cache.num_tiers(); ++i) {
          if (cache.tier(i).used_bytes() > cache.tier(i).capacity_bytes()) {
            ADD_FAILURE() << "tier " << i << " over capacity";
            failed = true;
          }
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  done_flipping = true;
  flipper.join();
  EXPECT_FALSE(failed);
  std::printf("hit blocks %llu, loaded %llu, corrupt reads caught %llu\n",
              (unsigned long long)hits.load(), (unsigned long long)loaded.load(),
              (unsigned long long)corrupt_seen.load());
  return loaded.load();
}

TEST_P(CacheStressTest, EveryLoadMatchesTheModel) {
  const KvLayout layout = SmallLayout(kBt);
  const uint64_t bb = layout.bytes_per_block();
  auto disk = FaultyTier::Make(layout, 400 * bb, "disk");
  disk->slices = true;
  CacheOptions o;
  o.layout = layout;
  o.write_mode = GetParam().mode;
  o.write_queue_blocks = GetParam().queue_blocks;
  TierSpec hbm, dram;
  hbm.kind = "emulated_device";
  hbm.name = "hbm";
  hbm.capacity_bytes = 24 * bb;
  hbm.eviction = GetParam().eviction;
  dram.kind = "host";
  dram.name = "dram";
  dram.capacity_bytes = 96 * bb;
  dram.threads = 2;
  dram.eviction = GetParam().eviction;
  TierSpec low;
  low.instance = disk;
  o.tiers = {hbm, dram, low};
  auto cache = std::move(Cache::Open(o)).value();

  const uint64_t loaded = RunWorkload(*cache, bb, disk.get());
  CacheStats s = cache->stats();
  EXPECT_GT(loaded, 0u);
  EXPECT_GT(s.tiers[0].evictions, 0u);
}

// KV events from 4 threads storing and evicting the same 16 blocks of a 6-block tier: delivered
// in any order, but numbered in the order the index changed, so per block they alternate
// stored / removed, the numbers run 1..n without a gap, and replaying them gives the index.
TEST(CacheStressEventsTest, EventNumbersFollowTheIndex) {
  const KvLayout layout = SmallLayout(kBt);
  const uint64_t bb = layout.bytes_per_block();
  std::mutex mu;
  std::vector<KvEvent> events;
  CacheOptions o;
  o.layout = layout;
  TierSpec dram;
  dram.kind = "host";
  dram.capacity_bytes = 6 * bb;
  o.tiers = {dram};
  o.on_event = [&](const KvEvent& e) {
    std::lock_guard<std::mutex> l(mu);
    events.push_back(e);
  };
  auto cache = std::move(Cache::Open(o)).value();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(77 + t);
      std::vector<std::byte> data(bb);
      for (int op = 0; op < 2000; ++op) {
        // One-block requests of 16 distinct sessions: 16 keys fight over 6 slots.
        std::vector<TokenId> tokens(kBt, static_cast<TokenId>(rng() % 16));
        std::vector<BlockKey> keys;
        HashPrefix(cache->Root(), kBt, tokens, &keys);
        FillBlock(data, keys[0].lo);
        const ConstBlock view(data);
        ASSERT_TRUE(cache->StoreKeys(keys, std::span(&view, 1)).ok());
      }
    });
  }
  for (auto& th : threads) th.join();
  cache->WaitForWrites();
  std::sort(events.begin(), events.end(),
            [](const KvEvent& x, const KvEvent& y) { return x.seq < y.seq; });
  std::map<BlockKey, bool> resident;
  for (size_t i = 0; i < events.size(); ++i) {
    ASSERT_EQ(events[i].seq, i + 1) << "a gap or a repeat";
    const bool stored = events[i].type == KvEvent::Type::kStored;
    bool& r = resident[events[i].key];
    ASSERT_NE(r, stored) << "seq " << events[i].seq << ": " << (stored ? "stored" : "removed")
                         << " twice in a row for one block";
    r = stored;
  }
  EXPECT_GT(events.size(), 100u);
  for (const auto& [key, r] : resident) {
    auto lk = cache->LookupKeys(std::span(&key, 1));
    ASSERT_TRUE(lk.ok());
    EXPECT_EQ(lk->hit_blocks == 1, r) << key.ToHex();
  }
}

// A real disk tier at the bottom: it evicts whole segments itself, and its Puts run outside the
// Cache's tier lock, concurrently from all threads.
TEST(CacheStressDiskTest, SelfManagedDiskTierUnderConcurrentStores) {
  const KvLayout layout = SmallLayout(kBt);
  const uint64_t bb = layout.bytes_per_block();
  testing::TempDir dir;
  CacheOptions o;
  o.layout = layout;
  TierSpec dram, disk;
  dram.kind = "host";
  dram.capacity_bytes = 48 * bb;
  disk.kind = "disk";
  disk.capacity_bytes = 1 << 20;  // ~120 records of 8 KiB: segments are evicted
  disk.params = {{"path", dir.path()}, {"segment_bytes", "256KiB"}};
  o.tiers = {dram, disk};
  auto cache = std::move(Cache::Open(o)).value();
  EXPECT_GT(RunWorkload(*cache, bb, nullptr), 0u);
  CacheStats s = cache->stats();
  EXPECT_GT(s.tiers[1].tier.puts, 0u);
  EXPECT_GT(s.tiers[1].hit_blocks, 0u);  // the disk served loads
  EXPECT_LE(cache->tier(1).used_bytes(), cache->tier(1).capacity_bytes());
}

INSTANTIATE_TEST_SUITE_P(Modes, CacheStressTest,
                         ::testing::Values(StressParams{WriteMode::kWriteThrough, "lru"},
                                           StressParams{WriteMode::kWriteBack, "lru"},
                                           StressParams{WriteMode::kWriteThrough, "s3fifo"},
                                           StressParams{WriteMode::kWriteBack, "arc"},
                                           StressParams{WriteMode::kWriteThrough, "lru", 4},
                                           StressParams{WriteMode::kWriteBack, "lru", 4},
                                           StressParams{WriteMode::kWriteThrough, "lru", 0},
                                           StressParams{WriteMode::kWriteBack, "lru", 0}),
                         [](const auto& param_info) {
                           const StressParams& p = param_info.param;
                           std::string queue = p.queue_blocks == 256 ? ""
                                               : p.queue_blocks == 0
                                                   ? "_Sync"
                                                   : "_Queue" + std::to_string(p.queue_blocks);
                           return std::string(p.mode == WriteMode::kWriteBack ? "WriteBack_"
                                                                              : "WriteThrough_") +
                                  p.eviction + queue;
                         });

}  // namespace
}  // namespace kvtier
