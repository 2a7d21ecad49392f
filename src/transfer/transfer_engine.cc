// The transfer engine: a bounded FIFO of copy chunks drained by worker threads.
//
// Lock order: a worker takes Impl::mu_ (to pop) and then, after dropping it, the transfer's own
// TransferHandle::State::mu (to start or finish a chunk); nothing holds both. Waiters sleep on
// their transfer's cv; Post sleeps on the engine's space_cv_.
#include "transfer/transfer.h"

#include <algorithm>
#include <deque>
#include <string>
#include <thread>

#include "common/copy.h"
#include "common/mutex.h"

namespace kvtier {

struct TransferHandle::State {
  struct Copy {
    const std::byte* src;
    std::byte* dst;
    size_t bytes;
    uint32_t layer;
  };

  std::vector<Copy> copies;
  uint32_t num_layers = 1;
  uint64_t bytes = 0;
  TransferEngine::Impl* engine = nullptr;

  Mutex mu;
  CondVar cv;  // a layer or the whole transfer finished, or it was cancelled (under mu)
  TransferState state KVTIER_GUARDED_BY(mu) = TransferState::kPrepared;
  std::vector<size_t> layer_left KVTIER_GUARDED_BY(mu);  // copies not done, per layer
  size_t copies_left KVTIER_GUARDED_BY(mu) = 0;
  int in_flight KVTIER_GUARDED_BY(mu) = 0;  // copies a worker is doing now
  bool cancelled KVTIER_GUARDED_BY(mu) = false;
};

using Transfer = TransferHandle::State;
using Copy = TransferHandle::State::Copy;

namespace {

std::string Ms(std::chrono::milliseconds ms) { return std::to_string(ms.count()) + " ms"; }

}  // namespace

std::string_view TransferStateName(TransferState state) {
  switch (state) {
    case TransferState::kPrepared:
      return "prepared";
    case TransferState::kPosted:
      return "posted";
    case TransferState::kDone:
      return "done";
    case TransferState::kCancelled:
      return "cancelled";
  }
  return "unknown";
}

Status TransferOptions::Validate() const {
  if (threads < 1 || threads > 64)
    return Status::InvalidArgument("threads: " + std::to_string(threads) + " is not in 1..64");
  if (queue_bytes == 0) return Status::InvalidArgument("queue_bytes: must be > 0");
  if (chunk_bytes < 4096)
    return Status::InvalidArgument("chunk_bytes: " + std::to_string(chunk_bytes) +
                                   " is below 4096");
  return Status::Ok();
}

class TransferEngine::Impl {
 public:
  explicit Impl(const TransferOptions& options) : options_(options) {
    for (int i = 0; i < options_.threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
  }

  ~Impl() {
    {
      MutexLock lock(&mu_);
      stop_ = true;
    }
    work_cv_.SignalAll();
    space_cv_.SignalAll();
    for (auto& w : workers_) w.join();
    // Whatever is still queued was never started: mark those transfers cancelled.
    for (auto& item : queue_) Finish(item.t.get(), /*copied=*/false);
  }

  Status Post(const std::shared_ptr<Transfer>& t, std::chrono::milliseconds timeout) {
    const MonotonicClock::time_point deadline = MonotonicNow() + timeout;
    {
      MutexLock tl(&t->mu);
      if (t->state != TransferState::kPrepared)
        return Status::InvalidArgument("transfer is " + std::string(TransferStateName(t->state)) +
                                       ", not prepared: post it once");
    }
    {
      MutexLock lock(&mu_);
      if (!WaitForSpace(t->bytes, deadline))
        return Status::ResourceExhausted("transfer queue full for " + Ms(timeout) + " (" +
                                         std::to_string(queued_bytes_) + " of " +
                                         std::to_string(options_.queue_bytes) + " bytes queued)");
      {
        MutexLock tl(&t->mu);
        t->state = t->copies.empty() ? TransferState::kDone : TransferState::kPosted;
      }
      if (!t->copies.empty()) {
        queued_bytes_ += t->bytes;
        for (size_t i = 0; i < t->copies.size(); ++i) queue_.push_back({t, i});
      }
    }
    work_cv_.SignalAll();
    return Status::Ok();
  }

  // Takes t's copies out of the queue and waits for those in progress.
  void Cancel(Transfer* t) {
    {
      MutexLock tl(&t->mu);
      if (t->state != TransferState::kPosted) return;
      t->cancelled = true;
    }
    std::vector<uint32_t> dropped_layers;
    {
      MutexLock lock(&mu_);
      for (auto it = queue_.begin(); it != queue_.end();) {
        if (it->t.get() != t) {
          ++it;
          continue;
        }
        const Copy& c = t->copies[it->copy];
        queued_bytes_ -= c.bytes;
        dropped_layers.push_back(c.layer);
        it = queue_.erase(it);
      }
    }
    space_cv_.SignalAll();
    MutexLock tl(&t->mu);
    for (uint32_t l : dropped_layers) --t->layer_left[l];
    t->copies_left -= dropped_layers.size();
    while (t->in_flight != 0) t->cv.Wait(&t->mu);
    if (t->state == TransferState::kPosted) t->state = TransferState::kCancelled;
    t->cv.SignalAll();
  }

  size_t queued_bytes() {
    MutexLock lock(&mu_);
    return queued_bytes_;
  }

  const TransferOptions& options() const { return options_; }

 private:
  struct Item {
    std::shared_ptr<Transfer> t;
    size_t copy;
  };

  // Waits until bytes more fit in the queue (or it is empty); false at the deadline or stopping.
  bool WaitForSpace(uint64_t bytes, MonotonicClock::time_point deadline) KVTIER_REQUIRES(mu_) {
    bool ok = true;
    while (!stop_ && !queue_.empty() && queued_bytes_ + bytes > options_.queue_bytes) {
      if (!space_cv_.WaitUntil(&mu_, deadline)) {
        ok = stop_ || queue_.empty() || queued_bytes_ + bytes <= options_.queue_bytes;
        break;
      }
    }
    return ok && !stop_;
  }

  void WorkerLoop() {
    for (;;) {
      Item item;
      {
        MutexLock lock(&mu_);
        if (!PopLocked(&item)) return;
      }
      Transfer* t = item.t.get();
      const Copy& c = t->copies[item.copy];
      space_cv_.SignalAll();  // PopLocked took c's bytes off the queue
      bool run;
      {
        MutexLock tl(&t->mu);
        run = !t->cancelled;
        if (run) ++t->in_flight;
      }
      if (run) CopyBlock(c.dst, c.src, c.bytes);
      MutexLock tl(&t->mu);
      if (run) --t->in_flight;
      --t->layer_left[c.layer];
      if (--t->copies_left == 0 && !t->cancelled) t->state = TransferState::kDone;
      t->cv.SignalAll();
    }
  }

  // Pops the next item, sleeping while the queue is empty; false once stopping.
  bool PopLocked(Item* out) KVTIER_REQUIRES(mu_) {
    while (queue_.empty() && !stop_) work_cv_.Wait(&mu_);
    if (stop_) return false;
    *out = std::move(queue_.front());
    queue_.pop_front();
    queued_bytes_ -= out->t->copies[out->copy].bytes;
    return true;
  }

  static void Finish(Transfer* t, bool copied) {
    MutexLock tl(&t->mu);
    if (t->state == TransferState::kPosted)
      t->state = copied ? TransferState::kDone : TransferState::kCancelled;
    t->cv.SignalAll();
  }

  const TransferOptions options_;
  Mutex mu_;
  CondVar work_cv_;   // items queued, or stopping (under mu_)
  CondVar space_cv_;  // queued bytes went down (under mu_)
  std::deque<Item> queue_ KVTIER_GUARDED_BY(mu_);
  uint64_t queued_bytes_ KVTIER_GUARDED_BY(mu_) = 0;
  bool stop_ KVTIER_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

// --- TransferHandle ---------------------------------------------------------------------------

TransferHandle::TransferHandle(TransferHandle&& other) noexcept : t_(std::move(other.t_)) {}

TransferHandle& TransferHandle::operator=(TransferHandle&& other) noexcept {
  if (this != &other) {
    Release();
    t_ = std::move(other.t_);
  }
  return *this;
}

TransferHandle::~TransferHandle() { Release(); }

TransferState TransferHandle::Poll() const {
  if (!t_) return TransferState::kCancelled;
  MutexLock tl(&t_->mu);
  return t_->state;
}

Status TransferHandle::Wait(std::chrono::milliseconds timeout) const {
  if (!t_) return Status::InvalidArgument("Wait on an empty transfer handle");
  Transfer* t = t_.get();
  MutexLock tl(&t->mu);
  if (t->state == TransferState::kPrepared)
    return Status::InvalidArgument("Wait on a transfer that was not posted");
  const MonotonicClock::time_point deadline = MonotonicNow() + timeout;
  while (t->state == TransferState::kPosted)
    if (!t->cv.WaitUntil(&t->mu, deadline)) break;
  if (t->state == TransferState::kPosted)
    return Status::Unavailable("transfer timed out after " + Ms(timeout));
  if (t->state == TransferState::kCancelled) return Status::Unavailable("transfer was cancelled");
  return Status::Ok();
}

Status TransferHandle::WaitLayer(uint32_t layer, std::chrono::milliseconds timeout) const {
  if (!t_) return Status::InvalidArgument("WaitLayer on an empty transfer handle");
  Transfer* t = t_.get();
  if (layer >= t->num_layers)
    return Status::InvalidArgument("layer " + std::to_string(layer) + " is not below " +
                                   std::to_string(t->num_layers));
  MutexLock tl(&t->mu);
  if (t->state == TransferState::kPrepared)
    return Status::InvalidArgument("WaitLayer on a transfer that was not posted");
  const MonotonicClock::time_point deadline = MonotonicNow() + timeout;
  while (!(t->layer_left[layer] == 0 || t->cancelled))
    if (!t->cv.WaitUntil(&t->mu, deadline)) break;
  if (!(t->layer_left[layer] == 0 || t->cancelled))
    return Status::Unavailable("layer " + std::to_string(layer) +
                               " of the transfer timed out after " + Ms(timeout));
  if (t->cancelled) return Status::Unavailable("transfer was cancelled");
  return Status::Ok();
}

uint32_t TransferHandle::num_layers() const { return t_ ? t_->num_layers : 0; }
uint64_t TransferHandle::bytes() const { return t_ ? t_->bytes : 0; }
size_t TransferHandle::num_copies() const { return t_ ? t_->copies.size() : 0; }

void TransferHandle::Cancel() {
  if (t_) t_->engine->Cancel(t_.get());
}

void TransferHandle::Release() {
  Cancel();
  t_.reset();
}

// --- TransferEngine ---------------------------------------------------------------------------

TransferEngine::TransferEngine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TransferEngine::~TransferEngine() = default;

Result<std::unique_ptr<TransferEngine>> TransferEngine::Open(const TransferOptions& options) {
  KVTIER_RETURN_IF_ERROR(options.Validate());
  return std::unique_ptr<TransferEngine>(new TransferEngine(std::make_unique<Impl>(options)));
}

const TransferOptions& TransferEngine::options() const { return impl_->options(); }
size_t TransferEngine::queued_bytes() const { return impl_->queued_bytes(); }

Result<TransferHandle> TransferEngine::Prepare(std::span<const CopySegment> segments,
                                               uint32_t num_layers) {
  if (num_layers == 0) return Status::InvalidArgument("num_layers: must be >= 1");
  std::vector<size_t> order(segments.size());
  for (size_t i = 0; i < segments.size(); ++i) {
    const CopySegment& s = segments[i];
    if (s.bytes > 0 && (s.src == nullptr || s.dst == nullptr))
      return Status::InvalidArgument("segment " + std::to_string(i) + ": null buffer");
    if (s.layer >= num_layers)
      return Status::InvalidArgument("segment " + std::to_string(i) + ": layer " +
                                     std::to_string(s.layer) + " is not below " +
                                     std::to_string(num_layers));
    order[i] = i;
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return segments[a].layer < segments[b].layer; });

  auto t = std::make_shared<Transfer>();
  t->engine = impl_.get();
  t->num_layers = num_layers;
  std::vector<Copy> merged;
  for (size_t i : order) {
    const CopySegment& s = segments[i];
    if (s.bytes == 0) continue;
    if (!merged.empty()) {
      Copy& last = merged.back();
      if (last.layer == s.layer && last.src + last.bytes == s.src &&
          last.dst + last.bytes == s.dst) {
        last.bytes += s.bytes;
        continue;
      }
    }
    merged.push_back({s.src, s.dst, s.bytes, s.layer});
  }
  const size_t chunk = impl_->options().chunk_bytes;
  for (const Copy& c : merged) {
    for (size_t off = 0; off < c.bytes; off += chunk)
      t->copies.push_back({c.src + off, c.dst + off, std::min(chunk, c.bytes - off), c.layer});
    t->bytes += c.bytes;
  }
  {
    MutexLock tl(&t->mu);
    t->layer_left.assign(num_layers, 0);
    for (const Copy& c : t->copies) ++t->layer_left[c.layer];
    t->copies_left = t->copies.size();
  }
  TransferHandle h;
  h.t_ = std::move(t);
  return h;
}

Status TransferEngine::Post(TransferHandle& handle, std::chrono::milliseconds timeout) {
  if (!handle.valid()) return Status::InvalidArgument("Post of an empty transfer handle");
  if (handle.t_->engine != impl_.get())
    return Status::InvalidArgument("Post of a transfer prepared by another engine");
  return impl_->Post(handle.t_, timeout);
}

Result<std::vector<CopySegment>> LayerwiseSegments(const KvLayout& layout,
                                                   std::span<const std::span<const std::byte>> src,
                                                   std::span<const std::span<std::byte>> dst) {
  if (src.size() != dst.size())
    return Status::InvalidArgument(std::to_string(src.size()) + " source blocks for " +
                                   std::to_string(dst.size()) + " destinations");
  const uint64_t bb = layout.bytes_per_block();
  const uint64_t lb = layout.layer_bytes();
  std::vector<CopySegment> out;
  out.reserve(src.size() * layout.num_layers);
  for (size_t i = 0; i < src.size(); ++i) {
    if (src[i].size() != bb || dst[i].size() != bb)
      return Status::InvalidArgument(
          "block " + std::to_string(i) + ": " + std::to_string(src[i].size()) + " -> " +
          std::to_string(dst[i].size()) + " bytes, the layout has " + std::to_string(bb));
  }
  for (uint32_t l = 0; l < layout.num_layers; ++l)
    for (size_t i = 0; i < src.size(); ++i)
      out.push_back({src[i].data() + l * lb, dst[i].data() + l * lb, lb, l});
  return out;
}

}  // namespace kvtier
