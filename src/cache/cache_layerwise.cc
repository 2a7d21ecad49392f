// Layer-wise loads (Cache::LoadLayerwise): a thread per load reads layer l of every block, from
// the tiers that read slices, before layer l + 1 of any; blocks of other tiers come whole first.
// Blocks are checked whole in Finish, once every layer is in.
#include <condition_variable>
#include <mutex>
#include <thread>

#include "cache/cache_impl.h"

namespace kvtier {

class LayerwiseLoad::State {
 public:
  Cache::Impl* impl = nullptr;
  std::vector<BlockKey> keys;  // block i of the load
  std::vector<int8_t> source;
  std::vector<MutableBlock> dst;
  uint32_t first = 0;
  uint64_t hit_tokens = 0;
  uint32_t layers = 0;
  uint64_t layer_bytes = 0;
  uint64_t t0 = 0;
  // Written by the loader thread only until `finished`; read by the caller after it.
  std::vector<Status> status;
  std::vector<uint64_t> checksums;  // the tier's whole-block checksum (slice reads)
  std::vector<bool> whole;          // read whole (verified as Load verifies)

  Mutex mu;
  CondVar cv;  // layers_done or finished changed
  uint32_t layers_done KVTIER_GUARDED_BY(mu) = 0;
  bool finished KVTIER_GUARDED_BY(mu) = false;
  std::atomic<bool> cancel{false};
  bool reported = false;
  std::thread thread;

  void Run();
  // The blocks of one tier: Get them whole, or remember them for the layer passes.
  void ReadWhole(TierState& st, const std::vector<uint32_t>& idx);
  void ReadLayer(TierState& st, const std::vector<uint32_t>& idx, uint32_t layer);
  void Publish(uint32_t done, bool end) {
    {
      MutexLock l(&mu);
      layers_done = done;
      finished = finished || end;
    }
    cv.SignalAll();
  }
};

void LayerwiseLoad::State::ReadWhole(TierState& st, const std::vector<uint32_t>& idx) {
  std::vector<BlockKey> k;
  std::vector<MutableBlock> b;
  for (uint32_t i : idx) {
    k.push_back(keys[i]);
    b.push_back(dst[i]);
    whole[i] = true;
  }
  std::vector<Status> res(idx.size());
  const Status call = st.tier->Get(k, b, res);
  for (size_t j = 0; j < idx.size(); ++j) status[idx[j]] = call.ok() ? res[j] : call;
}

void LayerwiseLoad::State::ReadLayer(TierState& st, const std::vector<uint32_t>& idx,
                                     uint32_t layer) {
  std::vector<uint32_t> live;
  std::vector<BlockKey> k;
  std::vector<MutableBlock> b;
  for (uint32_t i : idx) {
    if (!status[i].ok()) continue;  // failed on an earlier layer: recomputed anyway
    live.push_back(i);
    k.push_back(keys[i]);
    b.push_back(dst[i].subspan(uint64_t{layer} * layer_bytes, layer_bytes));
  }
  if (live.empty()) return;
  std::vector<Status> res(live.size());
  std::vector<uint64_t> ck(layer == 0 ? live.size() : 0);
  const Status call = st.tier->GetSlice(k, uint64_t{layer} * layer_bytes, b, ck, res);
  for (size_t j = 0; j < live.size(); ++j) {
    status[live[j]] = call.ok() ? res[j] : call;
    if (layer == 0) checksums[live[j]] = ck[j];
  }
}

void LayerwiseLoad::State::Run() {
  std::vector<std::pair<TierState*, std::vector<uint32_t>>> sliced;
  for (auto& st : impl->tiers_) {
    std::vector<uint32_t> idx;
    for (uint32_t i = 0; i < keys.size(); ++i)
      if (source[i] == st->index) idx.push_back(i);
    if (idx.empty()) continue;
    if (st->caps.reads_slices) {
      sliced.emplace_back(st.get(), std::move(idx));
    } else {
      ReadWhole(*st, idx);
    }
  }
  for (uint32_t l = 0; l < layers; ++l) {
    if (cancel.load(std::memory_order_relaxed)) break;
    for (auto& [st, idx] : sliced) ReadLayer(*st, idx, l);
    Publish(l + 1, l + 1 == layers);
  }
  if (sliced.empty() || cancel.load(std::memory_order_relaxed)) {
    MutexLock lk(&mu);
    if (sliced.empty()) layers_done = layers;  // every block came whole
    finished = true;
  }
  cv.SignalAll();
}

Result<std::unique_ptr<LayerwiseLoad>> Cache::Impl::LoadLayerwise(
    const LookupResult& lookup, uint32_t first, std::span<const MutableBlock> dst) {
  KVTIER_RETURN_IF_ERROR(CheckLoad("LoadLayerwise", lookup, first, dst));
  auto s = std::make_unique<LayerwiseLoad::State>();
  s->impl = this;
  s->t0 = MonotonicNs();
  s->first = first;
  s->hit_tokens = lookup.hit_tokens();
  s->keys.assign(lookup.keys.begin() + first, lookup.keys.begin() + first + dst.size());
  s->source.assign(lookup.source.begin() + first, lookup.source.begin() + first + dst.size());
  s->dst.assign(dst.begin(), dst.end());
  s->layers = options_.layout.num_layers;
  s->layer_bytes = options_.layout.layer_bytes();
  s->status.assign(dst.size(), Status::Ok());
  s->checksums.assign(dst.size(), 0);
  s->whole.assign(dst.size(), false);
  if (dst.empty()) {
    MutexLock l(&s->mu);
    s->layers_done = s->layers;
    s->finished = true;
  } else {
    LayerwiseLoad::State* raw = s.get();
    s->thread = std::thread([raw] { raw->Run(); });
  }
  return std::make_unique<LayerwiseLoad>(std::move(s));
}

LayerwiseLoad::LayerwiseLoad(std::unique_ptr<State> state) : state_(std::move(state)) {}

LayerwiseLoad::~LayerwiseLoad() { Cancel(); }

uint32_t LayerwiseLoad::num_layers() const { return state_->layers; }
uint32_t LayerwiseLoad::num_blocks() const { return static_cast<uint32_t>(state_->keys.size()); }

void LayerwiseLoad::Cancel() {
  state_->cancel.store(true, std::memory_order_relaxed);
  if (state_->thread.joinable()) state_->thread.join();
}

Status LayerwiseLoad::WaitLayer(uint32_t layer, std::chrono::milliseconds timeout) {
  State& s = *state_;
  if (layer >= s.layers)
    return Status::InvalidArgument("WaitLayer: layer " + std::to_string(layer) + " of a load of " +
                                   std::to_string(s.layers) + " layers");
  const MonotonicClock::time_point deadline = MonotonicNow() + timeout;
  MutexLock l(&s.mu);
  while (!(s.layers_done > layer || s.finished))
    if (!s.cv.WaitUntil(&s.mu, deadline)) break;
  if (!(s.layers_done > layer || s.finished))
    return Status::Unavailable("layer-wise load: layer " + std::to_string(layer) +
                               " timed out after " + std::to_string(timeout.count()) + " ms");
  if (s.layers_done > layer) return Status::Ok();
  return Status::Unavailable("layer-wise load stopped before layer " + std::to_string(layer));
}

Result<LoadResult> LayerwiseLoad::Finish(std::chrono::milliseconds timeout) {
  State& s = *state_;
  {
    const MonotonicClock::time_point deadline = MonotonicNow() + timeout;
    MutexLock l(&s.mu);
    while (!s.finished)
      if (!s.cv.WaitUntil(&s.mu, deadline)) break;
    if (!s.finished)
      return Status::Unavailable("layer-wise load timed out after " +
                                 std::to_string(timeout.count()) + " ms");
  }
  if (s.thread.joinable()) s.thread.join();
  if (s.reported) return Status::InvalidArgument("LayerwiseLoad::Finish: already finished");
  s.reported = true;
  uint32_t layers_done = 0;  // final: the loader thread has ended
  {
    MutexLock l(&s.mu);
    layers_done = s.layers_done;
  }
  Cache::Impl& c = *s.impl;
  const size_t n = s.keys.size();
  LoadResult r;
  r.block_status = std::move(s.status);
  for (size_t i = 0; i < n; ++i) {
    Status& st = r.block_status[i];
    TierState& ts = *c.tiers_[s.source[i]];
    // A tier that checks its own reads reported this one; count it as Load does.
    if (st.code() == StatusCode::kCorruption && !ts.cache_verifies)
      ts.corruptions.fetch_add(1, std::memory_order_relaxed);
    if (st.ok() && !s.whole[i] && layers_done < s.layers)
      st = Status::Unavailable("layer-wise load cancelled at layer " + std::to_string(layers_done));
    if (st.ok() && c.options_.verify_checksums) {
      // A slice reader hands back its own whole-block checksum; otherwise the index's is used
      // for the tiers whose reads the Cache verifies.
      uint64_t want = 0;
      if (!s.whole[i] && ts.caps.verifies_reads) {
        want = s.checksums[i];
      } else if (ts.cache_verifies) {
        IndexEntry e;
        if (c.index_.Get(s.keys[i], &e)) want = e.checksum;
      }
      if (want != 0 && Checksum64(s.dst[i]) != want) {
        st = Status::Corruption("tier '" + ts.tier->name() + "': block " + s.keys[i].ToHex() +
                                " failed its checksum");
        ts.corruptions.fetch_add(1, std::memory_order_relaxed);
      }
    }
    if (st.code() == StatusCode::kCorruption || st.code() == StatusCode::kNotFound)
      c.DropBlock(ts, s.keys[i]);
  }
  while (r.loaded_blocks < n && r.block_status[r.loaded_blocks].ok()) ++r.loaded_blocks;
  r.bytes = uint64_t{r.loaded_blocks} * c.options_.layout.bytes_per_block();
  c.load_failed_blocks_.fetch_add(n - r.loaded_blocks, std::memory_order_relaxed);
  c.PromoteLoaded(s.keys, s.source, s.first, s.dst, r.loaded_blocks, s.hit_tokens,
                  /*promote_now=*/false);
  c.loads_.fetch_add(1, std::memory_order_relaxed);
  c.load_latency_.Record(MonotonicNs() - s.t0);
  return r;
}

}  // namespace kvtier
