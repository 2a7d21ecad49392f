// Engine: the reference inference engine — a Model, its KvPool, and the kvtier Cache wired
// into every turn's prefill.
//
// One turn (RunTurn) of a prompt of N tokens:
//   1. hash the prompt's full blocks (the Cache's key chain);
//   2. take the leading blocks still registered in the pool (free);
//   3. Cache::LookupKeys for the next ones, ask the Planner to load / recompute / split, and
//      Cache::Load the chosen blocks straight into pool blocks;
//   4. compute every other block, one aligned chunk per block (see model.h), to the logits of
//      the last prompt token (TTFT ends here);
//   5. register the prompt's full blocks in the pool and Cache::StoreKeys the computed ones
//      (write-through; with write_back they are stored when the pool evicts them instead);
//   6. greedy-decode a few tokens (their KV is private to the turn and never cached: it is not
//      computed as an aligned chunk, so it could not match a full recompute bit for bit).
// The block holding the last prompt token is always computed, so a prompt is never served
// entirely from cache without logits.
//
// Thread-safety: none; one thread drives an Engine. Ownership: the Engine owns its model and
// pool; an attached Cache and Planner are shared and must outlive their use.
#ifndef KVTIER_ENGINE_ENGINE_H_
#define KVTIER_ENGINE_ENGINE_H_

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/config.h"
#include "engine/kv_pool.h"
#include "engine/model.h"
#include "engine/weights.h"
#include "kvtier/cache.h"
#include "kvtier/planner.h"
#include "kvtier/status.h"

namespace kvtier::engine {

struct EngineOptions {
  std::string model = "small";  // a preset (ModelPresetNames()); ignored when gguf is set
  std::string gguf;             // path of a Llama GGUF file (F32/F16)
  uint64_t seed = 1;            // random weights
  uint32_t block_tokens = 64;
  uint64_t pool_blocks = 256;  // capacity of the pool ("HBM"), in blocks
  int threads = 1;             // OpenBLAS threads
  bool write_back = false;     // store blocks when the pool evicts them, not after prefill

  // OK, or InvalidArgument naming the field.
  Status Validate() const;
};

// How a turn gets its prefix; kAuto asks the planner (or loads all when there is none).
enum class ReuseMode : uint8_t { kAuto, kLoad, kRecompute, kSplit };

struct TurnOptions {
  uint32_t decode_tokens = 4;  // greedy tokens after the prompt (>= 1 gives the first token)
  bool use_pool = true;        // reuse blocks still registered in the pool
  bool use_cache = true;       // look up, load and store through the attached Cache
  bool store = true;           // store the computed blocks (false: a measurement that repeats)
  ReuseMode mode = ReuseMode::kAuto;
  uint32_t split_blocks = 0;  // kSplit: recompute this many leading cached blocks
  // Load layer by layer under the compute (Cache::LoadLayerwise): layer l of the new tokens
  // runs while layer l + 1 of the prefix is read. Same logits, bit for bit.
  bool layerwise = false;
  uint32_t load_timeout_ms = 30000;  // a load slower than this is abandoned: recomputed
  RequestOptions request;
};

struct TurnResult {
  std::vector<float> logits;  // next-token logits after the last prompt token
  std::vector<TokenId> generated;
  uint32_t prompt_tokens = 0;
  uint32_t pool_hit_blocks = 0;  // served by the pool
  uint32_t tier_hit_blocks = 0;  // found in the Cache's tiers (loadable)
  uint32_t loaded_blocks = 0;    // actually loaded from tiers
  std::array<uint32_t, kMaxTiers> loaded_by_tier{};
  uint32_t load_failed_blocks = 0;
  uint32_t layerwise_fallbacks = 0;  // layer-wise passes redone because a block failed
  uint32_t computed_tokens = 0;
  uint32_t stored_blocks = 0;  // newly written to a tier
  uint64_t bytes_loaded = 0;
  uint64_t bytes_stored = 0;
  bool planned = false;
  Plan plan;            // what the planner chose (when planned)
  double ttft_s = 0;    // turn start -> logits of the last prompt token
  double lookup_s = 0;  // hashing + pool match + Cache lookup + plan
  double load_s = 0;    // layer-wise: the time the compute waited for the load
  double compute_s = 0;
  double store_s = 0;  // after TTFT
  double decode_s = 0;
};

class Engine {
 public:
  // Builds the model (preset + seed, or GGUF) and the pool; sets the BLAS thread count.
  static Result<std::unique_ptr<Engine>> Create(const EngineOptions& options);
  // An engine sharing `other`'s weights (no second copy), with its own pool.
  static Result<std::unique_ptr<Engine>> CreateSharing(const Engine& other,
                                                       const EngineOptions& options);

  const EngineOptions& options() const { return options_; }
  const ModelConfig& config() const { return model_.config(); }
  // The weights fingerprint that goes into the namespace root (RandomWeightsRevision for a
  // preset, GgufModel::revision for a file): engines with different weights never share keys.
  const std::string& model_revision() const { return model_revision_; }
  KvLayout layout() const { return pool_->layout(); }
  KvPool& pool() { return *pool_; }
  Model& model() { return model_; }

  // Attaches a Cache whose layout equals layout() (InvalidArgument otherwise); nullptr
  // detaches. With write_back, pool evictions are stored to it.
  Status AttachCache(Cache* cache);
  Cache* cache() const { return cache_; }
  // The planner used by ReuseMode::kAuto; tiers are matched to the Cache's by name.
  void SetPlanner(std::shared_ptr<const Planner> planner);

  // One turn; see the file comment. InvalidArgument for an empty prompt, a token outside the
  // vocabulary or a prompt longer than max_positions; ResourceExhausted when the pool cannot
  // hold the turn. Tier failures never fail a turn: those blocks are recomputed.
  Result<TurnResult> RunTurn(std::span<const TokenId> prompt, const TurnOptions& options = {});

 private:
  // The blocks of a turn's prompt: [resident, prompt_blocks) are loaded or computed.
  struct Span {
    std::span<const TokenId> prompt;
    std::span<const BlockId> table;
    uint32_t resident = 0;
    uint32_t load_begin = 0;
    uint32_t prompt_blocks = 0;
  };
  Engine(EngineOptions options, Model model, std::unique_ptr<KvPool> pool,
         std::string model_revision);
  // How many of the tier hits to recompute (the head) and to load: by opt.mode or the planner.
  void ChooseReuse(const Result<LookupResult>& lookup, uint32_t n, uint32_t resident,
                   const TurnOptions& opt, TurnResult* r, uint32_t* recompute,
                   uint32_t* load) const;
  // Cache::Load of dst (blocks first.. of lookup); returns the leading blocks delivered.
  uint32_t LoadBlocks(const LookupResult& lookup, uint32_t first, std::span<const MutableBlock> dst,
                      TurnResult* r);
  void CountLoaded(const LookupResult& lookup, uint32_t first, const LoadResult& lr, TurnResult* r);
  // Computes blocks [s.resident, s.prompt_blocks) but [skip_begin, skip_end), chunk by chunk.
  Status ComputeBlocks(const Span& s, uint32_t skip_begin, uint32_t skip_end, TurnResult* r);
  // Loads dst layer by layer while computing the other blocks; recomputes what a failed block
  // touched. Returns the leading blocks delivered.
  Result<uint32_t> LoadLayerwise(const LookupResult& lookup, uint32_t first,
                                 std::span<const MutableBlock> dst, const Span& s,
                                 const TurnOptions& opt, TurnResult* r);
  BlockKey Root(const RequestOptions& request) const;

  EngineOptions options_;
  Model model_;
  std::unique_ptr<KvPool> pool_;
  std::string model_revision_;
  Cache* cache_ = nullptr;
  std::shared_ptr<const Planner> planner_;
  std::vector<int> planner_tier_;  // cache tier index -> planner profile tier (-1: unknown)
};

// Index of the largest logit (the first on ties).
TokenId Argmax(std::span<const float> logits);

// Pool blocks one turn holds at once: its prompt's and its decode positions' (a resident
// prefix included). A pool smaller than this fails the turn with ResourceExhausted; 0 for an
// empty prompt or block_tokens 0.
uint64_t TurnPoolBlocks(uint64_t prompt_tokens, uint32_t decode_tokens, uint32_t block_tokens);

}  // namespace kvtier::engine

#endif  // KVTIER_ENGINE_ENGINE_H_
