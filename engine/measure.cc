#include "engine/measure.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>

#include "common/clock.h"

namespace kvtier::engine {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  if (v.empty()) return 0;
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

namespace {

// The planner's view of a cold-pool request whose loadable blocks all sit in tier 0.
PlanRequest ColdRequest(const Engine& engine, const Planner& planner, uint32_t tokens) {
  PlanRequest req;
  req.prompt_tokens = tokens;
  const uint32_t bt = engine.options().block_tokens;
  const uint32_t loadable = tokens > 0 ? (tokens - 1) / bt : 0;
  const int tier = engine.cache() ? planner.profile().FindTier(engine.cache()->tier(0).name()) : -1;
  req.block_tier.assign(loadable, tier);
  return req;
}

}  // namespace

// Every turn Calibrate and RunCrossover run decodes one token.
uint64_t CalibrationPoolBlocks(const CalibrationOptions& opt, uint32_t bt) {
  if (bt == 0) return 0;
  uint64_t need = std::max<uint32_t>(2, opt.tier_batch_blocks);
  for (uint32_t len : opt.prompt_lengths) need = std::max(need, TurnPoolBlocks(len, 1, bt));
  const uint64_t ctx = (uint64_t{opt.context_tokens} + bt - 1) / bt * bt;
  return std::max(need, TurnPoolBlocks(ctx + bt, 1, bt));
}

uint64_t CrossoverPoolBlocks(const std::vector<uint32_t>& lengths, uint32_t bt) {
  uint64_t need = 0;
  for (uint32_t len : lengths) need = std::max(need, TurnPoolBlocks(len, 1, bt));
  return need;
}

namespace {

Status CheckPool(const char* what, Engine& e, uint64_t need) {
  if (e.pool().capacity_blocks() >= need) return Status::Ok();
  return Status::InvalidArgument(std::string(what) + ": the pool holds " +
                                 std::to_string(e.pool().capacity_blocks()) + " blocks; it needs " +
                                 std::to_string(need) + " blocks of " +
                                 std::to_string(e.options().block_tokens) + " tokens");
}

}  // namespace

std::vector<TokenId> SyntheticTokens(uint32_t n, uint32_t vocab, uint64_t salt) {
  std::vector<TokenId> t(n);
  uint64_t x = salt * 0x9e3779b97f4a7c15ULL + 0x632be59bd9b4e019ULL;
  for (uint32_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    t[i] = static_cast<TokenId>(x % vocab);
  }
  return t;
}

Result<Calibration> Calibrate(Engine* engine, const CalibrationOptions& opt,
                              const ProgressFn& progress) {
  Cache* cache = engine->cache();
  if (cache == nullptr) return Status::InvalidArgument("calibrate: the engine has no cache");
  if (opt.reps < 1) return Status::InvalidArgument("calibrate: reps must be >= 1");
  const uint32_t bt = engine->options().block_tokens;
  KVTIER_RETURN_IF_ERROR(CheckPool("calibrate", *engine, CalibrationPoolBlocks(opt, bt)));
  const uint32_t vocab = engine->config().vocab_size;
  Calibration cal;
  const double total = opt.prompt_lengths.size() + 2 + cache->num_tiers();
  double done = 0;
  auto tick = [&] {
    if (progress) progress(++done, total);
  };

  TurnOptions recompute;
  recompute.use_pool = false;
  recompute.use_cache = false;
  recompute.decode_tokens = 1;
  for (uint32_t len : opt.prompt_lengths) {
    std::vector<double> t;
    for (int r = 0; r < opt.reps; ++r) {
      auto prompt = SyntheticTokens(len, vocab, 1000 + len);
      KVTIER_ASSIGN_OR_RETURN(TurnResult res, engine->RunTurn(prompt, recompute));
      t.push_back(res.ttft_s);
    }
    cal.prefill.push_back({double(len), 0, Median(t)});
    tick();
  }
  {  // one block computed after `context_tokens` of loaded KV
    const uint32_t ctx = (opt.context_tokens + bt - 1) / bt * bt;
    auto prompt = SyntheticTokens(ctx + bt, vocab, 77);
    TurnOptions store;
    store.use_pool = false;
    store.decode_tokens = 1;
    store.mode = ReuseMode::kRecompute;
    KVTIER_ASSIGN_OR_RETURN(TurnResult first, engine->RunTurn(prompt, store));
    cal.prefill.push_back({double(first.computed_tokens), 0, first.ttft_s});
    std::vector<double> t;
    for (int r = 0; r < opt.reps; ++r) {
      engine->pool().DropUnreferenced();
      TurnOptions load;
      load.decode_tokens = 1;
      load.mode = ReuseMode::kLoad;
      KVTIER_ASSIGN_OR_RETURN(TurnResult res, engine->RunTurn(prompt, load));
      if (res.loaded_blocks == 0) {
        return Status::Internal("calibrate: the cache served nothing for the context sample");
      }
      t.push_back(res.ttft_s - res.load_s);
    }
    cal.prefill.push_back({double(bt), double(ctx), Median(t)});
    engine->pool().DropUnreferenced();
    tick();
  }
  KVTIER_ASSIGN_OR_RETURN(PrefillCost prefill, FitPrefillCost(cal.prefill));

  // Tiers: Lookup + Load of 1 block and of a batch, through the Cache as the engine does it.
  const uint64_t block_bytes = engine->pool().block_bytes();
  const uint32_t batch = std::max<uint32_t>(2, opt.tier_batch_blocks);
  std::vector<BlockId> ids;
  for (uint32_t i = 0; i < batch; ++i) {
    Result<BlockId> id = engine->pool().Allocate();
    if (!id.ok()) {
      for (BlockId b : ids) engine->pool().Release(b);
      return id.status().WithContext("calibrate: pool too small for the tier batch");
    }
    ids.push_back(*id);
  }
  struct Releaser {
    KvPool* pool;
    std::vector<BlockId>* ids;
    ~Releaser() {
      for (BlockId b : *ids) pool->Release(b);
    }
  } releaser{&engine->pool(), &ids};
  std::vector<MutableBlock> dst;
  std::vector<ConstBlock> src;
  for (BlockId b : ids) {
    MutableBlock m = engine->pool().block(b);
    for (size_t i = 0; i < m.size(); i += 64) m[i] = std::byte(i * 131 >> 6);
    dst.push_back(m);
    src.push_back(m);
  }
  {  // same-run baseline: streaming memcpy of the batch into a second buffer
    std::vector<std::byte> buf(batch * block_bytes);
    std::memset(buf.data(), 1, buf.size());
    std::vector<double> t;
    for (int r = 0; r < opt.reps + 2; ++r) {
      const double t0 = MonotonicSeconds();
      for (uint32_t i = 0; i < batch; ++i) {
        std::memcpy(buf.data() + i * block_bytes, src[i].data(), block_bytes);
      }
      t.push_back(MonotonicSeconds() - t0);
    }
    cal.memcpy_bytes_per_s = batch * double(block_bytes) / Median(t);
  }
  CostProfile& p = cal.profile;
  for (int tier = 0; tier < cache->num_tiers(); ++tier) {
    Tier& tr = cache->tier(tier);
    // Keys under a private chain, put straight into this tier through the cache.
    std::vector<BlockKey> keys;
    BlockKey k = cache->Root();
    for (uint32_t i = 0; i < batch; ++i) {
      k = ChainKeyFromId(k, 0xca11b000u + tier * 1000 + i);
      keys.push_back(k);
    }
    KVTIER_ASSIGN_OR_RETURN(StoreResult sr, cache->StoreKeys(keys, src));
    (void)sr;
    auto time_load = [&](uint32_t n) -> Result<double> {
      std::vector<double> t;
      for (int r = 0; r < opt.reps + 2; ++r) {
        const double t0 = MonotonicSeconds();
        KVTIER_ASSIGN_OR_RETURN(LookupResult lr,
                                cache->LookupKeys(std::span<const BlockKey>(keys).subspan(0, n)));
        if (lr.hit_blocks < n || lr.blocks_by_tier[tier] < n) {
          return Status::Unavailable("calibrate: tier '" + tr.name() + "' did not hold the " +
                                     std::to_string(n) + " calibration blocks");
        }
        KVTIER_ASSIGN_OR_RETURN(LoadResult ld,
                                cache->Load(lr, std::span<const MutableBlock>(dst).subspan(0, n)));
        if (ld.loaded_blocks < n) return Status::Unavailable("calibrate: load failed");
        t.push_back(MonotonicSeconds() - t0);
      }
      return Median(t);
    };
    KVTIER_ASSIGN_OR_RETURN(double t1, time_load(1));
    KVTIER_ASSIGN_OR_RETURN(double tn, time_load(batch));
    const double bw = (batch - 1) * double(block_bytes) / std::max(tn - t1, 1e-9);
    TierCost cost{tr.name(), std::max(0.0, t1 - block_bytes / bw), bw};
    p.tiers.push_back(cost);
    cal.tiers.push_back({tr.name(), 1, block_bytes, t1});
    cal.tiers.push_back({tr.name(), batch, batch * block_bytes, tn});
    tick();
  }
  p.machine = opt.machine;
  p.model = engine->config().name;
  p.threads = engine->options().threads;
  p.block_tokens = bt;
  p.block_bytes = block_bytes;
  p.prefill = prefill;
  KVTIER_RETURN_IF_ERROR(p.Validate());
  return cal;
}

Result<CrossoverResult> RunCrossover(Engine* engine, const Planner& planner,
                                     const std::vector<uint32_t>& lengths, int reps,
                                     const ProgressFn& progress) {
  if (engine->cache() == nullptr) return Status::InvalidArgument("crossover: no cache attached");
  KVTIER_RETURN_IF_ERROR(CheckPool("crossover", *engine,
                                   CrossoverPoolBlocks(lengths, engine->options().block_tokens)));
  const double t_start = MonotonicSeconds();
  const uint32_t vocab = engine->config().vocab_size;
  CrossoverResult out;
  double work_total = 0, work_done = 0;
  for (uint32_t n : lengths) work_total += double(n) * n + 1e5 * n;
  double sum_chosen = 0, sum_min = 0;
  for (uint32_t n : lengths) {
    const int r_count = n <= 2048 ? std::max(1, reps) : 1;
    CrossoverPoint pt;
    pt.tokens = n;
    pt.plan = planner.Choose(ColdRequest(*engine, planner, n));
    std::vector<double> load_t, rec_t, split_t;
    bool exact = true;
    for (int r = 0; r < r_count; ++r) {
      // A fresh prompt each rep, so the recompute really computes and stores everything.
      auto prompt = SyntheticTokens(n, vocab, (uint64_t{n} << 8) + r + 1);
      engine->pool().DropUnreferenced();
      TurnOptions rec;
      rec.use_pool = false;
      rec.decode_tokens = 1;
      rec.mode = ReuseMode::kRecompute;
      KVTIER_ASSIGN_OR_RETURN(TurnResult full, engine->RunTurn(prompt, rec));
      rec_t.push_back(full.ttft_s);
      engine->pool().DropUnreferenced();
      TurnOptions load;
      load.decode_tokens = 1;
      load.mode = ReuseMode::kLoad;
      KVTIER_ASSIGN_OR_RETURN(TurnResult loaded, engine->RunTurn(prompt, load));
      load_t.push_back(loaded.ttft_s);
      pt.loaded_blocks = loaded.loaded_blocks;
      exact &= SameBits(full.logits, loaded.logits);
      if (pt.plan.choice == PlanChoice::kSplit) {
        engine->pool().DropUnreferenced();
        TurnOptions split;
        split.decode_tokens = 1;
        split.mode = ReuseMode::kSplit;
        split.split_blocks = pt.plan.recompute_blocks;
        KVTIER_ASSIGN_OR_RETURN(TurnResult s, engine->RunTurn(prompt, split));
        split_t.push_back(s.ttft_s);
        exact &= SameBits(full.logits, s.logits);
      }
    }
    engine->pool().DropUnreferenced();
    pt.load_s = Median(load_t);
    pt.recompute_s = Median(rec_t);
    if (!split_t.empty()) pt.split_s = Median(split_t);
    pt.bit_exact = exact;
    pt.chosen_s = pt.plan.choice == PlanChoice::kLoad        ? pt.load_s
                  : pt.plan.choice == PlanChoice::kRecompute ? pt.recompute_s
                                                             : pt.split_s;
    double best = std::min(pt.load_s, pt.recompute_s);
    if (pt.split_s >= 0) best = std::min(best, pt.split_s);
    sum_chosen += pt.chosen_s;
    sum_min += best;
    out.points.push_back(pt);
    work_done += double(n) * n + 1e5 * n;
    if (progress) progress(work_done, work_total);
  }
  out.regret_pct = sum_min > 0 ? 100.0 * (sum_chosen - sum_min) / sum_min : 0;
  out.sweep_s = MonotonicSeconds() - t_start;
  return out;
}

std::string CrossoverResult::ToJson() const {
  nlohmann::json j;
  j["points"] = nlohmann::json::array();
  for (const CrossoverPoint& p : points) {
    nlohmann::json o = {{"tokens", p.tokens},
                        {"load_ms", p.load_s * 1e3},
                        {"recompute_ms", p.recompute_s * 1e3},
                        {"choice", std::string(PlanChoiceName(p.plan.choice))},
                        {"chosen_ms", p.chosen_s * 1e3},
                        {"predicted_ms", p.plan.predicted_s * 1e3},
                        {"loaded_blocks", p.loaded_blocks},
                        {"bit_exact", p.bit_exact}};
    if (p.split_s >= 0) o["split_ms"] = p.split_s * 1e3;
    j["points"].push_back(o);
  }
  j["regret_pct"] = regret_pct;
  j["sweep_s"] = sweep_s;
  return j.dump(2) + "\n";
}

uint64_t ResumePoolBlocks(const ResumeOptions& o, uint32_t bt) {
  uint64_t need = 0;
  for (uint32_t p : o.prefix_tokens) need = std::max(need, TurnPoolBlocks(p + o.new_tokens, 1, bt));
  return need;
}

namespace {

// Lookup + Load of prompt's cached blocks into pool blocks of a cold pool; the seconds taken.
Result<double> TimeLoadOnly(Engine* engine, const std::vector<TokenId>& prefix, uint32_t* loaded) {
  engine->pool().DropUnreferenced();
  Cache& cache = *engine->cache();
  const double t0 = MonotonicSeconds();
  KVTIER_ASSIGN_OR_RETURN(LookupResult lk, cache.Lookup(prefix));
  std::vector<BlockId> ids;
  std::vector<MutableBlock> dst;
  Status st = Status::Ok();
  for (uint32_t i = 0; i < lk.hit_blocks && st.ok(); ++i) {
    Result<BlockId> id = engine->pool().Allocate();
    if (!id.ok()) st = id.status();
    if (id.ok()) {
      ids.push_back(*id);
      dst.push_back(engine->pool().block(*id));
    }
  }
  Result<LoadResult> lr = st.ok() ? cache.Load(lk, dst) : Result<LoadResult>(st);
  const double t = MonotonicSeconds() - t0;
  for (BlockId id : ids) engine->pool().Release(id);
  KVTIER_RETURN_IF_ERROR(lr.status());
  *loaded = lr->loaded_blocks;
  return t;
}

}  // namespace

Result<ResumeResult> RunResume(Engine* engine, const ResumeOptions& o, const ProgressFn& progress) {
  if (engine->cache() == nullptr) return Status::InvalidArgument("resume: no cache attached");
  const uint32_t bt = engine->options().block_tokens;
  KVTIER_RETURN_IF_ERROR(CheckPool("resume", *engine, ResumePoolBlocks(o, bt)));
  for (uint32_t p : o.prefix_tokens) {
    if (p == 0 || p % bt != 0)
      return Status::InvalidArgument("resume: a prefix of " + std::to_string(p) +
                                     " tokens is not a whole number of " + std::to_string(bt) +
                                     "-token blocks");
  }
  if (o.new_tokens == 0) return Status::InvalidArgument("resume: new_tokens must be > 0");
  const double t_start = MonotonicSeconds();
  const uint32_t vocab = engine->config().vocab_size;
  ResumeResult out;
  out.tier = engine->cache()->tier(0).name();
  const int reps = std::max(1, o.reps);
  double total = 0, done = 0;
  for (uint32_t p : o.prefix_tokens) total += double(p + o.new_tokens) * reps;
  for (uint32_t p : o.prefix_tokens) {
    ResumePoint pt;
    pt.prefix_tokens = p;
    pt.new_tokens = o.new_tokens;
    std::vector<TokenId> prefix = SyntheticTokens(p, vocab, (uint64_t{p} << 8) + 7);
    std::vector<TokenId> prompt = prefix;
    std::vector<TokenId> more = SyntheticTokens(o.new_tokens, vocab, (uint64_t{p} << 8) + 8);
    prompt.insert(prompt.end(), more.begin(), more.end());
    engine->pool().DropUnreferenced();
    TurnOptions store;
    store.decode_tokens = 1;
    store.use_pool = false;
    store.mode = ReuseMode::kRecompute;
    KVTIER_RETURN_IF_ERROR(engine->RunTurn(prefix, store).status());
    engine->cache()->WaitForWrites();  // the tier below the caller's copy holds it now
    bool exact = true;
    std::vector<double> load_t, comp_t, sync_t, lw_t, wait_t;
    std::vector<float> first_logits;
    for (int r = 0; r < reps; ++r) {
      KVTIER_ASSIGN_OR_RETURN(double lt, TimeLoadOnly(engine, prefix, &pt.loaded_blocks));
      load_t.push_back(lt);
      for (bool layerwise : {false, true}) {
        engine->pool().DropUnreferenced();
        TurnOptions t;
        t.decode_tokens = 1;
        t.mode = ReuseMode::kLoad;
        t.store = false;
        t.layerwise = layerwise;
        KVTIER_ASSIGN_OR_RETURN(TurnResult res, engine->RunTurn(prompt, t));
        if (res.loaded_blocks != p / bt)
          return Status::Unavailable("resume: the " + out.tier + " tier served " +
                                     std::to_string(res.loaded_blocks) + " of the prefix's " +
                                     std::to_string(p / bt) + " blocks");
        if (first_logits.empty()) first_logits = res.logits;
        exact &= SameBits(first_logits, res.logits);
        if (layerwise) {
          lw_t.push_back(res.ttft_s);
          wait_t.push_back(res.load_s);
        } else {
          sync_t.push_back(res.ttft_s);
          comp_t.push_back(res.compute_s);
        }
      }
      done += p + o.new_tokens;
      if (progress) progress(done, total);
    }
    if (p + o.new_tokens <= o.verify_tokens) {
      engine->pool().DropUnreferenced();
      TurnOptions full;
      full.decode_tokens = 1;
      full.use_pool = false;
      full.use_cache = false;
      KVTIER_ASSIGN_OR_RETURN(TurnResult ref, engine->RunTurn(prompt, full));
      pt.recompute_s = ref.ttft_s;
      exact &= SameBits(first_logits, ref.logits);
    }
    engine->pool().DropUnreferenced();
    pt.loaded_bytes = uint64_t{pt.loaded_blocks} * engine->layout().bytes_per_block();
    pt.load_only_s = Median(load_t);
    pt.compute_only_s = Median(comp_t);
    pt.sync_s = Median(sync_t);
    pt.layerwise_s = Median(lw_t);
    pt.layerwise_wait_s = Median(wait_t);
    pt.bit_exact = exact;
    out.points.push_back(pt);
  }
  out.sweep_s = MonotonicSeconds() - t_start;
  return out;
}

std::string ResumeResult::ToJson() const {
  nlohmann::json j;
  j["tier"] = tier;
  j["points"] = nlohmann::json::array();
  for (const ResumePoint& p : points) {
    nlohmann::json o = {
        {"prefix_tokens", p.prefix_tokens},
        {"new_tokens", p.new_tokens},
        {"loaded_blocks", p.loaded_blocks},
        {"loaded_bytes", p.loaded_bytes},
        {"load_only_ms", p.load_only_s * 1e3},
        {"compute_only_ms", p.compute_only_s * 1e3},
        {"sync_ms", p.sync_s * 1e3},
        {"layerwise_ms", p.layerwise_s * 1e3},
        {"layerwise_wait_ms", p.layerwise_wait_s * 1e3},
        {"overlap_ratio", p.layerwise_s / std::max(p.load_only_s, p.compute_only_s)},
        {"bit_exact", p.bit_exact}};
    if (p.recompute_s >= 0) o["recompute_ms"] = p.recompute_s * 1e3;
    j["points"].push_back(o);
  }
  j["sweep_s"] = sweep_s;
  return j.dump(2) + "\n";
}

}  // namespace kvtier::engine
