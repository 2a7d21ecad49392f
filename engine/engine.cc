#include "engine/engine.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <utility>

#include "common/clock.h"
#include "engine/blas.h"
#include "engine/gguf.h"

namespace kvtier::engine {
namespace {

// Releases every block of a turn's table when the turn ends, however it ends.
class TableGuard {
 public:
  explicit TableGuard(KvPool* pool) : pool_(pool) {}
  ~TableGuard() {
    for (BlockId id : table) pool_->Release(id);
  }
  std::vector<BlockId> table;

 private:
  KvPool* pool_;
};

// Address space the process maps now (0 when /proc cannot tell).
uint64_t MappedBytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  unsigned long long pages = 0;
  const int got = std::fscanf(f, "%llu", &pages);
  std::fclose(f);
  return got == 1 ? pages * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE)) : 0;
}

// Under a virtual-memory limit (ulimit -v) too small for the model, an allocation fails deep in
// a turn, where OpenBLAS retries it for ever: the engine would hang. Refused up front instead,
// with what it needs: the weights and the pool, plus OpenBLAS's per-thread buffers and the
// activations (kBlasBytesPerThread each, a generous bound).
Status CheckAddressSpace(const ModelConfig& c, const EngineOptions& o, bool weights_loaded) {
  rlimit as{};
  if (::getrlimit(RLIMIT_AS, &as) != 0 || as.rlim_cur == RLIM_INFINITY) return Status::Ok();
  constexpr uint64_t kBlasBytesPerThread = 64ull << 20;
  const uint64_t weights = weights_loaded ? 0 : c.num_params() * sizeof(float);
  const uint64_t pool = o.pool_blocks * c.Layout(o.block_tokens).bytes_per_block();
  const uint64_t need = weights + pool + kBlasBytesPerThread * (uint64_t(o.threads) + 1);
  const uint64_t mapped = MappedBytes();
  const uint64_t limit = static_cast<uint64_t>(as.rlim_cur);
  if (mapped + need <= limit) return Status::Ok();
  return Status::ResourceExhausted(
      "engine: model '" + c.name + "' with a pool of " + std::to_string(o.pool_blocks) +
      " blocks needs about " + FormatBytes(need) + " more memory, but the process may map only " +
      FormatBytes(limit) + " (ulimit -v) and maps " + FormatBytes(mapped) +
      " already: raise the limit, or use a smaller model or pool");
}

}  // namespace

Status EngineOptions::Validate() const {
  if (gguf.empty() && !ModelPreset(model).ok()) {
    return Status::InvalidArgument("engine: model: unknown preset '" + model +
                                   "' (known: tiny, small)");
  }
  if (block_tokens == 0 || block_tokens > 4096) {
    return Status::InvalidArgument("engine: block_tokens: must be in [1, 4096]");
  }
  if (pool_blocks == 0) return Status::InvalidArgument("engine: pool_blocks: must be > 0");
  if (threads < 1 || threads > 256) {
    return Status::InvalidArgument("engine: threads: must be in [1, 256]");
  }
  return Status::Ok();
}

uint64_t TurnPoolBlocks(uint64_t prompt_tokens, uint32_t decode_tokens, uint32_t block_tokens) {
  if (prompt_tokens == 0 || block_tokens == 0) return 0;
  // The last decoded token is never fed back, so its position holds no KV.
  const uint64_t positions = prompt_tokens + std::max<uint32_t>(decode_tokens, 1) - 1;
  return (positions - 1) / block_tokens + 1;
}

TokenId Argmax(std::span<const float> logits) {
  size_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  return static_cast<TokenId>(best);
}

Engine::Engine(EngineOptions options, Model model, std::unique_ptr<KvPool> pool,
               std::string model_revision)
    : options_(std::move(options)),
      model_(std::move(model)),
      pool_(std::move(pool)),
      model_revision_(std::move(model_revision)) {}

Result<std::unique_ptr<Engine>> Engine::Create(const EngineOptions& options) {
  KVTIER_RETURN_IF_ERROR(options.Validate());
  ModelConfig config;
  std::shared_ptr<const Weights> weights;
  std::string revision;
  if (!options.gguf.empty()) {
    KVTIER_ASSIGN_OR_RETURN(GgufModel g, LoadGguf(options.gguf));
    KVTIER_RETURN_IF_ERROR(CheckAddressSpace(g.config, options, /*weights_loaded=*/true));
    config = std::move(g.config);
    weights = std::make_shared<const Weights>(std::move(g.weights));
    revision = std::move(g.revision);
  } else {
    KVTIER_ASSIGN_OR_RETURN(config, ModelPreset(options.model));
    KVTIER_RETURN_IF_ERROR(CheckAddressSpace(config, options, /*weights_loaded=*/false));
    weights = std::make_shared<const Weights>(RandomWeights(config, options.seed));
    revision = RandomWeightsRevision(config, options.seed);
  }
  KVTIER_ASSIGN_OR_RETURN(Model model, Model::Create(config, std::move(weights)));
  KVTIER_ASSIGN_OR_RETURN(auto pool,
                          KvPool::Create(config.Layout(options.block_tokens), options.pool_blocks));
  KVTIER_RETURN_IF_ERROR(blas::LoadBlas());  // after the address-space check: it maps buffers
  SetBlasThreads(options.threads);
  return std::unique_ptr<Engine>(
      new Engine(options, std::move(model), std::move(pool), std::move(revision)));
}

Result<std::unique_ptr<Engine>> Engine::CreateSharing(const Engine& other,
                                                      const EngineOptions& options) {
  KVTIER_RETURN_IF_ERROR(options.Validate());
  KVTIER_ASSIGN_OR_RETURN(Model model,
                          Model::Create(other.model_.config(), other.model_.shared_weights()));
  KVTIER_ASSIGN_OR_RETURN(
      auto pool,
      KvPool::Create(other.model_.config().Layout(options.block_tokens), options.pool_blocks));
  SetBlasThreads(options.threads);
  return std::unique_ptr<Engine>(
      new Engine(options, std::move(model), std::move(pool), other.model_revision_));
}

Status Engine::AttachCache(Cache* cache) {
  if (cache != nullptr && cache->layout() != layout()) {
    return Status::InvalidArgument("engine: cache layout " + cache->layout().ToString() +
                                   " differs from the engine's " + layout().ToString());
  }
  cache_ = cache;
  if (cache_ != nullptr && options_.write_back) {
    pool_->SetEvictionListener([this](const BlockKey& key, uint32_t position, ConstBlock bytes) {
      // A failed write-back only loses reuse: the block is recomputed when it returns.
      (void)cache_->StoreKeys(std::span<const BlockKey>(&key, 1),
                              std::span<const ConstBlock>(&bytes, 1), position);
    });
  } else {
    pool_->SetEvictionListener(nullptr);
  }
  SetPlanner(planner_);
  return Status::Ok();
}

void Engine::SetPlanner(std::shared_ptr<const Planner> planner) {
  planner_ = std::move(planner);
  planner_tier_.clear();
  if (cache_ == nullptr || planner_ == nullptr) return;
  for (int t = 0; t < cache_->num_tiers(); ++t) {
    planner_tier_.push_back(planner_->profile().FindTier(cache_->tier(t).name()));
  }
}

BlockKey Engine::Root(const RequestOptions& request) const {
  if (cache_ != nullptr) return cache_->Root(request);
  Namespace ns;
  ns.model_id = model_.config().name;
  ns.model_revision = model_revision_;
  ns.layout_fingerprint = pool_->layout().fingerprint();
  ns.tenant = request.tenant;
  ns.lora_id = request.lora_id;
  return ns.Root();
}

void Engine::ChooseReuse(const Result<LookupResult>& found, uint32_t n, uint32_t resident,
                         const TurnOptions& opt, TurnResult* r, uint32_t* recompute,
                         uint32_t* load) const {
  const uint32_t hits = r->tier_hit_blocks;
  if (hits == 0) return;
  const LookupResult& lookup = *found;
  switch (opt.mode) {
    case ReuseMode::kLoad:
      *load = hits;
      break;
    case ReuseMode::kRecompute:
      *recompute = hits;
      break;
    case ReuseMode::kSplit:
      *recompute = std::min(opt.split_blocks, hits);
      *load = hits - *recompute;
      break;
    case ReuseMode::kAuto:
      if (planner_ == nullptr) {
        *load = hits;
      } else {
        PlanRequest req;
        req.prompt_tokens = n;
        req.resident_blocks = resident;
        for (uint32_t i = 0; i < hits; ++i) {
          const int src = lookup.source[i];
          req.block_tier.push_back(
              src >= 0 && src < static_cast<int>(planner_tier_.size()) ? planner_tier_[src] : -1);
        }
        r->plan = planner_->Choose(req);
        r->planned = true;
        *recompute = r->plan.recompute_blocks;
        *load = r->plan.load_blocks;
      }
      break;
  }
}

Result<TurnResult> Engine::RunTurn(std::span<const TokenId> prompt, const TurnOptions& opt) {
  const double t0 = MonotonicSeconds();
  const uint32_t n = static_cast<uint32_t>(prompt.size());
  const uint32_t bt = options_.block_tokens;
  const ModelConfig& c = model_.config();
  if (n == 0) return Status::InvalidArgument("turn: empty prompt");
  const uint32_t decode = std::max<uint32_t>(opt.decode_tokens, 1);
  if (uint64_t{n} + decode - 1 > c.max_positions) {
    return Status::InvalidArgument("turn: " + std::to_string(n) + " prompt + " +
                                   std::to_string(decode) + " decode tokens exceed max_positions " +
                                   std::to_string(c.max_positions));
  }
  for (TokenId t : prompt) {
    if (t >= c.vocab_size) {
      return Status::InvalidArgument("turn: token " + std::to_string(t) +
                                     " is outside the vocabulary of " +
                                     std::to_string(c.vocab_size));
    }
  }
  TurnResult r;
  r.prompt_tokens = n;
  const bool use_cache = opt.use_cache && cache_ != nullptr;

  std::vector<BlockKey> keys;
  HashPrefix(Root(opt.request), bt, prompt, &keys);
  const uint32_t full = static_cast<uint32_t>(keys.size());
  const uint32_t usable = std::min(full, (n - 1) / bt);  // the last token's block is computed
  const uint32_t prompt_blocks = (n - 1) / bt + 1;
  const uint32_t total_blocks = static_cast<uint32_t>(TurnPoolBlocks(n, decode, bt));

  TableGuard guard(pool_.get());
  std::vector<BlockId>& table = guard.table;
  table.reserve(total_blocks);
  uint32_t resident = 0;
  if (opt.use_pool) {
    while (resident < usable) {
      auto id = pool_->Find(keys[resident]);
      if (!id) break;
      table.push_back(*id);
      ++resident;
    }
  }
  r.pool_hit_blocks = resident;

  // What the tiers hold after the pool's run, and the plan.
  Result<LookupResult> lookup = Status::NotFound("no lookup");
  uint32_t recompute = 0, load = 0;
  if (use_cache && resident < usable) {
    lookup = cache_->LookupKeys(
        std::span<const BlockKey>(keys).subspan(resident, usable - resident), opt.request);
    if (lookup.ok()) r.tier_hit_blocks = lookup->hit_blocks;
  }
  ChooseReuse(lookup, n, resident, opt, &r, &recompute, &load);

  // Blocks for everything not in the pool: prompt and decode positions.
  while (table.size() < total_blocks) {
    KVTIER_ASSIGN_OR_RETURN(BlockId id, pool_->Allocate());
    table.push_back(id);
  }
  const double t_lookup = MonotonicSeconds();
  r.lookup_s = t_lookup - t0;

  // Load [resident + recompute, + load) straight into the pool blocks, and compute the rest:
  // one after the other, or layer by layer with the load under the compute.
  const uint32_t load_begin = resident + recompute;
  const uint32_t want =
      load > 0 && lookup.ok() ? std::min(load, lookup->hit_blocks - recompute) : 0;
  std::vector<MutableBlock> dst;
  for (uint32_t i = 0; i < want; ++i) dst.push_back(pool_->block(table[load_begin + i]));
  const Span span{prompt, table, resident, load_begin, prompt_blocks};
  uint32_t loaded = 0;
  if (want > 0 && opt.layerwise) {
    KVTIER_ASSIGN_OR_RETURN(loaded, LoadLayerwise(*lookup, recompute, dst, span, opt, &r));
  } else {
    if (want > 0) loaded = LoadBlocks(*lookup, recompute, dst, &r);
    lookup = Status::NotFound("released");  // unpin before computing
    r.load_s = MonotonicSeconds() - t_lookup;
    KVTIER_RETURN_IF_ERROR(ComputeBlocks(span, load_begin, load_begin + loaded, &r));
  }
  lookup = Status::NotFound("released");
  r.loaded_blocks = loaded;
  r.bytes_loaded = uint64_t{loaded} * pool_->block_bytes();
  const uint32_t load_end = load_begin + loaded;
  const double t_compute = MonotonicSeconds();
  r.ttft_s = t_compute - t0;
  r.compute_s = r.ttft_s - r.lookup_s - r.load_s;

  // Publish the prompt's full blocks; store the computed ones down the tiers.
  if (opt.use_pool) {
    for (uint32_t b = resident; b < full; ++b) pool_->Register(table[b], keys[b], b);
  }
  if (use_cache && opt.store && !options_.write_back) {
    auto store = [&](uint32_t from, uint32_t to) {
      if (from >= to) return;
      std::vector<ConstBlock> blocks;
      for (uint32_t b = from; b < to; ++b) blocks.push_back(pool_->block(table[b]));
      Result<StoreResult> sr = cache_->StoreKeys(
          std::span<const BlockKey>(keys).subspan(from, to - from), blocks, from, opt.request);
      if (sr.ok()) {
        r.stored_blocks += sr->stored_blocks;
        r.bytes_stored += uint64_t{sr->stored_blocks} * pool_->block_bytes();
      }
    };
    store(resident, std::min(load_begin, full));
    store(std::min(load_end, full), full);
  }
  const double t_store = MonotonicSeconds();
  r.store_s = t_store - t_compute;

  // Greedy decode; the first token comes from the prompt's logits.
  std::vector<float> step;
  TokenId tok = Argmax(r.logits);
  r.generated.push_back(tok);
  for (uint32_t k = 1; k < decode; ++k) {
    KVTIER_RETURN_IF_ERROR(model_.ForwardChunk(std::span<const TokenId>(&tok, 1), n + k - 1, table,
                                               pool_.get(), &step));
    tok = Argmax(step);
    r.generated.push_back(tok);
  }
  r.decode_s = MonotonicSeconds() - t_store;
  return r;
}

uint32_t Engine::LoadBlocks(const LookupResult& lookup, uint32_t first,
                            std::span<const MutableBlock> dst, TurnResult* r) {
  Result<LoadResult> lr = cache_->Load(lookup, first, dst);
  if (!lr.ok()) {
    r->load_failed_blocks += static_cast<uint32_t>(dst.size());
    return 0;
  }
  CountLoaded(lookup, first, *lr, r);
  return lr->loaded_blocks;
}

void Engine::CountLoaded(const LookupResult& lookup, uint32_t first, const LoadResult& lr,
                         TurnResult* r) {
  for (uint32_t i = 0; i < lr.loaded_blocks; ++i) {
    const int t = lookup.source[first + i];
    if (t >= 0 && t < kMaxTiers) ++r->loaded_by_tier[t];
  }
  r->load_failed_blocks += static_cast<uint32_t>(lr.block_status.size()) - lr.loaded_blocks;
}

Status Engine::ComputeBlocks(const Span& s, uint32_t skip_begin, uint32_t skip_end, TurnResult* r) {
  const uint32_t bt = options_.block_tokens, n = static_cast<uint32_t>(s.prompt.size());
  for (uint32_t b = s.resident; b < s.prompt_blocks; ++b) {
    if (b >= skip_begin && b < skip_end) continue;
    const uint32_t begin = b * bt, end = std::min(n, begin + bt);
    KVTIER_RETURN_IF_ERROR(model_.ForwardChunk(s.prompt.subspan(begin, end - begin), begin, s.table,
                                               pool_.get(), end == n ? &r->logits : nullptr));
    r->computed_tokens += end - begin;
  }
  return Status::Ok();
}

Result<uint32_t> Engine::LoadLayerwise(const LookupResult& lookup, uint32_t first,
                                       std::span<const MutableBlock> dst, const Span& s,
                                       const TurnOptions& opt, TurnResult* r) {
  const auto timeout = std::chrono::milliseconds(opt.load_timeout_ms);
  Result<std::unique_ptr<LayerwiseLoad>> lw = cache_->LoadLayerwise(lookup, first, dst);
  if (!lw.ok()) {  // nothing started: every block is computed
    r->load_failed_blocks += static_cast<uint32_t>(dst.size());
    KVTIER_RETURN_IF_ERROR(ComputeBlocks(s, 0, 0, r));
    return uint32_t{0};
  }
  const uint32_t bt = options_.block_tokens, n = static_cast<uint32_t>(s.prompt.size());
  const uint32_t load_end = s.load_begin + static_cast<uint32_t>(dst.size());
  std::vector<Model::Chunk> chunks;
  for (uint32_t b = s.resident; b < s.prompt_blocks; ++b) {
    if (b >= s.load_begin && b < load_end) continue;
    chunks.push_back({b * bt, std::min(n, b * bt + bt) - b * bt});
  }
  double waited = 0;
  const Status pass = model_.ForwardLayerwise(s.prompt, chunks, s.table, pool_.get(), &r->logits,
                                              [&](uint32_t layer) {
                                                const double w0 = MonotonicSeconds();
                                                Status st = (*lw)->WaitLayer(layer, timeout);
                                                waited += MonotonicSeconds() - w0;
                                                return st;
                                              });
  if (!pass.ok()) (*lw)->Cancel();
  const double f0 = MonotonicSeconds();
  Result<LoadResult> lr = (*lw)->Finish(timeout);
  waited += MonotonicSeconds() - f0;
  lw->reset();  // joins the loader: no byte lands after this
  uint32_t loaded = 0;
  if (lr.ok()) {
    CountLoaded(lookup, first, *lr, r);
    loaded = lr->loaded_blocks;
  } else {
    r->load_failed_blocks += static_cast<uint32_t>(dst.size());
  }
  r->load_s = waited;
  if (pass.ok() && loaded == dst.size()) {
    for (const Model::Chunk& c : chunks) r->computed_tokens += c.n;
    return loaded;
  }
  // A block that failed, and every chunk after it that attended to it, is computed again;
  // when the pass itself stopped, its unfinished chunks before the load are too.
  r->layerwise_fallbacks += 1;
  if (!pass.ok()) {
    KVTIER_RETURN_IF_ERROR(ComputeBlocks(s, s.load_begin, s.load_begin + loaded, r));
  } else {
    Span tail = s;
    tail.resident = s.load_begin + loaded;
    KVTIER_RETURN_IF_ERROR(ComputeBlocks(tail, 0, 0, r));
    for (const Model::Chunk& c : chunks)
      if (c.pos / bt < s.load_begin) r->computed_tokens += c.n;
  }
  return loaded;
}

}  // namespace kvtier::engine
