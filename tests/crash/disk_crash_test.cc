// The disk tier's kill -9 test: a forked writer puts (and sometimes erases) blocks and appends
// the id of every block the tier says is durable to a log; the parent SIGKILLs it at a random
// point, reopens the directory and checks that
//   - every block the index serves has exactly the bytes that were written (0 corrupt served),
//   - every block logged durable before the kill (and not being erased) is still there.
// Repeated >= 100 times (KVTIER_CRASH_KILLS overrides), cycling the sync policies.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "testing/test_util.h"
#include "tiers/disk/disk_store.h"

namespace kvtier::disk {
namespace {

constexpr uint64_t kBlock = 12 * 1024;
constexpr uint64_t kKeySet = 0xc2a5e0ULL;  // a key outside the set is a foreign key

std::vector<std::byte> PayloadOf(uint64_t id) {
  std::vector<std::byte> out(kBlock);
  uint64_t x = id * 0x9e3779b97f4a7c15ULL + 0x1234567;
  for (uint64_t i = 0; i < kBlock; i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(out.data() + i, &x, 8);
  }
  return out;
}

DiskOptions Options(const std::string& dir, SyncPolicy sync) {
  DiskOptions o;
  o.path = dir;
  o.block_bytes = kBlock;
  o.layout_fingerprint = 0xc7a54ULL;
  o.capacity_bytes = 1ull << 30;  // never evicts here: a lost block can only be a bug
  o.segment_bytes = 1 << 20;      // small, so kills also land on segment rolls
  o.queue_depth = 8;
  o.sync = sync;
  o.sync_interval_ms = 3;
  o.buffer_bytes = 8 * o.record_bytes();
  return o;
}

void Log(int fd, char what, uint64_t id) {
  char line[32];
  const int n =
      std::snprintf(line, sizeof(line), "%c %llu\n", what, static_cast<unsigned long long>(id));
  // One small O_APPEND write per line: it survives the writer's SIGKILL (the page cache does).
  if (::write(fd, line, static_cast<size_t>(n)) != n) _exit(3);
}

// The child: never returns.
[[noreturn]] void RunWriter(const std::string& dir, const std::string& log_path, SyncPolicy sync,
                            uint64_t first_id, uint64_t seed) {
  const int log = ::open(log_path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (log < 0) _exit(2);
  auto opened = DiskStore::Open(Options(dir, sync));
  if (!opened.ok()) {
    std::fprintf(stderr, "writer: %s\n", opened.status().ToString().c_str());
    _exit(4);
  }
  DiskStore& store = **opened;
  std::mt19937_64 rng(seed);
  uint64_t next = first_id;
  std::vector<uint64_t> pending, mine;
  for (uint64_t batch = 0;; ++batch) {
    const size_t n = 1 + rng() % 8;
    std::vector<uint64_t> ids;
    for (size_t i = 0; i < n; ++i) {
      // Mostly new blocks; sometimes an overwrite of one of ours (same bytes by construction).
      ids.push_back(!mine.empty() && rng() % 8 == 0 ? mine[rng() % mine.size()] : next++);
    }
    std::vector<BlockKey> keys;
    std::vector<std::vector<std::byte>> data;
    std::vector<std::span<const std::byte>> blocks;
    for (uint64_t id : ids) {
      keys.push_back(testing::Key(id, kKeySet));
      data.push_back(PayloadOf(id));
    }
    for (auto& d : data) blocks.emplace_back(d);
    std::vector<Status> results(n);
    store.Put(keys, blocks, results);
    for (size_t i = 0; i < n; ++i) {
      if (results[i].ok()) {
        pending.push_back(ids[i]);
        mine.push_back(ids[i]);
      }
    }
    if (sync == SyncPolicy::kNone && batch % 5 == 4 && !store.Sync().ok()) _exit(5);
    if (batch % 11 == 10 && !mine.empty()) {
      const uint64_t victim = mine[rng() % mine.size()];
      Log(log, 'E', victim);  // before the erase: the checker no longer insists on it
      const BlockKey k[1] = {testing::Key(victim, kKeySet)};
      if (!store.Erase(k).ok()) _exit(6);
    }
    std::vector<uint64_t> still;
    for (uint64_t id : pending) {
      if (store.IsDurable(testing::Key(id, kKeySet))) {
        Log(log, 'D', id);
      } else {
        still.push_back(id);
      }
    }
    pending.swap(still);
  }
}

struct CheckResult {
  uint64_t served = 0;             // blocks the reopened index served
  uint64_t corrupt_served = 0;     // served with bytes other than written: must stay 0
  uint64_t corruption_misses = 0;  // reported Corruption (dropped, not served): allowed
  uint64_t durable_checked = 0;
  uint64_t durable_lost = 0;  // logged durable, not erased, and gone: must stay 0
};

CheckResult Check(const std::string& dir, const std::string& log_path) {
  CheckResult r;
  std::set<uint64_t> durable, erased;
  std::ifstream in(log_path);
  char what;
  unsigned long long id;
  while (in >> what >> id) (what == 'D' ? durable : erased).insert(id);

  auto opened = DiskStore::Open(Options(dir, SyncPolicy::kBatch));
  EXPECT_TRUE(opened.ok()) << opened.status().ToString();
  if (!opened.ok()) {
    r.durable_lost = durable.size();
    return r;
  }
  DiskStore& store = **opened;
  EXPECT_EQ(store.stats().evicted_segments, 0u) << "the test relies on no eviction";
  std::vector<std::byte> buf(kBlock);
  std::set<uint64_t> present;
  for (const BlockKey& key : store.Keys()) {
    std::span<std::byte> out(buf);
    Status st;
    store.Get({&key, 1}, {&out, 1}, {&st, 1});
    if (st.ok()) {
      ++r.served;
      if (key != testing::Key(key.lo, kKeySet) || buf != PayloadOf(key.lo)) {
        ++r.corrupt_served;
        ADD_FAILURE() << "served wrong bytes for key " << key.ToHex();
      } else {
        present.insert(key.lo);
      }
    } else if (st.code() == StatusCode::kCorruption) {
      ++r.corruption_misses;
    } else {
      ADD_FAILURE() << "indexed key " << key.ToHex() << " unreadable: " << st.ToString();
    }
  }
  for (uint64_t d : durable) {
    if (erased.count(d)) continue;
    ++r.durable_checked;
    if (!present.count(d)) {
      ++r.durable_lost;
      ADD_FAILURE() << "durable block " << d << " lost";
    }
  }
  return r;
}

TEST(DiskCrashTest, SigkillNeverServesCorruptBlocksNorLosesDurableOnes) {
  int kills = 120;
  if (const char* env = std::getenv("KVTIER_CRASH_KILLS")) kills = std::max(1, std::atoi(env));
  const uint64_t seed = 20261202;
  std::mt19937_64 rng(seed);
  ::kvtier::testing::TempDir tmp;
  CheckResult total;
  int rounds_with_durable = 0;
  std::string dir, log_path;
  const auto t0 = std::chrono::steady_clock::now();
  for (int k = 0; k < kills; ++k) {
    if (k % 30 == 0) {
      // A fresh directory now and then keeps each reopen's scan short.
      dir = tmp.path() + "/tier" + std::to_string(k);
      log_path = tmp.path() + "/acked" + std::to_string(k) + ".log";
    }
    const SyncPolicy sync = k % 3 == 0   ? SyncPolicy::kBatch
                            : k % 3 == 1 ? SyncPolicy::kInterval
                                         : SyncPolicy::kNone;
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0) << std::strerror(errno);
    if (pid == 0) RunWriter(dir, log_path, sync, uint64_t(k) * 1000000 + 1, seed + k);
    // The kill point: anywhere from inside Open to deep into the write loop.
    std::this_thread::sleep_for(std::chrono::microseconds(500 + rng() % 40000));
    ASSERT_EQ(::kill(pid, SIGKILL), 0);
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
        << "the writer exited on its own with status " << status << " at kill " << k;
    const CheckResult r = Check(dir, log_path);
    total.served += r.served;
    total.corrupt_served += r.corrupt_served;
    total.corruption_misses += r.corruption_misses;
    total.durable_checked += r.durable_checked;
    total.durable_lost += r.durable_lost;
    rounds_with_durable += r.durable_checked > 0;
    if (::testing::Test::HasFailure()) break;
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf(
      "disk crash test: %d kills in %.1f s, seed %llu: %llu blocks served, %llu corrupt "
      "served, %llu dropped as Corruption, %llu durable checks, %llu durable lost\n",
      kills, secs, static_cast<unsigned long long>(seed),
      static_cast<unsigned long long>(total.served),
      static_cast<unsigned long long>(total.corrupt_served),
      static_cast<unsigned long long>(total.corruption_misses),
      static_cast<unsigned long long>(total.durable_checked),
      static_cast<unsigned long long>(total.durable_lost));
  EXPECT_GE(kills, 1);
  EXPECT_EQ(total.corrupt_served, 0u);
  EXPECT_EQ(total.durable_lost, 0u);
  // The check must have had something to check.
  EXPECT_GT(total.durable_checked, 0u);
  EXPECT_GT(rounds_with_durable, kills / 2);
}

}  // namespace
}  // namespace kvtier::disk
