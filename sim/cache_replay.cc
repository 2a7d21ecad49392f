#include "sim/cache_replay.h"

#include <algorithm>
#include <limits>
#include <queue>

#include "common/clock.h"
#include "sim/api_replay.h"
#include "sim/flat_lru.h"

namespace kvtier::sim {
namespace {

struct Tally {
  CacheReplayResult* r;
  void Request(const workload::ReplayRequest& q, uint64_t matched) { CountRequest(r, q, matched); }
};

// Calls progress at most every 4096 requests.
struct Ticker {
  const ProgressFn& fn;
  workload::RequestStream& stream;
  uint64_t n = 0;
  void Tick() {
    if (fn && (++n & 4095) == 0) fn(stream.progress());
  }
};

Status CheckBlockTokens(uint32_t* block_tokens, const workload::ReplayRequest& q) {
  if (q.block_tokens == 0) return Status::InvalidArgument("a request has block_tokens = 0");
  if (*block_tokens == 0) *block_tokens = q.block_tokens;
  if (*block_tokens != q.block_tokens) {
    return Status::InvalidArgument(
        "traces with different block sizes (" + std::to_string(*block_tokens) + " and " +
        std::to_string(q.block_tokens) + ") cannot share one cache-only replay");
  }
  return Status::Ok();
}

Result<CacheReplayResult> ReplayLru(workload::RequestStream& stream, uint64_t capacity_tokens,
                                    bool infinite, TouchOrder touch, const ProgressFn& progress,
                                    std::string name) {
  CacheReplayResult res;
  res.policy = std::move(name);
  res.capacity_tokens = infinite ? 0 : capacity_tokens;
  Tally tally{&res};
  Ticker ticker{progress, stream};
  ChainHasher hasher;
  workload::ReplayRequest q;
  uint32_t block_tokens = 0;
  std::unique_ptr<FlatLru> lru;
  std::vector<uint32_t> found;
  const double start = MonotonicSeconds();
  stream.Rewind();
  while (stream.Next(&q)) {
    KVTIER_RETURN_IF_ERROR(CheckBlockTokens(&block_tokens, q));
    if (!lru) {
      res.capacity_blocks = infinite ? 0 : capacity_tokens / block_tokens;
      lru = std::make_unique<FlatLru>(res.capacity_blocks, infinite);
    }
    size_t common = 0;
    std::span<const BlockKey> keys = hasher.Keys(q, &common);
    const size_t n = keys.size();
    uint64_t matched = 0;
    if (touch == TouchOrder::kHeadFirst) {
      // One pass: a block can only be evicted by an insertion before it, which already ended
      // the matched prefix.
      bool prefix = true;
      constexpr size_t kAhead = 8;
      for (size_t i = 0; i < std::min(n, kAhead); ++i) lru->Prefetch(keys[i]);
      for (size_t i = 0; i < n; ++i) {
        if (i + kAhead < n) lru->Prefetch(keys[i + kAhead]);
        const uint32_t node = lru->Find(keys[i]);
        if (node != FlatLru::kNone) {
          matched += prefix;
          lru->Touch(node);
        } else {
          prefix = false;
          res.evicted_blocks += lru->Insert(keys[i]);
          ++res.inserted_blocks;
        }
      }
    } else {
      found.resize(n);
      bool prefix = true;
      constexpr size_t kAhead = 8;
      for (size_t i = 0; i < std::min(n, kAhead); ++i) lru->Prefetch(keys[i]);
      for (size_t i = 0; i < n; ++i) {
        if (i + kAhead < n) lru->Prefetch(keys[i + kAhead]);
        found[i] = lru->Find(keys[i]);
        lru->PrefetchNode(found[i]);
        prefix = prefix && found[i] != FlatLru::kNone;
        matched += prefix;
      }
      for (size_t i = n; i-- > 0;) {
        // An insertion after i (touched earlier) may have evicted block i: check the node.
        if (lru->Holds(found[i], keys[i])) {
          lru->Touch(found[i]);
        } else {
          res.evicted_blocks += lru->Insert(keys[i]);
          ++res.inserted_blocks;
        }
      }
    }
    tally.Request(q, matched);
    res.peak_resident_blocks = std::max(res.peak_resident_blocks, lru->size());
    ticker.Tick();
  }
  KVTIER_RETURN_IF_ERROR(stream.status());
  res.seconds = MonotonicSeconds() - start;
  res.table_bytes = lru ? lru->memory_bytes() : 0;
  stream.Rewind();
  return res;
}

Result<CacheReplayResult> ReplayPolicy(workload::RequestStream& stream, const CacheReplayOptions& o,
                                       const ProgressFn& progress) {
  CacheReplayResult res;
  res.policy = o.policy;
  res.capacity_tokens = o.capacity_tokens;
  Tally tally{&res};
  Ticker ticker{progress, stream};
  ChainHasher hasher;
  workload::ReplayRequest q;
  uint32_t block_tokens = 0;
  std::unique_ptr<EvictionPolicy> policy;
  ReplayMap<uint8_t> resident;
  std::vector<uint8_t> present;
  const std::function<bool(const BlockKey&)> always = [](const BlockKey&) { return true; };
  std::unordered_map<uint64_t, size_t> last_len;  // session -> blocks of its previous request
  const double start = MonotonicSeconds();
  stream.Rewind();
  while (stream.Next(&q)) {
    KVTIER_RETURN_IF_ERROR(CheckBlockTokens(&block_tokens, q));
    if (!policy) {
      res.capacity_blocks = o.capacity_tokens / block_tokens;
      auto made = MakeEvictionPolicy(o.policy, res.capacity_blocks);
      if (!made.ok()) return made.status();
      policy = std::move(made).value();
      resident.Reserve(std::min<uint64_t>(res.capacity_blocks + 1, 1 << 22));
    }
    size_t common = 0;
    std::span<const BlockKey> keys = hasher.Keys(q, &common);
    const size_t n = keys.size();
    // What an agentic server knows: the session is active again; its context was reset when
    // it dropped most of what it sent last time.
    auto [len_it, first] = last_len.try_emplace(q.session, 0);
    if (!first && common * 2 < len_it->second) {
      policy->OnSessionEvent(q.session, SessionEvent::kReset, q.start_s);
    }
    len_it->second = n;
    policy->OnSessionEvent(q.session, SessionEvent::kActive, q.start_s);
    present.resize(n);
    uint64_t matched = 0;
    bool prefix = true;
    for (size_t i = 0; i < n; ++i) {
      present[i] = resident.Contains(keys[i]);
      prefix = prefix && present[i];
      matched += prefix;
    }
    auto touch = [&](size_t i) {
      AccessHint hint{q.session, static_cast<uint32_t>(i), q.start_s};
      // Re-check: an eviction earlier in this request may have removed block i.
      if (present[i] && resident.Contains(keys[i])) {
        policy->OnAccess(keys[i], hint);
        return;
      }
      resident.Insert(keys[i], 1);
      policy->OnInsert(keys[i], hint);
      ++res.inserted_blocks;
      while (resident.size() > res.capacity_blocks) {
        std::optional<BlockKey> victim = policy->PickVictim(always);
        if (!victim) break;
        resident.Erase(*victim);
        ++res.evicted_blocks;
      }
    };
    if (o.touch == TouchOrder::kHeadFirst) {
      for (size_t i = 0; i < n; ++i) touch(i);
    } else {
      for (size_t i = n; i-- > 0;) touch(i);
    }
    if (q.session_last) {
      policy->OnSessionEvent(q.session, SessionEvent::kFinished, q.start_s);
      last_len.erase(q.session);
    } else {
      policy->OnSessionEvent(q.session, SessionEvent::kThinking, q.start_s);
    }
    if (resident.size() > res.capacity_blocks) {
      return Status::Internal(
          "policy " + o.policy + " found no victim with " + std::to_string(resident.size()) +
          " blocks resident over a capacity of " + std::to_string(res.capacity_blocks));
    }
    tally.Request(q, matched);
    res.peak_resident_blocks = std::max(res.peak_resident_blocks, resident.size());
    ticker.Tick();
  }
  KVTIER_RETURN_IF_ERROR(stream.status());
  res.seconds = MonotonicSeconds() - start;
  res.table_bytes = resident.MemoryBytes();
  stream.Rewind();
  return res;
}

// What the Cache does to its policy for an engine's Lookup then Store of the missed blocks
// (src/cache/cache.cc LookupKeys, cache_store.cc StoreToTier and MakeRoom), with no clock of
// its own and only the events of o.engine: ReplayThroughApi's figures, without the Cache.
Result<CacheReplayResult> ReplayPolicyAsApi(workload::RequestStream& stream,
                                            const CacheReplayOptions& o,
                                            const ProgressFn& progress) {
  CacheReplayResult res;
  res.policy = o.policy;
  res.capacity_tokens = o.capacity_tokens;
  Ticker ticker{progress, stream};
  ChainHasher hasher;
  workload::ReplayRequest q;
  uint32_t block_tokens = 0;
  std::unique_ptr<EvictionPolicy> policy;
  ReplayMap<uint8_t> resident;
  const std::function<bool(const BlockKey&)> always = [](const BlockKey&) { return true; };
  // The Cache's names: its LRU touches chains last to first.
  const std::string name = ReplayLibraryPolicy(o.policy);
  std::vector<uint32_t> todo;
  stream.Rewind();
  const double start = MonotonicSeconds();
  while (stream.Next(&q)) {
    KVTIER_RETURN_IF_ERROR(CheckBlockTokens(&block_tokens, q));
    if (!policy) {
      res.capacity_blocks = o.capacity_tokens / block_tokens;
      KVTIER_ASSIGN_OR_RETURN(policy, MakeEvictionPolicy(name, res.capacity_blocks));
    }
    size_t common = 0;
    std::span<const BlockKey> keys = hasher.Keys(q, &common);
    const size_t n = keys.size();
    uint32_t matched = 0;
    while (matched < n && resident.Contains(keys[matched])) ++matched;
    AccessHint hint{q.session, 0, q.start_s};
    policy->OnAccessChain(keys.first(matched), hint);  // Lookup
    todo.clear();
    for (size_t i = n; i-- > matched;) {  // Store: last to first
      hint.position = static_cast<uint32_t>(i);
      if (resident.Contains(keys[i]))
        policy->OnAccess(keys[i], hint);
      else
        todo.push_back(static_cast<uint32_t>(i));
    }
    std::reverse(todo.begin(), todo.end());
    while (!todo.empty() && todo.back() >= res.capacity_blocks) todo.pop_back();  // ChainRoom
    while (policy->size() + todo.size() > res.capacity_blocks) {                  // MakeRoom
      std::optional<BlockKey> victim = policy->PickVictim(always);
      if (!victim) break;
      resident.Erase(*victim);
      ++res.evicted_blocks;
    }
    // Room short: the head is kept, the tail refused.
    const uint64_t held = policy->size();
    todo.resize(held >= res.capacity_blocks
                    ? 0
                    : std::min<uint64_t>(todo.size(), res.capacity_blocks - held));
    for (size_t j = todo.size(); j-- > 0;) {
      hint.position = todo[j];
      resident.Insert(keys[todo[j]], 1);
      policy->OnInsert(keys[todo[j]], hint);
      ++res.inserted_blocks;
    }
    if (const auto event = EngineEventAfter(*o.engine, q))
      policy->OnSessionEvent(q.session, *event, q.start_s);
    CountRequest(&res, q, matched);
    res.peak_resident_blocks = std::max(res.peak_resident_blocks, resident.size());
    ticker.Tick();
  }
  KVTIER_RETURN_IF_ERROR(stream.status());
  res.seconds = MonotonicSeconds() - start;
  res.table_bytes = resident.MemoryBytes();
  stream.Rewind();
  return res;
}

}  // namespace

std::string_view EngineEventsName(EngineEvents e) {
  switch (e) {
    case EngineEvents::kNone:
      return "none";
    case EngineEvents::kRequestEnd:
      return "request";
    case EngineEvents::kClose:
      return "close";
  }
  return "?";
}

std::optional<SessionEvent> EngineEventAfter(EngineEvents e, const workload::ReplayRequest& q) {
  if (e == EngineEvents::kClose && q.session_last) return SessionEvent::kFinished;
  if (e != EngineEvents::kNone) return SessionEvent::kThinking;
  return std::nullopt;
}

void CountRequest(CacheReplayResult* r, const workload::ReplayRequest& q, uint64_t matched) {
  ++r->requests;
  r->prompt_tokens += q.prompt_tokens;
  const uint64_t hit = std::min<uint64_t>(matched * q.block_tokens, q.prompt_tokens);
  r->hit_tokens += hit;
  if (q.prompt_tokens > 0) {
    r->request_hit_sum += static_cast<double>(hit) / static_cast<double>(q.prompt_tokens);
  }
  r->blocks += q.ids.size();
  r->hit_blocks += matched;
}

Status CacheReplayOptions::Validate() const {
  if (policy.empty()) return Status::InvalidArgument("no policy given");
  if (policy == "min") {
    return Status::InvalidArgument("policy \"min\" needs the future: use ReplayBelady");
  }
  return Status::Ok();
}

std::span<const BlockKey> ChainHasher::Keys(const workload::ReplayRequest& r, size_t* common) {
  Memo* m = &scratch_;
  if (r.session != 0) m = &sessions_[r.session];
  if (m->root != r.root) {
    m->root = r.root;
    m->ids.clear();
    m->keys.clear();
  }
  const size_t n = r.ids.size();
  size_t c = 0;
  const size_t limit = std::min(n, m->ids.size());
  while (c < limit && m->ids[c] == r.ids[c]) ++c;
  *common = c;
  m->ids.assign(r.ids.begin(), r.ids.end());
  m->keys.resize(n);
  BlockKey parent = c == 0 ? r.root : m->keys[c - 1];
  for (size_t i = c; i < n; ++i) {
    parent = ChainKeyFromId(parent, r.ids[i]);
    m->keys[i] = parent;
  }
  if (r.session_last && r.session != 0) {
    // Keep the keys valid for the caller: move them out before dropping the session.
    scratch_ = std::move(*m);
    sessions_.erase(r.session);
    return scratch_.keys;
  }
  return m->keys;
}

Result<CacheReplayResult> ReplayCacheOnly(workload::RequestStream& stream,
                                          const CacheReplayOptions& options,
                                          const ProgressFn& progress) {
  KVTIER_RETURN_IF_ERROR(options.Validate());
  const std::string& p = options.policy;
  if (options.engine) {
    if (p == "ideal") return Status::InvalidArgument("\"ideal\" has no engine-driven form");
    return ReplayPolicyAsApi(stream, options, progress);
  }
  if (p == "lru") {
    return ReplayLru(stream, options.capacity_tokens, false, TouchOrder::kHeadFirst, progress, p);
  }
  if (p == "lru-tail") {
    return ReplayLru(stream, options.capacity_tokens, false, TouchOrder::kTailFirst, progress, p);
  }
  if (p == "ideal") {
    return ReplayLru(stream, 0, true, TouchOrder::kHeadFirst, progress, p);
  }
  if (p.starts_with("lib:")) {
    // The library's policy of that name, bypassing the built-in lru / lru-tail.
    CacheReplayOptions o = options;
    o.policy = p.substr(4);
    auto r = ReplayPolicy(stream, o, progress);
    if (r.ok()) r->policy = p;
    return r;
  }
  return ReplayPolicy(stream, options, progress);
}

Result<StreamCost> MeasureStreamCost(workload::RequestStream& stream) {
  StreamCost c;
  workload::ReplayRequest q;
  volatile uint64_t sink = 0;  // keeps the read-only loop from being dropped
  double t0 = MonotonicSeconds();
  stream.Rewind();
  while (stream.Next(&q)) sink = sink + q.ids.size();
  KVTIER_RETURN_IF_ERROR(stream.status());
  c.read_s = MonotonicSeconds() - t0;
  ChainHasher hasher;
  t0 = MonotonicSeconds();
  stream.Rewind();
  while (stream.Next(&q)) {
    size_t common = 0;
    auto keys = hasher.Keys(q, &common);
    c.blocks += keys.size();
    if (!keys.empty()) sink = sink ^ keys.back().lo;
  }
  c.read_and_hash_s = MonotonicSeconds() - t0;
  stream.Rewind();
  return c;
}

Result<CacheReplayResult> ReplayBelady(const workload::MaterializedRequests& m,
                                       uint64_t capacity_tokens) {
  CacheReplayResult res;
  res.policy = "min";
  res.capacity_tokens = capacity_tokens;
  Tally tally{&res};
  const double start = MonotonicSeconds();
  // Dense ids for the distinct keys, and for every access the request of that key's next use.
  ReplayMap<uint32_t> dense(1 << 16);
  std::vector<uint32_t> access_id;
  std::vector<uint32_t> depth;  // per dense id: block position (fixed by the chain)
  ChainHasher hasher;
  uint32_t block_tokens = 0;
  for (const auto& q : m.requests) {
    KVTIER_RETURN_IF_ERROR(CheckBlockTokens(&block_tokens, q));
    size_t common = 0;
    auto keys = hasher.Keys(q, &common);
    for (size_t i = 0; i < keys.size(); ++i) {
      auto [id, fresh] = dense.Insert(keys[i], static_cast<uint32_t>(depth.size()));
      if (fresh) depth.push_back(static_cast<uint32_t>(i));
      access_id.push_back(*id);
    }
  }
  if (block_tokens == 0) block_tokens = 1;
  res.capacity_blocks = capacity_tokens / block_tokens;
  constexpr uint32_t kNever = std::numeric_limits<uint32_t>::max();
  std::vector<uint32_t> next_use(access_id.size(), kNever);
  std::vector<uint32_t> cur_next(depth.size(), kNever);  // first the next-use scan's "seen"
  for (size_t r = m.requests.size(), end = access_id.size(); r-- > 0;) {
    const size_t begin = end - m.requests[r].ids.size();
    for (size_t a = begin; a < end; ++a) {
      next_use[a] = cur_next[access_id[a]];
      cur_next[access_id[a]] = static_cast<uint32_t>(r);
    }
    end = begin;
  }
  std::fill(cur_next.begin(), cur_next.end(), kNever);
  // Max-heap on (next use, depth) with lazy deletion: an entry is live while its id is resident
  // with that next use.
  struct Entry {
    uint32_t next;
    uint32_t depth;
    uint32_t id;
    bool operator<(const Entry& o) const {
      return next != o.next ? next < o.next : depth < o.depth;
    }
  };
  std::priority_queue<Entry> heap;
  std::vector<uint8_t> resident(depth.size(), 0);
  uint64_t size = 0;
  size_t a = 0;
  for (size_t r = 0; r < m.requests.size(); ++r) {
    const auto& q = m.requests[r];
    const size_t n = q.ids.size();
    uint64_t matched = 0;
    while (matched < n && resident[access_id[a + matched]]) ++matched;
    for (size_t i = 0; i < n; ++i, ++a) {
      const uint32_t id = access_id[a];
      if (!resident[id]) {
        resident[id] = 1;
        ++size;
        ++res.inserted_blocks;
      }
      cur_next[id] = next_use[a];
      heap.push(Entry{next_use[a], depth[id], id});
    }
    res.peak_resident_blocks = std::max(res.peak_resident_blocks, size);
    while (size > res.capacity_blocks && !heap.empty()) {
      const Entry e = heap.top();
      heap.pop();
      if (!resident[e.id] || cur_next[e.id] != e.next) continue;  // stale
      resident[e.id] = 0;
      --size;
      ++res.evicted_blocks;
    }
    // Bound the heap: rebuild it from the live entries when stale ones dominate.
    if (heap.size() > 4 * (size + 1024)) {
      std::vector<Entry> live;
      live.reserve(size);
      for (uint32_t id = 0; id < resident.size(); ++id) {
        if (resident[id]) live.push_back(Entry{cur_next[id], depth[id], id});
      }
      heap = std::priority_queue<Entry>(std::less<Entry>(), std::move(live));
    }
    tally.Request(q, matched);
  }
  res.seconds = MonotonicSeconds() - start;
  res.table_bytes = dense.MemoryBytes() + access_id.capacity() * 8 + depth.capacity() * 10;
  return res;
}

}  // namespace kvtier::sim
