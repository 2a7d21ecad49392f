#include "kvtier/tier.h"

#include <algorithm>

#include "common/clock.h"
#include "common/mutex.h"

namespace kvtier {
namespace {
Status CheckSizes(const char* op, size_t keys, size_t blocks, size_t results) {
  if (keys != blocks || keys != results)
    return Status::InvalidArgument(std::string(op) + ": " + std::to_string(keys) + " keys, " +
                                   std::to_string(blocks) + " buffers and " +
                                   std::to_string(results) + " results must be equal counts");
  return Status::Ok();
}
}  // namespace

struct Tier::ListenerSlot {
  Mutex mu;
  RemovalListener listener KVTIER_GUARDED_BY(mu);
};

std::string_view TierKindName(TierKind kind) {
  switch (kind) {
    case TierKind::kEmulatedDevice:
      return "emulated_device";
    case TierKind::kHost:
      return "host";
    case TierKind::kDisk:
      return "disk";
    case TierKind::kRemote:
      return "remote";
  }
  return "?";
}

Tier::Tier(std::string name, TierKind kind, const KvLayout& layout, uint64_t capacity_bytes)
    : name_(std::move(name)),
      kind_(kind),
      layout_(layout),
      block_bytes_(layout.bytes_per_block() ? layout.bytes_per_block() : 1),
      capacity_bytes_(capacity_bytes),
      listener_(std::make_unique<ListenerSlot>()) {}

Tier::~Tier() = default;

Status Tier::Put(std::span<const BlockKey> keys, std::span<const ConstBlock> blocks,
                 std::span<Status> results) {
  KVTIER_RETURN_IF_ERROR(CheckSizes("Put", keys.size(), blocks.size(), results.size()));
  const uint64_t t0 = MonotonicNs();
  PutImpl(keys, blocks, results);
  uint64_t ok = 0;
  for (const Status& s : results) ok += s.ok();
  puts_.fetch_add(ok, std::memory_order_relaxed);
  put_bytes_.fetch_add(ok * block_bytes_, std::memory_order_relaxed);
  put_failures_.fetch_add(results.size() - ok, std::memory_order_relaxed);
  put_latency_.Record(MonotonicNs() - t0);
  return Status::Ok();
}

Status Tier::Get(std::span<const BlockKey> keys, std::span<const MutableBlock> out,
                 std::span<Status> results) {
  KVTIER_RETURN_IF_ERROR(CheckSizes("Get", keys.size(), out.size(), results.size()));
  const uint64_t t0 = MonotonicNs();
  GetImpl(keys, out, results);
  uint64_t hit = 0, miss = 0;
  for (const Status& s : results) {
    hit += s.ok();
    miss += s.IsNotFound();
  }
  gets_.fetch_add(results.size(), std::memory_order_relaxed);
  hits_.fetch_add(hit, std::memory_order_relaxed);
  misses_.fetch_add(miss, std::memory_order_relaxed);
  get_failures_.fetch_add(results.size() - hit - miss, std::memory_order_relaxed);
  get_bytes_.fetch_add(hit * block_bytes_, std::memory_order_relaxed);
  get_latency_.Record(MonotonicNs() - t0);
  return Status::Ok();
}

bool Tier::Lend(std::span<const BlockKey> keys, const LendFn& use) {
  const uint64_t t0 = MonotonicNs();
  uint64_t hit = 0;
  const bool lent = LendImpl(keys, [&](std::span<const std::byte* const> at) {
    for (const std::byte* p : at) hit += p != nullptr;
    use(at);
  });
  if (!lent) return false;
  gets_.fetch_add(keys.size(), std::memory_order_relaxed);
  hits_.fetch_add(hit, std::memory_order_relaxed);
  misses_.fetch_add(keys.size() - hit, std::memory_order_relaxed);
  get_bytes_.fetch_add(hit * block_bytes_, std::memory_order_relaxed);
  get_latency_.Record(MonotonicNs() - t0);
  return true;
}

Status Tier::GetSlice(std::span<const BlockKey> keys, uint64_t offset,
                      std::span<const MutableBlock> out, std::span<uint64_t> checksums,
                      std::span<Status> results) {
  KVTIER_RETURN_IF_ERROR(CheckSizes("GetSlice", keys.size(), out.size(), results.size()));
  if (!checksums.empty() && checksums.size() != keys.size())
    return Status::InvalidArgument("GetSlice: " + std::to_string(keys.size()) + " keys but " +
                                   std::to_string(checksums.size()) + " checksums");
  if (!CapabilitiesImpl().reads_slices)
    return Status::InvalidArgument("tier '" + name_ + "' does not read slices of blocks");
  std::fill(checksums.begin(), checksums.end(), uint64_t{0});
  bool all_inside = true;
  for (size_t i = 0; i < out.size(); ++i) {
    if (offset > block_bytes_ || out[i].size() > block_bytes_ - offset) {
      results[i] = Status::InvalidArgument(
          name_ + ": slice [" + std::to_string(offset) + ", +" + std::to_string(out[i].size()) +
          ") passes the end of a block of " + std::to_string(block_bytes_) + " bytes");
      all_inside = false;
    }
  }
  if (!all_inside) return Status::Ok();
  GetSliceImpl(keys, offset, out, checksums, results);
  uint64_t bytes = 0;
  for (size_t i = 0; i < out.size(); ++i) bytes += results[i].ok() ? out[i].size() : 0;
  get_bytes_.fetch_add(bytes, std::memory_order_relaxed);
  return Status::Ok();
}

void Tier::GetSliceImpl(std::span<const BlockKey>, uint64_t, std::span<const MutableBlock>,
                        std::span<uint64_t>, std::span<Status> results) {
  for (Status& s : results)
    s = Status::InvalidArgument("tier '" + name_ + "' does not read slices");
}

Status Tier::Exists(std::span<const BlockKey> keys, std::span<bool> out) {
  if (keys.size() != out.size())
    return Status::InvalidArgument("Exists: " + std::to_string(keys.size()) + " keys but " +
                                   std::to_string(out.size()) + " results");
  return ExistsImpl(keys, out);
}

Status Tier::Erase(std::span<const BlockKey> keys) {
  Status s = EraseImpl(keys);
  if (s.ok()) erases_.fetch_add(keys.size(), std::memory_order_relaxed);
  return s;
}

TierStats Tier::stats() const {
  TierStats s;
  s.puts = puts_.load(std::memory_order_relaxed);
  s.put_bytes = put_bytes_.load(std::memory_order_relaxed);
  s.put_failures = put_failures_.load(std::memory_order_relaxed);
  s.gets = gets_.load(std::memory_order_relaxed);
  s.hits = hits_.load(std::memory_order_relaxed);
  s.misses = misses_.load(std::memory_order_relaxed);
  s.get_failures = get_failures_.load(std::memory_order_relaxed);
  s.get_bytes = get_bytes_.load(std::memory_order_relaxed);
  s.erases = erases_.load(std::memory_order_relaxed);
  s.used_bytes = used_bytes();
  s.resident_blocks = ResidentBlocksImpl(s.used_bytes);
  s.capacity_bytes = capacity_bytes_;
  s.put_latency_ns = put_latency_.Take();
  s.get_latency_ns = get_latency_.Take();
  CountersImpl(&s.counters);
  return s;
}

uint64_t Tier::ResidentBlocksImpl(uint64_t used_bytes) const { return used_bytes / block_bytes_; }

void Tier::CountersImpl(std::vector<TierStats::Counter>*) const {}

void Tier::SetRemovalListener(RemovalListener listener) {
  MutexLock lock(&listener_->mu);
  listener_->listener = std::move(listener);
}

void Tier::NotifyRemoved(std::span<const BlockKey> keys) {
  RemovalListener listener;
  {
    MutexLock lock(&listener_->mu);
    listener = listener_->listener;
  }
  if (listener && !keys.empty()) listener(keys);
}

}  // namespace kvtier
