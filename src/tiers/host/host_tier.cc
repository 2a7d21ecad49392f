#include "tiers/host/host_tier.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
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
  if (shared && (max_partitions < 1 || max_partitions > 4096))
    return Status::InvalidArgument(name + ": max_partitions must be in 1..4096, got " +
                                   std::to_string(max_partitions));
  if (capacity_bytes / layout.bytes_per_block() >= kNoSlot)
    return Status::InvalidArgument(name + ".capacity_bytes: too many slots");
  return Status::Ok();
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older headers lack it
#endif

namespace {
// A sealed memfd of `bytes` (no shrink, no grow, no further seals), mapped read-write.
Result<std::pair<int, std::byte*>> SealedMemfd(const std::string& name, size_t bytes,
                                               bool huge_pages) {
  const int fd =
      static_cast<int>(memfd_create(("kvtier-" + name).c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (fd < 0) return Status::ResourceExhausted(name + ": memfd_create: " + std::strerror(errno));
  auto fail = [&](const std::string& what) {
    Status s = Status::ResourceExhausted(name + ": " + what + ": " + std::strerror(errno));
    close(fd);
    return s;
  };
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0)
    return fail("cannot size the memfd to " + FormatBytes(bytes));
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
    return fail("cannot seal the memfd");
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
  if (p == MAP_FAILED) return fail("cannot map " + FormatBytes(bytes));
#ifdef MADV_HUGEPAGE
  if (huge_pages) madvise(p, bytes, MADV_HUGEPAGE);
#endif
  return std::pair<int, std::byte*>(fd, static_cast<std::byte*>(p));
}
}  // namespace

Result<std::unique_ptr<HostTier>> HostTier::Open(const KvLayout& layout, HostTierOptions options) {
  KVTIER_RETURN_IF_ERROR(layout.Validate());
  KVTIER_RETURN_IF_ERROR(options.Validate(layout));
  const uint64_t slots = options.capacity_bytes / layout.bytes_per_block();
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  // Shared: slots start on pages, so a slot's pages can leave one partition for another.
  const uint64_t stride = options.shared ? (layout.bytes_per_block() + page - 1) / page * page
                                         : layout.bytes_per_block();
  const size_t bytes = (slots * stride + page - 1) / page * page;
  int fd = -1;
  void* p = nullptr;
  if (options.shared) {
    KVTIER_ASSIGN_OR_RETURN(auto m, SealedMemfd(options.name, bytes, options.huge_pages));
    fd = m.first;
    p = m.second;
  } else {
    p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
             -1, 0);
    if (p == MAP_FAILED)
      return Status::ResourceExhausted(options.name + ": cannot map " + FormatBytes(bytes) + ": " +
                                       std::strerror(errno));
#ifdef MADV_HUGEPAGE
    if (options.huge_pages) madvise(p, bytes, MADV_HUGEPAGE);
#endif
  }
  std::unique_ptr<HostTier> tier(
      new HostTier(layout, options, static_cast<std::byte*>(p), bytes, slots, stride));
  tier->arena_fd_ = fd;
  tier->shared_ = options.shared;
  if (options.shared) tier->parts_[0] = Partition{fd, static_cast<std::byte*>(p), 0, "default"};
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
  if (options.prefault || tier->pinned_) {
    WriterLock lock(&tier->mu_);
    tier->part0_empty_ = false;
  }
  // Pinning faulted every page in already.
  if (options.prefault && !tier->pinned_) tier->Prefault(options.prefault_background);
  if (!options.prefault && !options.shared && !tier->pinned_ && options.warm_ahead > 0) {
    // Not the warmer's to unmap: the tier does, after stopping it.
    tier->warm_arena_ =
        std::shared_ptr<Arena>(new Arena{tier->arena_, tier->arena_bytes_}, [](Arena* a) {
          a->base = nullptr;
          delete a;
        });
    tier->warmer_ = std::make_unique<ArenaWarmer>();
    WriterLock lock(&tier->mu_);
    tier->WarmPast(0);
  }
  return tier;
}

HostTier::HostTier(const KvLayout& layout, const HostTierOptions& options, std::byte* arena,
                   size_t arena_bytes, uint64_t slots, uint64_t stride)
    : Tier(options.name, options.kind, layout, slots * layout.bytes_per_block()),
      arena_(arena),
      arena_bytes_(arena_bytes),
      num_slots_(slots),
      stride_(stride),
      options_(options),
      pool_(options.threads) {
  const int parts = options.shared ? options.max_partitions + 1 : 1;
  parts_.reset(new Partition[parts]);
  parts_[0].base = arena;
  num_parts_.store(1, std::memory_order_release);
  if (options.shared) owner_.assign(slots, 0);
  WriterLock lock(&mu_);
  map_ = FlatIdMap(slots);
  keys_.resize(slots);
  free_.resize(parts);
  held_.assign(parts, 0);
  bounds_.assign(parts, Bounds{});
  free_[0].reserve(slots);
  // Lowest slots on top of the stack: a small working set stays at the arena's start.
  for (uint64_t i = slots; i-- > 0;) free_[0].push_back(static_cast<uint32_t>(i));
  free_count_ = slots;
}

HostTier::~HostTier() {
  warmer_.reset();
  prefault_stop_.store(true, std::memory_order_relaxed);
  if (prefault_thread_.joinable()) prefault_thread_.join();
#ifdef KVTIER_HAVE_CUDA
  if (pinned_) cudaHostUnregister(arena_);
#endif
  munmap(arena_, arena_bytes_);
  if (arena_fd_ >= 0) close(arena_fd_);
  for (int p = 1; p < num_parts_.load(std::memory_order_acquire); ++p) {
    munmap(parts_[p].base, arena_bytes_);
    close(parts_[p].fd);
  }
}

Result<int> HostTier::AddPartition(uint32_t tag, std::string_view name) {
  if (!shared_) return Status::InvalidArgument(this->name() + ": partitions need a shared arena");
  WriterLock lock(&mu_);
  if (auto it = by_tag_.find(tag); it != by_tag_.end()) {
    if (parts_[it->second].name != name)
      return Status::InvalidArgument("tenant '" + std::string(name) + "' has the same tag as '" +
                                     parts_[it->second].name +
                                     "', which holds a partition of the arena; rename one");
    return it->second;
  }
  const int p = num_parts_.load(std::memory_order_relaxed);
  if (p > options_.max_partitions)
    return Status::ResourceExhausted(this->name() + ": the arena has " +
                                     std::to_string(options_.max_partitions) +
                                     " tenant partitions already (serve.max_tenants)");
  KVTIER_ASSIGN_OR_RETURN(auto m, SealedMemfd(this->name() + "-" + std::string(name), arena_bytes_,
                                              options_.huge_pages));
  parts_[p] = Partition{m.first, m.second, tag, std::string(name)};
  by_tag_.emplace(tag, p);
  num_parts_.store(p + 1, std::memory_order_release);
  return p;
}

int HostTier::partition_fd(int p) const {
  return p >= 0 && p < num_parts_.load(std::memory_order_acquire) ? parts_[p].fd : -1;
}

HostTier::Usage HostTier::UsageLocked(int p) const {
  if (p < 0 || static_cast<size_t>(p) >= held_.size()) return Usage{p, 0, Bounds{}};
  return Usage{p, held_[p], bounds_[p]};
}

HostTier::Usage HostTier::usage(int p) const {
  ReaderLock lock(&mu_);
  return UsageLocked(p);
}

HostTier::Usage HostTier::UsageOf(const BlockKey& key) const {
  ReaderLock lock(&mu_);
  return UsageLocked(PartOf(key));
}

void HostTier::SetBounds(int p, Bounds b) {
  WriterLock lock(&mu_);
  if (p < 0 || static_cast<size_t>(p) >= bounds_.size()) return;
  bounds_[p] = b;
  if (b.max_slots != UINT64_MAX || b.reserved_slots != 0)
    bounded_.store(true, std::memory_order_release);
}

std::byte* HostTier::SlotPtr(uint32_t slot) const {
  const uint64_t at = uint64_t{slot} * stride_;
  return shared_ ? parts_[owner_[slot]].base + at : arena_ + at;
}

uint32_t HostTier::TakeSlot(int p) {
  if (free_count_ == 0) return kNoSlot;
  uint32_t slot = kNoSlot;
  if (p == 0) part0_empty_ = false;
  if (!free_[p].empty()) {
    slot = free_[p].back();
    free_[p].pop_back();
  } else {
    const int n = static_cast<int>(free_.size());
    for (int i = 0; i < n && slot == kNoSlot; ++i) {
      auto& f = free_[(free_cursor_ + i) % n];
      if (f.empty()) continue;
      free_cursor_ = (free_cursor_ + i) % n;
      slot = f.back();
      f.pop_back();
    }
    if (shared_ && owner_[slot] != p) GiveSlot(slot, p);
  }
  --free_count_;
  ++held_[p];
  if (warmer_) WarmPast(SlotOffset(slot) + stride_);
  return slot;
}

void HostTier::CountersImpl(std::vector<TierStats::Counter>* out) const {
  if (warmer_)
    out->push_back({"warmed_bytes", "Bytes faulted in ahead of the stores (warm_ahead)",
                    warmer_->warmed_bytes()});
}

void HostTier::WarmPast(uint64_t end) {
  // Slots are first handed out lowest first: past the end of the highest one handed out,
  // nothing was touched. Topped up to warm_ahead once half of it is used, one range a time;
  // what stores outran is theirs to fault.
  const uint64_t ahead = options_.warm_ahead;
  if (end + ahead / 2 <= warm_queued_ || warm_queued_ >= arena_bytes_) return;
  const uint64_t from = std::max(end, warm_queued_);
  const uint64_t to = std::min<uint64_t>(arena_bytes_, from + ahead);
  if (to > from) warmer_->Add(warm_arena_, std::span<const uint64_t>(&from, 1), to - from);
  warm_queued_ = to;
}

void HostTier::GiveSlot(uint32_t slot, int p) {
  // The slot's pages leave the old owner's memfd, under the lock so that no later owner's
  // bytes can be punched by a late call. Best effort: pages that stay cost memory, never
  // isolation (the new owner's bytes go to its own memfd).
  if (owner_[slot] != 0 || !part0_empty_)
    (void)fallocate(parts_[owner_[slot]].fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                    static_cast<off_t>(SlotOffset(slot)), static_cast<off_t>(stride_));
  owner_[slot] = static_cast<uint16_t>(p);
}

size_t HostTier::ClaimCount(int p, size_t want) const {
  if (held_[p] >= bounds_[p].max_slots) return 0;
  want = static_cast<size_t>(std::min<uint64_t>(want, bounds_[p].max_slots - held_[p]));
  // Below half of want, topped up to want: one claim per many stores, not one per store.
  if (free_[p].size() * 2 >= want) return 0;
  return std::min(want - free_[p].size(), free_[0].size());
}

size_t HostTier::ClaimAhead(int p, size_t want, std::vector<uint64_t>* offsets) {
  if (!shared_ || p <= 0 || p >= num_parts_.load(std::memory_order_acquire)) return 0;
  {
    // Called on every reserve: most have nothing to claim, and readers need not wait for that.
    ReaderLock lock(&mu_);
    if (ClaimCount(p, want) == 0) return 0;
  }
  WriterLock lock(&mu_);
  const size_t n = ClaimCount(p, want);
  // Partition 0's stack ends with its lowest slots. Taken from there and put below p's own
  // freed slots (faulted in already), they are handed out after those, lowest first.
  const auto from = free_[0].end() - static_cast<std::ptrdiff_t>(n);
  for (auto it = free_[0].end(); it != from;) {
    const uint32_t slot = *--it;
    GiveSlot(slot, p);
    offsets->push_back(SlotOffset(slot));
  }
  free_[p].insert(free_[p].begin(), from, free_[0].end());
  free_[0].erase(from, free_[0].end());
  return n;
}

void HostTier::FreeSlot(uint32_t slot) {
  const int p = shared_ ? owner_[slot] : 0;
  free_[p].push_back(slot);
  --held_[p];
  ++free_count_;
}

void HostTier::Prefault(bool background) {
  const uint64_t t0 = MonotonicNs();
  // One huge page a call: the thread holds the address space's lock for one call at a time,
  // and stops within one when the tier closes.
  constexpr size_t kChunk = size_t{2} << 20;
  auto populate = [this](size_t from, size_t bytes) {
    return madvise(arena_ + from, std::min(bytes, arena_bytes_ - from), MADV_POPULATE_WRITE) == 0;
  };
  // MADV_POPULATE_WRITE faults pages in writable without writing to them, so puts may run
  // meanwhile; a kernel before 5.14 refuses it, and then every page is touched before Open
  // returns (touching writes, which would race with puts).
  if (background && populate(0, kChunk)) {
    prefault_thread_ = std::thread([this, t0, populate] {
      // Below the engine's threads: faulting in is worth doing only on spare CPU time.
      const auto tid = static_cast<id_t>(gettid());
      (void)setpriority(PRIO_PROCESS, tid, std::max(10, getpriority(PRIO_PROCESS, tid)));
      for (size_t at = kChunk; at < arena_bytes_; at += kChunk)
        if (prefault_stop_.load(std::memory_order_relaxed) || !populate(at, kChunk)) return;
      prefault_ns_.store(std::max<uint64_t>(1, MonotonicNs() - t0), std::memory_order_release);
    });
    return;
  }
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  pool_.ParallelFor([&](int i, int n) {
    size_t pages = arena_bytes_ / page;
    size_t begin = pages * i / n, end = pages * (i + 1) / n;
    volatile std::byte* base = arena_;
    for (size_t pg = begin; pg < end; ++pg) base[pg * page] = std::byte{0};
  });
  prefault_ns_.store(std::max<uint64_t>(1, MonotonicNs() - t0), std::memory_order_release);
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
      sc.slots[i] = TakeSlot(PartOf(keys[i]));
      if (sc.slots[i] == kNoSlot) {
        results[i] = Status::ResourceExhausted(name() + ": full (" + std::to_string(num_slots_) +
                                               " blocks)");
        continue;
      }
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
      FreeSlot(sc.slots[i]);
    } else if (old != FlatIdMap::kNone) {  // overwrite: the new copy replaces the old slot
      map_.Erase(keys[i], old);
      FreeSlot(old);
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

bool HostTier::LendImpl(std::span<const BlockKey> keys, const LendFn& use) {
  std::vector<const std::byte*> at(keys.size());
  // Held while use reads: an Erase or a Put into these slots waits, as for GetImpl's copies.
  ReaderLock lock(&mu_);
  PointersLocked(keys, at);
  use(at);
  return true;
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
    FreeSlot(slot);
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

void HostTier::Pointers(std::span<const BlockKey> keys, std::span<const std::byte*> out) const {
  ReaderLock lock(&mu_);
  PointersLocked(keys, out);
}

void HostTier::PointersLocked(std::span<const BlockKey> keys,
                              std::span<const std::byte*> out) const {
  for (size_t i = 0; i < keys.size(); ++i) {
    const uint32_t slot = FindSlot(keys[i]);
    out[i] = slot != FlatIdMap::kNone ? SlotPtr(slot) : nullptr;
  }
}

size_t HostTier::ReserveSlots(int p, size_t n, std::vector<uint32_t>* out) {
  WriterLock lock(&mu_);
  if (p < 0 || p >= num_parts_.load(std::memory_order_relaxed)) return 0;
  size_t got = 0;
  for (; got < n; ++got) {
    const uint32_t slot = TakeSlot(p);
    if (slot == kNoSlot) break;
    out->push_back(slot);
  }
  return got;
}

void HostTier::ReleaseSlots(std::span<const uint32_t> slots) {
  WriterLock lock(&mu_);
  for (uint32_t s : slots) FreeSlot(s);
}

void HostTier::PublishSlots(std::span<const BlockKey> keys, std::span<const uint32_t> slots,
                            std::span<bool> published) {
  WriterLock lock(&mu_);
  for (size_t i = 0; i < keys.size(); ++i) {
    published[i] = InsertSlot(keys[i], slots[i]) == FlatIdMap::kNone;
    if (!published[i]) FreeSlot(slots[i]);
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
