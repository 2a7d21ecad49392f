#include "workload/synthetic.h"

#include <algorithm>
#include <cmath>
#include <queue>
#include <string>
#include <vector>

namespace kvtier::workload {
namespace {

// SplitMix64 / xoshiro-style generator with portable distributions.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed ^ 0x9e3779b97f4a7c15ull) {}
  uint64_t Next() {
    uint64_t z = (s_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }  // [0, 1)
  double Normal() {
    // Box-Muller; one value per call keeps the sequence simple.
    double u1 = Uniform();
    double u2 = Uniform();
    if (u1 < 1e-300) u1 = 1e-300;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  double LogNormal(double median, double sigma) { return median * std::exp(sigma * Normal()); }
  // Geometric on {1, 2, ...} with this mean.
  uint32_t Geometric(double mean) {
    if (mean <= 1) return 1;
    const double p = 1.0 / mean;
    const double u = 1.0 - Uniform();
    return 1 + static_cast<uint32_t>(std::min(1e6, std::floor(std::log(u) / std::log1p(-p))));
  }
  double Exponential(double mean) { return -mean * std::log(1.0 - Uniform()); }

 private:
  uint64_t s_;
};

constexpr uint64_t kSystemIdBase = 1ull << 62;
constexpr uint64_t kSubagentSystemIdBase = (1ull << 62) + (1ull << 40);

struct Plan {
  uint32_t turns = 0;
  double start_s = 0;
  uint64_t parent = 0;  // 0 = top-level
  bool subagent = false;
  // (parent turn index, child plan index) for the sub-agents a top-level session spawns.
  std::vector<std::pair<uint32_t, uint32_t>> children;
};

struct Live {
  uint32_t plan = 0;
  uint32_t turn = 0;
  double next_s = 0;
  uint64_t tokens = 0;
  uint64_t next_id = 0;  // session-private id counter
  std::vector<uint64_t> ids;
  Rng rng{0};
  size_t child_cursor = 0;
};

class SyntheticStream final : public RequestStream {
 public:
  explicit SyntheticStream(const SyntheticOptions& o) : o_(o) {
    root_ = Namespace{.model_id = "synthetic"}.Root();
    BuildPlans();
    Rewind();
  }

  bool Next(ReplayRequest* out) override {
    if (pending_ >= 0) {
      Advance(static_cast<uint32_t>(pending_));
      pending_ = -1;
    }
    if (heap_.empty()) return false;
    const auto [time, slot] = heap_.top();
    heap_.pop();
    Live& s = live_[slot];
    const Plan& p = plans_[s.plan];
    out->session = s.plan + 1;
    out->parent_session = p.parent;
    out->trace = 0;
    out->start_s = time;
    out->think_s = s.turn == 0 ? 0 : last_think_[slot];
    out->api_s = -1;
    out->prompt_tokens = static_cast<uint32_t>(s.tokens);
    out->output_tokens =
        static_cast<uint32_t>(std::max(1.0, s.rng.Exponential(o_.output_mean_tokens)));
    out->block_tokens = o_.block_tokens;
    out->root = root_;
    out->ids = s.ids;
    out->session_first = s.turn == 0;
    out->session_last = s.turn + 1 == p.turns;
    out->stop = StopKind::kToolUse;
    last_output_[slot] = out->output_tokens;
    ++emitted_;
    pending_ = static_cast<int64_t>(slot);
    return true;
  }

  double progress() const override {
    return total_ == 0 ? 1.0 : static_cast<double>(emitted_) / static_cast<double>(total_);
  }

  void Rewind() override {
    heap_ = {};
    live_.clear();
    last_think_.clear();
    last_output_.clear();
    free_slots_.clear();
    emitted_ = 0;
    pending_ = -1;
    for (uint32_t i = 0; i < plans_.size(); ++i) {
      if (!plans_[i].subagent) Start(i, plans_[i].start_s);
    }
  }

 private:
  void BuildPlans() {
    Rng rng(o_.seed);
    uint64_t total = 0;
    double t = 0;
    while (total < o_.requests) {
      Plan p;
      p.turns = static_cast<uint32_t>(
          std::min<uint64_t>(rng.Geometric(o_.turns_mean), o_.requests - total));
      p.start_s = t;
      t += o_.session_interarrival_s > 0 ? rng.Exponential(o_.session_interarrival_s) : 0;
      total += p.turns;
      const uint32_t parent = static_cast<uint32_t>(plans_.size());
      plans_.push_back(p);
      for (uint32_t turn = 0; turn + 1 < p.turns && total < o_.requests; ++turn) {
        if (rng.Uniform() >= o_.subagent_prob) continue;
        Plan c;
        c.subagent = true;
        c.parent = parent + 1;
        c.turns = static_cast<uint32_t>(
            std::min<uint64_t>(rng.Geometric(o_.subagent_turns_mean), o_.requests - total));
        total += c.turns;
        plans_[parent].children.emplace_back(turn, static_cast<uint32_t>(plans_.size()));
        plans_.push_back(c);
      }
    }
    total_ = total;
  }

  void Start(uint32_t plan, double at) {
    uint32_t slot;
    if (!free_slots_.empty()) {
      slot = free_slots_.back();
      free_slots_.pop_back();
    } else {
      slot = static_cast<uint32_t>(live_.size());
      live_.emplace_back();
      last_think_.push_back(0);
      last_output_.push_back(0);
    }
    Live& s = live_[slot];
    s.plan = plan;
    s.turn = 0;
    s.next_s = at;
    s.child_cursor = 0;
    s.rng = Rng(o_.seed * 0x100000001b3ull + plan * 0x9e3779b97f4a7c15ull + 17);
    s.next_id = (static_cast<uint64_t>(plan) + 1) << 32;
    s.ids.clear();
    const Plan& p = plans_[plan];
    s.tokens = p.subagent ? o_.subagent_system_tokens : o_.system_tokens;
    const uint64_t base = p.subagent ? kSubagentSystemIdBase : kSystemIdBase;
    for (uint64_t i = 0; i < s.tokens / o_.block_tokens; ++i) s.ids.push_back(base + i);
    Grow(s, std::max(1.0, s.rng.Exponential(o_.first_turn_tokens)));
    heap_.emplace(at, slot);
  }

  void Grow(Live& s, double add) {
    s.tokens += static_cast<uint64_t>(add);
    const Plan& p = plans_[s.plan];
    const uint64_t system = p.subagent ? o_.subagent_system_tokens : o_.system_tokens;
    if (s.tokens > o_.max_context_tokens) {
      s.tokens = std::min<uint64_t>(o_.max_context_tokens, system + o_.compact_to_tokens);
      Rebuild(s, system);
    }
    while (s.ids.size() < s.tokens / o_.block_tokens) s.ids.push_back(s.next_id++);
  }

  // New content after the system prompt (a compaction, or a turn that reuses nothing).
  void Rebuild(Live& s, uint64_t system_tokens) {
    s.ids.resize(std::min<size_t>(s.ids.size(), system_tokens / o_.block_tokens));
  }

  void Advance(uint32_t slot) {
    const Plan& p = plans_[live_[slot].plan];
    const double now = live_[slot].next_s;
    // Sub-agents this turn spawns start shortly after it. Start() may grow live_, so index it.
    while (live_[slot].child_cursor < p.children.size() &&
           p.children[live_[slot].child_cursor].first == live_[slot].turn) {
      const uint32_t child = p.children[live_[slot].child_cursor++].second;
      const double at = now + 1.0 + live_[slot].rng.Uniform() * 4.0;
      Start(child, at);
    }
    Live& me = live_[slot];
    if (me.turn + 1 >= p.turns) {
      free_slots_.push_back(slot);
      return;
    }
    const double api = 1.0 + last_output_[slot] / 60.0;
    const double sigma = std::log(o_.think_p90_s / o_.think_p50_s) / 1.2815515655446004;
    const double think = std::min(3600.0, me.rng.LogNormal(o_.think_p50_s, sigma));
    last_think_[slot] = think;
    me.turn++;
    me.next_s = now + api + think;
    if (me.rng.Uniform() >= o_.reuse) {
      Rebuild(me, p.subagent ? o_.subagent_system_tokens : o_.system_tokens);
    }
    Grow(me, me.rng.LogNormal(o_.growth_median_tokens, o_.growth_sigma));
    heap_.emplace(me.next_s, slot);
  }

  struct Later {
    bool operator()(const std::pair<double, uint32_t>& a,
                    const std::pair<double, uint32_t>& b) const {
      return a > b;
    }
  };

  SyntheticOptions o_;
  BlockKey root_;
  std::vector<Plan> plans_;
  std::vector<Live> live_;
  std::vector<double> last_think_;
  std::vector<uint32_t> last_output_;
  std::vector<uint32_t> free_slots_;
  std::priority_queue<std::pair<double, uint32_t>, std::vector<std::pair<double, uint32_t>>, Later>
      heap_;
  uint64_t total_ = 0;
  uint64_t emitted_ = 0;
  int64_t pending_ = -1;
};

}  // namespace

Status SyntheticOptions::Validate() const {
  auto bad = [](const std::string& what) {
    return Status::InvalidArgument("synthetic options: " + what);
  };
  if (requests == 0) return bad("requests must be > 0");
  if (block_tokens == 0) return bad("block_tokens must be > 0");
  if (max_context_tokens <= system_tokens || max_context_tokens <= subagent_system_tokens) {
    return bad("max_context_tokens must exceed the system prompts");
  }
  if (!(growth_median_tokens > 0) || !(growth_sigma >= 0)) return bad("growth must be > 0");
  if (!(turns_mean >= 1) || !(subagent_turns_mean >= 1)) return bad("turns means must be >= 1");
  if (!(think_p50_s > 0) || !(think_p90_s >= think_p50_s)) {
    return bad("think_p90_s must be >= think_p50_s > 0");
  }
  if (!(subagent_prob >= 0 && subagent_prob <= 1)) return bad("subagent_prob must be in [0, 1]");
  if (!(reuse >= 0 && reuse <= 1)) return bad("reuse must be in [0, 1]");
  if (!(session_interarrival_s >= 0)) return bad("session_interarrival_s must be >= 0");
  if (!(first_turn_tokens > 0) || !(output_mean_tokens > 0)) return bad("token means must be > 0");
  return Status::Ok();
}

Result<std::unique_ptr<RequestStream>> MakeSyntheticStream(const SyntheticOptions& options) {
  KVTIER_RETURN_IF_ERROR(options.Validate());
  return std::unique_ptr<RequestStream>(std::make_unique<SyntheticStream>(options));
}

}  // namespace kvtier::workload
