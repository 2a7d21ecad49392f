#include "tiers/disk/disk_store.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "tiers/disk/disk_segment.h"
#include "tiers/disk/format.h"

namespace kvtier::disk {

DiskStore::DiskStore(const DiskOptions& options, RemovalFn on_removed)
    : options_(options),
      segment_bytes_(options.effective_segment_bytes()),
      record_bytes_(options.record_bytes()),
      on_removed_(std::move(on_removed)),
      capacity_bytes_(options.capacity_bytes) {}
DiskStore::~DiskStore() {
  if (sync_thread_.joinable()) {
    {
      MutexLock l(&sync_mu_);
      stop_ = true;
    }
    sync_cv_.SignalAll();
    sync_thread_.join();
  }
  {
    // The active segment gives back its preallocated tail before the final sync.
    MutexLock l(&mu_);
    if (active_ != nullptr &&
        ::ftruncate(active_->fd, static_cast<off_t>(active_->bytes.load())) == 0) {
      active_->synced = false;
    }
  }
  if (options_.sync != SyncPolicy::kNone) {
    MutexLock w(&write_mu_);
    Status st = writer_ != nullptr ? SyncLocked() : Status::Ok();
    if (!st.ok()) spdlog::error("disk tier {}: sync at close: {}", options_.path, st.ToString());
  }
  {
    MutexLock l(&mu_);
    active_.reset();
    segments_.clear();
  }
  if (dir_fd_ >= 0) ::close(dir_fd_);  // releases the flock
}

Result<std::unique_ptr<DiskStore::IoContext>> DiskStore::MakeContext() {
  auto ctx = std::make_unique<IoContext>();
  const uint64_t n =
      std::clamp<uint64_t>(options_.buffer_bytes / record_bytes_, 1, options_.queue_depth);
  IoEngineOptions eo;
  // After a ring failed, new contexts do not try io_uring again (see Put).
  eo.backend = ring_failed_.load(std::memory_order_relaxed) ? IoBackend::kSync : options_.io;
  eo.queue_depth = static_cast<uint32_t>(n);
  eo.register_buffers = options_.register_buffers;
  for (uint64_t i = 0; i < n; ++i) {
    ctx->buffers.emplace_back(record_bytes_);
    eo.buffers.push_back(ctx->buffers.back().span());
  }
  ctx->iov.resize(n);
  KVTIER_ASSIGN_OR_RETURN(ctx->engine,
                          options_.make_io_engine ? options_.make_io_engine(eo) : MakeIoEngine(eo));
  return ctx;
}

std::unique_ptr<DiskStore::IoContext> DiskStore::AcquireReader() {
  {
    MutexLock l(&pool_mu_);
    if (!readers_.empty()) {
      auto ctx = std::move(readers_.back());
      readers_.pop_back();
      return ctx;
    }
  }
  auto ctx = MakeContext();
  if (!ctx.ok()) return nullptr;
  return std::move(ctx).value();
}

void DiskStore::ReleaseReader(std::unique_ptr<IoContext> ctx) {
  MutexLock l(&pool_mu_);
  readers_.push_back(std::move(ctx));
}

void DiskStore::RetireContext(std::unique_ptr<IoContext> ctx) {
  MutexLock l(&pool_mu_);
  broken_.push_back(std::move(ctx));
}
void DiskStore::Unaccount(const Location& loc) {
  auto s = segments_.find(loc.segment_id);
  if (s != segments_.end()) {
    s->second->live_bytes -= record_bytes_;
    --s->second->live_blocks;
  }
}

void DiskStore::Publish(const BlockKey& key, const Location& loc) {
  auto it = index_.find(key);
  if (it != index_.end()) {
    Unaccount(it->second);
    it->second = loc;
  } else {
    index_.emplace(key, loc);
  }
  auto s = segments_.find(loc.segment_id);
  if (s != segments_.end()) {
    s->second->live_bytes += record_bytes_;
    ++s->second->live_blocks;
    s->second->records.emplace_back(key, loc.offset);
  }
}
std::vector<BlockKey> DiskStore::Keys() const {
  MutexLock l(&mu_);
  std::vector<BlockKey> keys;
  keys.reserve(index_.size());
  for (const auto& [key, loc] : index_) keys.push_back(key);
  return keys;
}

void DiskStore::Exists(std::span<const BlockKey> keys, std::span<bool> out) const {
  MutexLock l(&mu_);
  for (size_t i = 0; i < keys.size(); ++i) out[i] = index_.count(keys[i]) != 0;
}
Status DiskStore::SyncLocked() {
  std::vector<std::shared_ptr<Segment>> todo;
  {
    MutexLock l(&mu_);
    for (const auto& [id, seg] : segments_) {
      if (!seg->synced) todo.push_back(seg);
    }
  }
  const uint64_t upto = next_seq_ - 1;
  for (const auto& seg : todo) {
    if (::fdatasync(seg->fd) != 0) {
      return Status::Unavailable(fmt::format("{}: fdatasync: {}", seg->path, Errno(errno)));
    }
    seg->synced = true;
    syncs_.fetch_add(1, std::memory_order_relaxed);
  }
  durable_seq_.store(upto);
  return Status::Ok();
}

Status DiskStore::Sync() {
  MutexLock w(&write_mu_);
  return SyncLocked();
}

void DiskStore::SyncLoop() {
  for (;;) {
    {
      MutexLock l(&sync_mu_);
      if (stop_) break;
      (void)sync_cv_.WaitFor(&sync_mu_, std::chrono::milliseconds(options_.sync_interval_ms));
      if (stop_) break;
    }
    if (durable_seq_.load() < written_seq_.load()) {
      Status st = Sync();
      if (!st.ok()) spdlog::error("disk tier {}: {}", options_.path, st.ToString());
    }
  }
}

bool DiskStore::IsDurable(const BlockKey& key) const {
  MutexLock l(&mu_);
  auto it = index_.find(key);
  return it != index_.end() && it->second.seq <= durable_seq_.load();
}

uint64_t DiskStore::used_bytes() const {
  MutexLock l(&mu_);
  return sealed_bytes_ + (active_ ? active_->bytes.load(std::memory_order_relaxed) : 0);
}

uint64_t DiskStore::live_blocks() const {
  MutexLock l(&mu_);
  return index_.size();
}

DiskStats DiskStore::stats() const {
  DiskStats s;
  s.io_backend = io_name_;
  s.registered_buffers = io_registered_;
  s.direct_io = direct_;
  s.notes = notes_;
  if (ring_failed_.load(std::memory_order_relaxed)) {
    s.io_backend = std::string(IoBackendName(IoBackend::kSync));
    s.registered_buffers = false;
    s.notes += std::string(s.notes.empty() ? "" : "; ") +
               "an io_uring ring failed: new I/O contexts use pread/pwrite";
  }
  s.queue_depth = options_.queue_depth;
  s.capacity_bytes = capacity_bytes_.load();
  s.write_failing = write_failing_.load(std::memory_order_relaxed);
  s.degraded = s.capacity_bytes < options_.capacity_bytes || s.write_failing;
  s.space_evictions = space_evictions_.load(std::memory_order_relaxed);
  s.segment_bytes = segment_bytes_;
  {
    MutexLock l(&mu_);
    s.used_bytes = sealed_bytes_ + (active_ ? active_->bytes.load(std::memory_order_relaxed) : 0);
    s.segments = segments_.size();
    s.live_blocks = index_.size();
    for (const auto& [id, seg] : segments_) s.live_bytes += seg->live_bytes;
  }
  s.dead_bytes = s.used_bytes - std::min(s.used_bytes, s.live_bytes + s.segments * kPageBytes);
  s.written_seq = written_seq_.load();
  s.durable_seq = durable_seq_.load();
  s.syncs = syncs_.load();
  s.corruptions = corruptions_.load();
  s.recovered_blocks = recovered_.load();
  s.evicted_segments = evicted_segments_.load();
  s.evicted_blocks = evicted_blocks_.load();
  s.reinserted_blocks = reinserted_.load();
  return s;
}

}  // namespace kvtier::disk
