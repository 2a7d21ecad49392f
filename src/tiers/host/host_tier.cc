#include "tiers/host/host_tier.h"

#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <mutex>

#include <spdlog/spdlog.h>

#ifdef KVTIER_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include "common/clock.h"

namespace kvtier {
namespace {
constexpr uint32_t kNoSlot = UINT32_MAX;

// Per-thread scratch so a batch allocates nothing once warmed up.
struct Scratch {
  std::vector<uint32_t> slots;
  std::vector<CopyJob> jobs;
  std::vector<uint32_t> index;
};
Scratch& TlsScratch() {
  thread_local Scratch s;
  return s;
}
}  // namespace

Status HostTierOptions::Validate(const KvLayout& layout) const {
  if (kind != TierKind::kHost && kind != TierKind::kEmulatedDevice)
    return Status::InvalidArgument(name +
                                   ".kind: a host arena serves kind host or emulated_device");
  if (threads < 1 || threads > 64)
    return Status::InvalidArgument(name + ".threads: must be in 1..64, got " +
                                   std::to_string(threads));
  if (capacity_bytes < layout.bytes_per_block())
    return Status::InvalidArgument(name + ".capacity_bytes: " + FormatBytes(capacity_bytes) +
                                   " holds no block of " + FormatBytes(layout.bytes_per_block()));
  if (capacity_bytes / layout.bytes_per_block() >= kNoSlot)
    return Status::InvalidArgument(name + ".capacity_bytes: too many slots");
  return Status::Ok();
}

Result<std::unique_ptr<HostTier>> HostTier::Open(const KvLayout& layout, HostTierOptions options) {
  KVTIER_RETURN_IF_ERROR(layout.Validate());
  KVTIER_RETURN_IF_ERROR(options.Validate(layout));
  const uint64_t slots = options.capacity_bytes / layout.bytes_per_block();
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t bytes = (slots * layout.bytes_per_block() + page - 1) / page * page;
  int fd = -1;
  if (options.shared) {
    fd = static_cast<int>(memfd_create(("kvtier-" + options.name).c_str(), MFD_CLOEXEC));
    if (fd < 0)
      return Status::ResourceExhausted(options.name + ": memfd_create: " + std::strerror(errno));
    if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
      Status s = Status::ResourceExhausted(options.name + ": cannot size the memfd to " +
                                           FormatBytes(bytes) + ": " + std::strerror(errno));
      close(fd);
      return s;
    }
  }
  void* p = options.shared
                ? mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0)
                : mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    Status s = Status::ResourceExhausted(options.name + ": cannot map " + FormatBytes(bytes) +
                                         ": " + std::strerror(errno));
    if (fd >= 0) close(fd);
    return s;
  }
  std::unique_ptr<HostTier> tier(
      new HostTier(layout, options, static_cast<std::byte*>(p), bytes, slots));
  tier->arena_fd_ = fd;
  tier->shared_ = options.shared;
  if (options.prefault) tier->Prefault(options.huge_pages);
#ifdef KVTIER_HAVE_CUDA
  if (options.pin) {
    cudaError_t err = cudaHostRegister(p, bytes, cudaHostRegisterDefault);
    if (err == cudaSuccess) {
      tier->pinned_ = true;
    } else {
      (void)cudaGetLastError();
      static std::once_flag once;  // one line per process, not one per tier
      std::call_once(once, [&] {
        spdlog::info("host arenas are not pinned ({}); copies to a GPU will be staged",
                     cudaGetErrorString(err));
      });
    }
  }
#endif
  return tier;
}

HostTier::HostTier(const KvLayout& layout, const HostTierOptions& options, std::byte* arena,
                   size_t arena_bytes, uint64_t slots)
    : Tier(options.name, options.kind, layout, slots * layout.bytes_per_block()),
      arena_(arena),
      arena_bytes_(arena_bytes),
      num_slots_(slots),
      pool_(options.threads) {
  WriterLock lock(&mu_);
  map_ = FlatIdMap(slots);
  keys_.resize(slots);
  free_.reserve(slots);
  // Lowest slots on top of the stack: a small working set stays at the arena's start.
  for (uint64_t i = slots; i-- > 0;) free_.push_back(static_cast<uint32_t>(i));
}

HostTier::~HostTier() {
#ifdef KVTIER_HAVE_CUDA
  if (pinned_) cudaHostUnregister(arena_);
#endif
  munmap(arena_, arena_bytes_);
  if (arena_fd_ >= 0) close(arena_fd_);
}

void HostTier::Prefault(bool huge_pages) {
  const uint64_t t0 = MonotonicNs();
#ifdef MADV_HUGEPAGE
  if (huge_pages) madvise(arena_, arena_bytes_, MADV_HUGEPAGE);
#endif
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  pool_.ParallelFor([&](int i, int n) {
    size_t pages = arena_bytes_ / page;
    size_t begin = pages * i / n, end = pages * (i + 1) / n;
    volatile std::byte* base = arena_;
    for (size_t pg = begin; pg < end; ++pg) base[pg * page] = std::byte{0};
  });
  prefault_s_ = static_cast<double>(MonotonicNs() - t0) * 1e-9;
}

void HostTier::PutImpl(std::span<const BlockKey> keys, std::span<const ConstBlock> blocks,
                       std::span<Status> results) {
  Scratch& sc = TlsScratch();
  sc.slots.assign(keys.size(), kNoSlot);
  sc.jobs.clear();
  {
    WriterLock lock(&mu_);
    for (size_t i = 0; i < keys.size(); ++i) {
      if (blocks[i].size() != block_bytes()) {
        results[i] =
            Status::InvalidArgument(name() + ": block of " + std::to_string(blocks[i].size()) +
                                    " bytes, want " + std::to_string(block_bytes()));
        continue;
      }
      if (free_.empty()) {
        results[i] = Status::ResourceExhausted(name() + ": full (" + std::to_string(num_slots_) +
                                               " blocks)");
        continue;
      }
      sc.slots[i] = free_.back();
      free_.pop_back();
      results[i] = Status::Ok();
    }
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    if (sc.slots[i] != kNoSlot)
      sc.jobs.push_back({SlotPtr(sc.slots[i]), blocks[i].data(), blocks[i].size()});
  }
  pool_.Run(sc.jobs);
  WriterLock lock(&mu_);
  for (size_t i = 0; i < keys.size(); ++i) {
    if (sc.slots[i] == kNoSlot) continue;
    const uint32_t old = InsertSlot(keys[i], sc.slots[i]);
    if (old != FlatIdMap::kNone && shared_) {  // others may be reading the old slot: it stays
      free_.push_back(sc.slots[i]);
    } else if (old != FlatIdMap::kNone) {  // overwrite: the new copy replaces the old slot
      map_.Erase(keys[i], old);
      free_.push_back(old);
      MapSlot(keys[i], sc.slots[i]);
    }
  }
}

void HostTier::GetSliceImpl(std::span<const BlockKey> keys, uint64_t offset,
                            std::span<const MutableBlock> out, std::span<uint64_t>,
                            std::span<Status> results) {
  // The Cache keeps the checksums of a host tier's blocks (it verifies nothing read from here).
  Scratch& sc = TlsScratch();
  sc.jobs.clear();
  ReaderLock lock(&mu_);
  for (size_t i = 0; i < keys.size(); ++i) {
    const uint32_t slot = FindSlot(keys[i]);
    if (slot == FlatIdMap::kNone) {
      results[i] = Status::NotFound(name() + ": block " + keys[i].ToHex() + " not resident");
      continue;
    }
    sc.jobs.push_back({out[i].data(), SlotPtr(slot) + offset, out[i].size()});
    results[i] = Status::Ok();
  }
  pool_.Run(sc.jobs);
}

void HostTier::GetImpl(std::span<const BlockKey> keys, std::span<const MutableBlock> out,
                       std::span<Status> results) {
  Scratch& sc = TlsScratch();
  sc.jobs.clear();
  ReaderLock lock(&mu_);
  for (size_t i = 0; i < keys.size(); ++i) {
    if (out[i].size() != block_bytes()) {
      results[i] = Status::InvalidArgument(name() + ": buffer of " + std::to_string(out[i].size()) +
                                           " bytes, want " + std::to_string(block_bytes()));
      continue;
    }
    const uint32_t slot = FindSlot(keys[i]);
    if (slot == FlatIdMap::kNone) {
      results[i] = Status::NotFound(name() + ": block " + keys[i].ToHex() + " not resident");
      continue;
    }
    sc.jobs.push_back({out[i].data(), SlotPtr(slot), out[i].size()});
    results[i] = Status::Ok();
  }
  pool_.Run(sc.jobs);
}

Status HostTier::ExistsImpl(std::span<const BlockKey> keys, std::span<bool> out) {
  ReaderLock lock(&mu_);
  for (size_t i = 0; i < keys.size(); ++i) out[i] = FindSlot(keys[i]) != FlatIdMap::kNone;
  return Status::Ok();
}

Status HostTier::EraseImpl(std::span<const BlockKey> keys) {
  WriterLock lock(&mu_);
  for (const BlockKey& k : keys) {
    const uint32_t slot = FindSlot(k);
    if (slot == FlatIdMap::kNone) continue;
    free_.push_back(slot);
    map_.Erase(k, slot);
  }
  return Status::Ok();
}

void HostTier::Offsets(std::span<const BlockKey> keys, std::span<uint64_t> out) const {
  ReaderLock lock(&mu_);
  for (size_t i = 0; i < keys.size(); ++i) {
    const uint32_t slot = FindSlot(keys[i]);
    out[i] = slot != FlatIdMap::kNone ? SlotOffset(slot) : kNoOffset;
  }
}

size_t HostTier::ReserveSlots(size_t n, std::vector<uint32_t>* out) {
  WriterLock lock(&mu_);
  size_t got = 0;
  for (; got < n && !free_.empty(); ++got) {
    out->push_back(free_.back());
    free_.pop_back();
  }
  return got;
}

void HostTier::ReleaseSlots(std::span<const uint32_t> slots) {
  WriterLock lock(&mu_);
  for (uint32_t s : slots) free_.push_back(s);
}

void HostTier::PublishSlots(std::span<const BlockKey> keys, std::span<const uint32_t> slots,
                            std::span<bool> published) {
  WriterLock lock(&mu_);
  for (size_t i = 0; i < keys.size(); ++i) {
    published[i] = InsertSlot(keys[i], slots[i]) == FlatIdMap::kNone;
    if (!published[i]) free_.push_back(slots[i]);
  }
}

uint32_t HostTier::InsertSlot(const BlockKey& key, uint32_t slot) {
  const uint32_t old = FindSlot(key);
  if (old != FlatIdMap::kNone) return old;
  MapSlot(key, slot);
  return FlatIdMap::kNone;
}

uint64_t HostTier::UsedBytesImpl() const {
  ReaderLock lock(&mu_);
  return map_.size() * block_bytes();
}

TierCapabilities HostTier::CapabilitiesImpl() const {
  TierCapabilities c;
  c.managed_by_cache = true;
  c.authoritative = true;
  c.reads_slices = true;
  return c;
}

}  // namespace kvtier
