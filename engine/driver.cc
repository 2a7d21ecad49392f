#include "engine/driver.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>

#include "engine/measure.h"

namespace kvtier::engine {

Status WorkloadOptions::Validate() const {
  if (sessions == 0 || sessions > 1024) {
    return Status::InvalidArgument("workload: sessions must be in [1, 1024]");
  }
  if (turns == 0 || turns > 1024)
    return Status::InvalidArgument("workload: turns: must be in [1, 1024]");
  if (system_tokens + first_user_tokens == 0) {
    return Status::InvalidArgument("workload: the first prompt is empty");
  }
  if (decode_tokens == 0) return Status::InvalidArgument("workload: decode_tokens: must be >= 1");
  return Status::Ok();
}

uint64_t WorkloadOptions::MaxPromptTokens() const {
  return uint64_t{system_tokens} + first_user_tokens +
         uint64_t{turns > 0 ? turns - 1 : 0} * (uint64_t{turn_tokens} + decode_tokens);
}

uint64_t WorkloadPoolBlocks(const WorkloadOptions& o, uint32_t block_tokens) {
  return TurnPoolBlocks(o.MaxPromptTokens(), o.decode_tokens, block_tokens);
}

namespace {

// Fails up front rather than at the first turn that does not fit, hours in.
Status CheckPool(const char* which, Engine& e, uint64_t need) {
  if (e.pool().capacity_blocks() >= need) return Status::Ok();
  return Status::InvalidArgument(
      std::string("workload: the ") + which + " engine's pool holds " +
      std::to_string(e.pool().capacity_blocks()) + " blocks; the longest turn needs " +
      std::to_string(need) + " blocks of " + std::to_string(e.options().block_tokens) + " tokens");
}

}  // namespace

Result<WorkloadReport> RunWorkload(Engine* engine, Engine* reference, const WorkloadOptions& o,
                                   const std::function<void(const TurnRecord&)>& on_turn) {
  KVTIER_RETURN_IF_ERROR(o.Validate());
  KVTIER_RETURN_IF_ERROR(
      CheckPool("main", *engine, WorkloadPoolBlocks(o, engine->options().block_tokens)));
  // The longest turn must fit the model's positions: refused now, not after the turns before.
  if (const uint64_t longest = o.MaxPromptTokens() + std::max<uint32_t>(o.decode_tokens, 1) - 1;
      longest > engine->config().max_positions) {
    return Status::InvalidArgument(
        "workload: the longest turn holds " + std::to_string(o.MaxPromptTokens()) + " prompt and " +
        std::to_string(o.decode_tokens) + " decode tokens, more than the " +
        std::to_string(engine->config().max_positions) + " positions of model '" +
        engine->config().name + "' (lower --turns, --turn-tokens or --decode)");
  }
  if (reference != nullptr) {  // it recomputes each prompt with one decoded token
    KVTIER_RETURN_IF_ERROR(
        CheckPool("reference", *reference,
                  TurnPoolBlocks(o.MaxPromptTokens(), 1, reference->options().block_tokens)));
  }
  const auto t0 = std::chrono::steady_clock::now();
  const uint32_t vocab = engine->config().vocab_size;
  const std::vector<TokenId> system = SyntheticTokens(o.system_tokens, vocab, o.seed);
  std::vector<std::vector<TokenId>> context(o.sessions, system);
  WorkloadReport rep;
  if (engine->cache() != nullptr) rep.tier_hit_tokens.assign(engine->cache()->num_tiers(), 0);
  std::vector<double> speedups;
  const uint32_t bt = engine->options().block_tokens;
  for (uint32_t turn = 0; turn < o.turns; ++turn) {
    for (uint32_t s = 0; s < o.sessions; ++s) {
      const uint32_t add = turn == 0 ? o.first_user_tokens : o.turn_tokens;
      auto fresh = SyntheticTokens(add, vocab, o.seed * 1000003 + s * 7919 + turn + 1);
      std::vector<TokenId>& ctx = context[s];
      ctx.insert(ctx.end(), fresh.begin(), fresh.end());
      TurnOptions topt;
      topt.decode_tokens = o.decode_tokens;
      topt.request.session_id = s + 1;
      TurnRecord rec;
      rec.session = s;
      rec.turn = turn;
      KVTIER_ASSIGN_OR_RETURN(rec.reuse, engine->RunTurn(ctx, topt));
      if (reference != nullptr) {
        TurnOptions full;
        full.decode_tokens = 1;
        full.use_pool = false;
        full.use_cache = false;
        KVTIER_ASSIGN_OR_RETURN(TurnResult ref, reference->RunTurn(ctx, full));
        rec.checked = true;
        rec.recompute_ttft_s = ref.ttft_s;
        rec.bit_exact = SameBits(ref.logits, rec.reuse.logits);
        ++rep.checked_turns;
        rep.bit_exact_turns += rec.bit_exact;
        if (rec.reuse.pool_hit_blocks + rec.reuse.loaded_blocks > 0 && rec.reuse.ttft_s > 0) {
          speedups.push_back(ref.ttft_s / rec.reuse.ttft_s);
        }
      }
      const TurnResult& r = rec.reuse;
      rep.prompt_tokens += r.prompt_tokens;
      rep.pool_hit_tokens += uint64_t{r.pool_hit_blocks} * bt;
      for (size_t t = 0; t < rep.tier_hit_tokens.size(); ++t) {
        rep.tier_hit_tokens[t] += uint64_t{r.loaded_by_tier[t]} * bt;
      }
      rep.computed_tokens += r.computed_tokens;
      rep.bytes_loaded += r.bytes_loaded;
      rep.bytes_stored += r.bytes_stored;
      ctx.insert(ctx.end(), r.generated.begin(), r.generated.end());
      if (on_turn) on_turn(rec);
      rep.turns.push_back(std::move(rec));
    }
  }
  if (!speedups.empty()) rep.speedup_median = Median(speedups);
  rep.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return rep;
}

std::string WorkloadReport::ToJson() const {
  nlohmann::json j;
  j["turns"] = nlohmann::json::array();
  for (const TurnRecord& t : turns) {
    const TurnResult& r = t.reuse;
    nlohmann::json o = {{"session", t.session},
                        {"turn", t.turn},
                        {"prompt_tokens", r.prompt_tokens},
                        {"pool_hit_blocks", r.pool_hit_blocks},
                        {"loaded_blocks", r.loaded_blocks},
                        {"computed_tokens", r.computed_tokens},
                        {"bytes_loaded", r.bytes_loaded},
                        {"bytes_stored", r.bytes_stored},
                        {"ttft_ms", r.ttft_s * 1e3},
                        {"checked", t.checked}};
    if (r.planned) o["plan"] = std::string(PlanChoiceName(r.plan.choice));
    if (t.checked) {
      o["recompute_ttft_ms"] = t.recompute_ttft_s * 1e3;
      o["bit_exact"] = t.bit_exact;
    }
    j["turns"].push_back(o);
  }
  j["bit_exact_turns"] = bit_exact_turns;
  j["checked_turns"] = checked_turns;
  j["speedup_median"] = speedup_median;
  j["prompt_tokens"] = prompt_tokens;
  j["pool_hit_tokens"] = pool_hit_tokens;
  j["tier_hit_tokens"] = tier_hit_tokens;
  j["computed_tokens"] = computed_tokens;
  j["bytes_loaded"] = bytes_loaded;
  j["bytes_stored"] = bytes_stored;
  j["wall_s"] = wall_s;
  return j.dump(2) + "\n";
}

}  // namespace kvtier::engine
