#include "sim/routed_replay.h"

#include <algorithm>

#include "common/clock.h"
#include "sim/api_replay.h"

namespace kvtier::sim {
namespace {

constexpr RouterKind kRouters[] = {RouterKind::kMedium, RouterKind::kGpuOnly,
                                   RouterKind::kRoundRobin, RouterKind::kAffinity};

// splitmix64's finalizer: session ids are small consecutive numbers.
uint64_t Mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Picks a replica for each request and keeps the live-session counts its ties use.
class Router {
 public:
  Router(RouterKind kind, const EventView& view, std::vector<std::vector<double>> tier_weights)
      : kind_(kind),
        view_(view),
        weights_(std::move(tier_weights)),
        live_(view.replicas(), 0),
        scores_(view.replicas(), 0) {}

  // The replica for q; *matched: the best score was > 0.
  uint32_t Pick(const workload::ReplayRequest& q, std::span<const BlockKey> keys, bool* matched) {
    const uint32_t n = view_.replicas();
    *matched = false;
    if (kind_ == RouterKind::kRoundRobin) return static_cast<uint32_t>(requests_++ % n);
    if (kind_ == RouterKind::kAffinity) return static_cast<uint32_t>(Mix(q.session) % n);
    for (uint32_t r = 0; r < n; ++r) scores_[r] = view_.Score(r, keys, weights_[r]);
    uint32_t best = 0;
    for (uint32_t r = 1; r < n; ++r) {
      if (scores_[r] > scores_[best] || (scores_[r] == scores_[best] && live_[r] < live_[best]))
        best = r;
    }
    *matched = scores_[best] > 0;
    return best;
  }

  // Records that q went to replica r; true when its session's previous request went elsewhere.
  bool Routed(const workload::ReplayRequest& q, uint32_t r) {
    auto [it, fresh] = where_.try_emplace(q.session, r);
    const bool moved = !fresh && it->second != r;
    if (!fresh) --live_[it->second];
    it->second = r;
    ++live_[r];
    if (q.session_last) {
      --live_[r];
      where_.erase(it);
    }
    return moved;
  }

 private:
  const RouterKind kind_;
  const EventView& view_;
  const std::vector<std::vector<double>> weights_;  // per replica, per tier
  std::vector<uint64_t> live_;                      // live sessions per replica
  std::vector<double> scores_;
  std::unordered_map<uint64_t, uint32_t> where_;  // live session -> replica of its latest request
  uint64_t requests_ = 0;
};

struct Replicas {
  std::vector<std::unique_ptr<Cache>> caches;
  std::vector<Cache*> raw;
};

Result<Replicas> OpenReplicas(const RoutedReplayOptions& o, EventView* view) {
  Replicas out;
  for (uint32_t r = 0; r < o.replicas; ++r) {
    KVTIER_ASSIGN_OR_RETURN(CacheOptions co, o.cache_options(r));
    co.on_event = view->Listener(r);
    co.write_queue_blocks = 0;
    KVTIER_ASSIGN_OR_RETURN(auto cache, Cache::Open(std::move(co)));
    out.raw.push_back(cache.get());
    out.caches.push_back(std::move(cache));
  }
  return out;
}

std::vector<TierKind> KindsOf(Cache& cache) {
  std::vector<TierKind> kinds;
  for (int t = 0; t < cache.num_tiers(); ++t) kinds.push_back(cache.tier(t).kind());
  return kinds;
}

}  // namespace

std::string_view RouterName(RouterKind router) {
  switch (router) {
    case RouterKind::kMedium:
      return "medium";
    case RouterKind::kGpuOnly:
      return "gpu-only";
    case RouterKind::kRoundRobin:
      return "round-robin";
    case RouterKind::kAffinity:
      return "affinity";
  }
  return "?";
}

Result<RouterKind> ParseRouter(std::string_view name) {
  for (RouterKind r : kRouters) {
    if (RouterName(r) == name) return r;
  }
  return Status::InvalidArgument("unknown router '" + std::string(name) +
                                 "' (medium, gpu-only, round-robin, affinity)");
}

MediumWeights WeightsOf(RouterKind router) {
  MediumWeights w;
  auto set = [&](TierKind k, double v) { w.by_kind[static_cast<size_t>(k)] = v; };
  if (router == RouterKind::kMedium || router == RouterKind::kGpuOnly)
    set(TierKind::kEmulatedDevice, 1.0);
  if (router == RouterKind::kMedium) {
    set(TierKind::kHost, 0.8);
    set(TierKind::kDisk, 0.5);
  }
  return w;
}

std::vector<double> TierWeights(const MediumWeights& w, std::span<const TierKind> tier_kinds) {
  std::vector<double> out;
  for (TierKind k : tier_kinds) out.push_back(w.of(k));
  return out;
}

EventView::EventView(uint32_t replicas) : replicas_(replicas), held_(replicas) {}

KvEventCallback EventView::Listener(uint32_t replica) {
  return [this, replica](const KvEvent& e) { OnEvent(replica, e); };
}

void EventView::OnEvent(uint32_t replica, const KvEvent& e) {
  MutexLock lock(&mu_);
  ++events_;
  auto& held = held_[replica];
  switch (e.type) {
    case KvEvent::Type::kStored:
      held[e.key] |= static_cast<TierMask>(1u << e.tier);
      break;
    case KvEvent::Type::kRemoved: {
      auto it = held.find(e.key);
      if (it == held.end()) break;
      it->second &= static_cast<TierMask>(~(1u << e.tier));
      if (it->second == 0) held.erase(it);
      break;
    }
    case KvEvent::Type::kCleared:
      held.clear();
      if (e.resident) {
        for (const KvEventBlock& b : *e.resident)
          held[b.key] |= static_cast<TierMask>(1u << b.tier);
      }
      break;
  }
}

double EventView::Score(uint32_t replica, std::span<const BlockKey> keys,
                        std::span<const double> tier_weights) const {
  MutexLock lock(&mu_);
  const auto& held = held_[replica];
  double score = 0;
  for (const BlockKey& k : keys) {
    auto it = held.find(k);
    if (it == held.end()) break;
    double best = 0;
    for (size_t t = 0; t < tier_weights.size(); ++t) {
      if (it->second & (1u << t)) best = std::max(best, tier_weights[t]);
    }
    if (best <= 0) break;
    score += best;
  }
  return score;
}

std::vector<BlockKey> EventView::Announced(uint32_t replica, int tier) const {
  MutexLock lock(&mu_);
  std::vector<BlockKey> out;
  for (const auto& [key, mask] : held_[replica]) {
    if (mask & (1u << tier)) out.push_back(key);
  }
  return out;
}

uint64_t EventView::events() const {
  MutexLock lock(&mu_);
  return events_;
}

Status CheckViewAgainstCaches(const EventView& view, std::span<Cache* const> caches) {
  for (uint32_t r = 0; r < caches.size(); ++r) {
    const CacheStats st = caches[r]->stats();
    for (int t = 0; t < caches[r]->num_tiers(); ++t) {
      const std::vector<BlockKey> announced = view.Announced(r, t);
      auto there = std::make_unique<bool[]>(announced.size() + 1);
      KVTIER_RETURN_IF_ERROR(
          caches[r]->tier(t).Exists(announced, std::span<bool>(there.get(), announced.size())));
      const auto absent = std::count(there.get(), there.get() + announced.size(), false);
      const uint64_t resident = st.tiers[t].resident_blocks;
      if (absent > 0 || resident != announced.size()) {
        return Status::Internal("replica " + std::to_string(r) + " tier " + std::to_string(t) +
                                ": the router's view has " + std::to_string(announced.size()) +
                                " blocks (" + std::to_string(absent) + " not in the tier), the " +
                                "tier holds " + std::to_string(resident));
      }
    }
  }
  return Status::Ok();
}

Status RoutedReplayOptions::Validate() const {
  if (replicas == 0 || replicas > 64)
    return Status::InvalidArgument("replicas: 1..64, got " + std::to_string(replicas));
  if (!cache_options) return Status::InvalidArgument("cache_options: not set");
  return Status::Ok();
}

Result<RoutedReplayResult> ReplayRouted(workload::RequestStream& stream,
                                        const RoutedReplayOptions& o, const ProgressFn& progress) {
  KVTIER_RETURN_IF_ERROR(o.Validate());
  EventView view(o.replicas);
  KVTIER_ASSIGN_OR_RETURN(Replicas reps, OpenReplicas(o, &view));
  RoutedReplayResult res;
  res.router = std::string(RouterName(o.router));
  res.total.policy = res.router;
  res.tier_kinds = KindsOf(*reps.raw[0]);
  res.requests_per_replica.assign(o.replicas, 0);
  std::vector<std::vector<double>> weights;
  for (Cache* c : reps.raw) weights.push_back(TierWeights(WeightsOf(o.router), KindsOf(*c)));
  Router router(o.router, view, std::move(weights));
  ApiReplayOptions ao;
  ao.events = o.events;
  ao.load_hits = true;
  ChainHasher hasher;
  workload::ReplayRequest q;
  uint64_t n_req = 0;
  const double start = MonotonicSeconds();
  stream.Rewind();
  while (stream.Next(&q)) {
    size_t common = 0;
    std::span<const BlockKey> keys = hasher.Keys(q, &common);
    bool matched = false;
    const uint32_t r = router.Pick(q, keys, &matched);
    Result<LookupResult> lookup =
        ReplayRequestThroughApi(*reps.raw[r], q, keys, ao, &res.total.inserted_blocks);
    if (!lookup.ok()) return lookup.status().WithContext("request " + std::to_string(n_req));
    res.moved_requests += router.Routed(q, r);
    res.matched_requests += matched;
    ++res.requests_per_replica[r];
    for (int t = 0; t < kMaxTiers; ++t) res.hit_blocks_by_tier[t] += lookup->blocks_by_tier[t];
    CountRequest(&res.total, q, lookup->hit_blocks);
    if (q.trace >= res.per_trace.size()) res.per_trace.resize(q.trace + 1);
    CountRequest(&res.per_trace[q.trace], q, lookup->hit_blocks);
    if (progress && (n_req & 1023) == 1023) progress(stream.progress());
    ++n_req;
  }
  KVTIER_RETURN_IF_ERROR(stream.status());
  res.total.seconds = MonotonicSeconds() - start;
  stream.Rewind();
  KVTIER_RETURN_IF_ERROR(CheckViewAgainstCaches(view, reps.raw));
  res.events = view.events();
  return res;
}

}  // namespace kvtier::sim
