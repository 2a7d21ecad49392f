#include "sim/api_replay.h"

#include <algorithm>
#include <vector>

#include "common/clock.h"

namespace kvtier::sim {

KvLayout ReplayLayout(uint32_t block_tokens) {
  KvLayout l;
  l.num_layers = 1;
  l.num_kv_heads = 1;
  l.head_dim = 1;
  l.dtype = DType::kFp8;
  l.attention = AttentionKind::kMla;
  l.block_tokens = block_tokens;
  return l;
}

std::string ReplayLibraryPolicy(std::string_view p) {
  if (p == "lru" || p == "lru-tail") return "lru";
  return std::string(p.starts_with("lib:") ? p.substr(4) : p);
}

CacheOptions ReplayCacheOptions(const KvLayout& layout, uint64_t blocks, std::string_view policy) {
  CacheOptions co;
  co.layout = layout;
  co.model_id = "kvtier-replay";
  TierSpec host;
  host.kind = "host";
  host.capacity_bytes = blocks * layout.bytes_per_block();
  host.threads = 1;
  host.eviction = ReplayLibraryPolicy(policy);
  host.params["prefault"] = "false";
  co.tiers.push_back(host);
  return co;
}

Result<LookupResult> ReplayRequestThroughApi(KvCache& cache, const workload::ReplayRequest& q,
                                             std::span<const BlockKey> keys,
                                             const ApiReplayOptions& o, uint64_t* inserted) {
  const uint32_t bt = cache.layout().block_tokens;
  const uint64_t bb = cache.layout().bytes_per_block();
  if (q.block_tokens != bt)
    return Status::InvalidArgument("the trace has " + std::to_string(q.block_tokens) +
                                   "-token blocks, the cache " + std::to_string(bt));
  RequestOptions ro;
  ro.session_id = q.session;
  KVTIER_ASSIGN_OR_RETURN(LookupResult lookup, cache.LookupKeys(keys, ro));
  const uint32_t matched = lookup.hit_blocks;
  if (o.load_hits && matched > 0) {
    std::vector<std::byte> into(matched * bb);
    std::vector<MutableBlock> dst;
    dst.reserve(matched);
    for (uint32_t i = 0; i < matched; ++i) dst.emplace_back(into.data() + i * bb, bb);
    KVTIER_ASSIGN_OR_RETURN(LoadResult loaded, cache.Load(lookup, dst));
    if (loaded.loaded_blocks < matched) {
      const Status why = loaded.loaded_blocks < loaded.block_status.size()
                             ? loaded.block_status[loaded.loaded_blocks]
                             : Status::Internal("a hit block was not loaded");
      return why.WithContext("load of a hit block");
    }
  }
  // As an engine after its Load: the pins go before the new blocks are stored.
  lookup.pins.Release();
  if (matched < keys.size()) {
    const std::vector<std::byte> zeros(bb);
    const std::vector<ConstBlock> blocks(keys.size() - matched, ConstBlock(zeros.data(), bb));
    KVTIER_ASSIGN_OR_RETURN(StoreResult s,
                            cache.StoreKeys(keys.subspan(matched), blocks, matched, ro));
    if (s.stored_blocks + s.present_blocks == 0 && !s.first_error.ok() &&
        s.first_error.code() != StatusCode::kResourceExhausted)
      return s.first_error;
    *inserted += s.stored_blocks;
  }
  if (const auto event = EngineEventAfter(o.events, q)) cache.NotifySession(q.session, *event);
  return lookup;
}

Result<CacheReplayResult> ReplayThroughApi(workload::RequestStream& stream, KvCache& cache,
                                           const ApiReplayOptions& o, const ProgressFn& progress) {
  CacheReplayResult res;
  res.capacity_tokens = o.capacity_tokens;
  ChainHasher hasher;
  workload::ReplayRequest q;
  uint64_t n_req = 0;
  const double start = MonotonicSeconds();
  stream.Rewind();
  while (stream.Next(&q)) {
    size_t common = 0;
    std::span<const BlockKey> keys = hasher.Keys(q, &common);
    Result<LookupResult> lookup = ReplayRequestThroughApi(cache, q, keys, o, &res.inserted_blocks);
    if (!lookup.ok()) return lookup.status().WithContext("request " + std::to_string(n_req));
    CountRequest(&res, q, lookup->hit_blocks);
    if (o.after_request) o.after_request();
    if (progress && (n_req & 1023) == 1023) progress(stream.progress());
    ++n_req;
  }
  KVTIER_RETURN_IF_ERROR(stream.status());
  res.seconds = MonotonicSeconds() - start;
  const uint64_t bb = cache.layout().bytes_per_block();
  const CacheStats st = cache.stats();
  if (!st.tiers.empty()) {
    res.evicted_blocks = st.tiers[0].evictions;
    res.capacity_blocks = st.tiers[0].tier.capacity_bytes / std::max<uint64_t>(bb, 1);
  }
  stream.Rewind();
  return res;
}

}  // namespace kvtier::sim
