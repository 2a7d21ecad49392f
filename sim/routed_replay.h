// Routed replay: a trace's requests spread over replicas, each a real Cache whose first tier is
// an emulated_device (the GPU stand-in) above a host tier (and optionally an SSD tier), by a
// router that learns what each replica holds only from the replica's KV events, as llm-d's or
// Dynamo's router does from vLLM's stream (doc/events.md, "Routing on kvtier's events: a
// check"). Each request is the API replay's (ReplayRequestThroughApi, its hit blocks loaded, so
// the Cache promotes them into the device tier) on the replica the router picked.
//
// Routers: "medium" scores a replica by the longest prefix of the request's chain it announced,
// each block credited with its best medium there (GPU 1.0, CPU 0.8, STORAGE 0.5, as llm-d);
// "gpu-only" the same crediting GPU blocks only (what a router reading only the engine's own GPU
// events sees); ties, a zero score included, go to the replica with the fewest live sessions
// (a session is live on the replica of its latest request until its last one), then the lowest
// index. "round-robin" (per request) and "affinity" (a hash of the session id) ignore events.
//
// Thread-safety: EventView's methods may be called from any thread; ReplayRouted is reentrant
// and uses its stream alone.
#ifndef KVTIER_SIM_ROUTED_REPLAY_H_
#define KVTIER_SIM_ROUTED_REPLAY_H_

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"
#include "kvtier/cache.h"
#include "kvtier/events.h"
#include "sim/cache_replay.h"

namespace kvtier::sim {

enum class RouterKind : uint8_t { kMedium, kGpuOnly, kRoundRobin, kAffinity };
std::string_view RouterName(RouterKind router);
// "medium", "gpu-only", "round-robin", "affinity"; InvalidArgument otherwise.
Result<RouterKind> ParseRouter(std::string_view name);

// A router's credit for a block announced in each medium; 0: not credited (the block ends the
// prefix as if it were not announced).
struct MediumWeights {
  std::array<double, kNumTierKinds> by_kind{};  // indexed by TierKind (its default medium)
  double of(TierKind kind) const { return by_kind[static_cast<size_t>(kind)]; }
};
// kMedium: GPU 1.0, CPU 0.8, STORAGE 0.5, REMOTE 0; kGpuOnly: GPU 1.0 only; others: none.
MediumWeights WeightsOf(RouterKind router);

// A tier's medium is its kind's default (GPU, CPU, STORAGE, REMOTE), as the Cache publishes it:
// per tier of a cache, the weight w gives its medium.
std::vector<double> TierWeights(const MediumWeights& w, std::span<const TierKind> tier_kinds);

// What a router knows of the replicas: per replica, each announced block and the tiers it was
// announced in, learnt only from KvEvents (kStored, kRemoved, kCleared with its resident list).
class EventView {
 public:
  explicit EventView(uint32_t replicas);
  // The on_event callback for replica r (valid while this view lives).
  KvEventCallback Listener(uint32_t replica);
  void OnEvent(uint32_t replica, const KvEvent& event);
  // The summed weight of the longest prefix of keys announced on replica in a tier of weight
  // > 0 (tier_weights[t]; tiers past its end weigh 0), each block counted at its best tier.
  double Score(uint32_t replica, std::span<const BlockKey> keys,
               std::span<const double> tier_weights) const;
  // The blocks announced in tier `tier` of replica r, in no order.
  std::vector<BlockKey> Announced(uint32_t replica, int tier) const;
  uint64_t events() const;
  uint32_t replicas() const { return replicas_; }

 private:
  using TierMask = uint8_t;  // bit t: announced in tier t
  const uint32_t replicas_;
  mutable Mutex mu_;
  std::vector<std::unordered_map<BlockKey, TierMask, BlockKeyHash>> held_ KVTIER_GUARDED_BY(mu_);
  uint64_t events_ KVTIER_GUARDED_BY(mu_) = 0;
};

// OK when every tier of every replica holds exactly what view announced for it: each announced
// block Exists there and the tier's resident block count equals the number announced. Internal
// naming the replica, tier and counts otherwise; a tier's own Exists error.
Status CheckViewAgainstCaches(const EventView& view, std::span<Cache* const> caches);

struct RoutedReplayOptions {
  RouterKind router = RouterKind::kMedium;
  uint32_t replicas = 2;
  EngineEvents events = EngineEvents::kClose;
  // The options of replica r's Cache, fastest tier first. ReplayRouted sets on_event and
  // write_queue_blocks = 0 (writes and promotions in the caller's thread: repeatable figures).
  std::function<Result<CacheOptions>(uint32_t replica)> cache_options;

  Status Validate() const;
};

struct RoutedReplayResult {
  std::string router;
  CacheReplayResult total;
  std::vector<CacheReplayResult> per_trace;  // by ReplayRequest::trace
  std::vector<uint64_t> requests_per_replica;
  std::array<uint64_t, kMaxTiers> hit_blocks_by_tier{};  // where the hits were served from
  std::vector<TierKind> tier_kinds;                      // of replica 0's tiers
  uint64_t moved_requests = 0;    // sent to another replica than their session's previous one
  uint64_t matched_requests = 0;  // the router's best score was > 0 (it followed a prefix)
  uint64_t events = 0;            // KV events the router read
};

// Replays the stream (rewound first and after) over options.replicas fresh Caches routed by
// options.router, then checks the router's view against the caches (CheckViewAgainstCaches).
// InvalidArgument for bad options; a Cache's or a request's error; the check's Internal.
Result<RoutedReplayResult> ReplayRouted(workload::RequestStream& stream,
                                        const RoutedReplayOptions& options,
                                        const ProgressFn& progress = {});

}  // namespace kvtier::sim

#endif  // KVTIER_SIM_ROUTED_REPLAY_H_
