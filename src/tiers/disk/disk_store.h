// DiskStore: the engine of the disk tier. Fixed-size blocks in append-only segment files with
// O_DIRECT and io_uring, an in-memory index rebuilt from the record headers at open, whole-segment
// eviction (oldest first) under a byte capacity that is never exceeded, and a sync policy that
// decides when a written block becomes durable. The format is in doc/disk_format.md.
//
// Writers are serialised (one append point); readers run concurrently with the writer and with
// each other, each on its own I/O context from a pool. A block whose bytes fail verification on
// read is dropped and reported as Corruption; a torn or corrupt record found at open is skipped
// and the rest of its segment stays readable.
//
// Thread-safety: every public method may be called concurrently. The removal callback is
// invoked with no DiskStore lock held. Ownership: nothing keeps a caller's buffers past a call.
#ifndef KVTIER_TIERS_DISK_DISK_STORE_H_
#define KVTIER_TIERS_DISK_DISK_STORE_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/log_limiter.h"
#include "common/mutex.h"
#include "kvtier/block_key.h"
#include "kvtier/status.h"
#include "tiers/disk/io_engine.h"

namespace kvtier::disk {

struct SegmentScan;

enum class SyncPolicy : uint8_t {
  kNone,      // never fdatasync on its own; blocks become durable on Sync() or close
  kBatch,     // fdatasync before each Put returns: every OK block is durable
  kInterval,  // a background thread syncs every sync_interval_ms
};
std::string_view SyncPolicyName(SyncPolicy policy);
std::optional<SyncPolicy> ParseSyncPolicy(std::string_view name);  // "none", "batch", "interval"

// Makes the I/O engine of one context (the device seam: tests inject failing engines).
using IoEngineFactory = std::function<Result<std::unique_ptr<IoEngine>>(const IoEngineOptions&)>;

struct DiskOptions {
  std::string path;                 // the directory (created when missing)
  uint64_t capacity_bytes = 0;      // bytes of segment files, never exceeded
  uint64_t block_bytes = 0;         // payload of every block (the layout's bytes_per_block)
  uint64_t layout_fingerprint = 0;  // written in every header; a foreign one is refused
  uint64_t segment_bytes = 0;       // 0: min(256 MiB, capacity / 4)
  uint32_t queue_depth = 32;        // I/Os in flight per context
  SyncPolicy sync = SyncPolicy::kBatch;
  uint32_t sync_interval_ms = 100;       // for kInterval
  IoBackend io = IoBackend::kAuto;       // kAuto: io_uring, else pread/pwrite (noted in stats)
  bool register_buffers = true;          // io_uring fixed buffers where RLIMIT_MEMLOCK allows
  bool direct_io = true;                 // O_DIRECT; a filesystem that refuses it is noted
  bool reinsert_hot = true;              // on eviction, rewrite blocks read since they were written
  uint64_t buffer_bytes = 128ull << 20;  // bounce buffers per I/O context (caps in-flight I/Os)
  IoEngineFactory make_io_engine;        // nullptr: MakeIoEngine

  // OK, or InvalidArgument naming the field.
  Status Validate() const;
  // Bytes on disk of one block's record (header page + padded payload).
  uint64_t record_bytes() const;
  // segment_bytes, or the default derived from capacity_bytes.
  uint64_t effective_segment_bytes() const;
};

struct DiskStats {
  std::string io_backend;  // "io_uring" or "pread/pwrite"
  bool registered_buffers = false;
  bool direct_io = false;
  std::string notes;  // why something fell back, "" when nothing did
  uint32_t queue_depth = 0;
  uint64_t capacity_bytes = 0;  // options' capacity, or less when the filesystem holds less
  uint64_t segment_bytes = 0;   // options' size, or less when the filesystem holds less
  // The tier is in trouble: the filesystem holds less than the configured capacity (it runs
  // shrunk), or its last segment could not be started (writes fail until one can).
  bool degraded = false;
  bool write_failing = false;  // the last segment roll failed
  uint64_t used_bytes = 0;     // sealed segment bytes + the active segment's bytes
  uint64_t segments = 0;
  uint64_t live_blocks = 0;
  uint64_t live_bytes = 0;   // record bytes the index points at
  uint64_t dead_bytes = 0;   // overwritten, erased, tombstones, skipped
  uint64_t written_seq = 0;  // last sequence number whose write completed
  uint64_t durable_seq = 0;  // every record up to this one is on stable storage
  uint64_t syncs = 0;
  uint64_t corruptions = 0;       // records dropped on read or skipped at open as corrupt
  uint64_t recovered_blocks = 0;  // blocks found at open
  uint64_t evicted_segments = 0;
  uint64_t evicted_blocks = 0;
  uint64_t space_evictions = 0;  // segments evicted early because the filesystem was full
  uint64_t reinserted_blocks = 0;
};

class DiskStore {
 public:
  using RemovalFn = std::function<void(std::span<const BlockKey>)>;

  // Opens (or creates) the directory and rebuilds the index. InvalidArgument for bad options or
  // a segment of a future format version or a foreign layout (naming the file); Unavailable when
  // another process holds the directory; ResourceExhausted when ulimit -f or -n is too low;
  // Internal for other system failures. The capacity is clamped to what the filesystem can
  // hold, keeping its floor of two segments (segments shrink when the filesystem holds fewer
  // than two); when no segment can be started (a full disk) it opens read-only: reads are
  // served and every Put tries again.
  static Result<std::unique_ptr<DiskStore>> Open(const DiskOptions& options,
                                                 RemovalFn on_removed = nullptr);
  // Syncs (unless the policy is kNone) and closes.
  ~DiskStore();
  DiskStore(const DiskStore&) = delete;
  DiskStore& operator=(const DiskStore&) = delete;

  // results[i]: OK, InvalidArgument (wrong size), Unavailable (write failed, or no new segment
  // could be started: the message names its file and the error; a later Put tries again),
  // ResourceExhausted (the batch is more than the capacity holds at once: its head is stored,
  // and the blocks that would have evicted it are not written). Blocks evicted to make room are
  // reported through the removal callback before Put returns.
  void Put(std::span<const BlockKey> keys, std::span<const std::span<const std::byte>> blocks,
           std::span<Status> results);
  // results[i]: OK, NotFound, Corruption (dropped), Unavailable (read failed), InvalidArgument.
  void Get(std::span<const BlockKey> keys, std::span<const std::span<std::byte>> out,
           std::span<Status> results);
  // Copies bytes [offset, offset + out[i].size()) of the block of keys[i] into out[i] (one layer
  // of a layer-wise load), unverified: when checksums is not empty, also reads the record's
  // header, checks it as Get does and sets checksums[i] to the whole block's payload checksum
  // (XXH3-64) for the caller to verify the assembled block; 0 unless results[i] is OK.
  // results[i]: OK, NotFound, Corruption (a bad header: dropped), Unavailable, InvalidArgument
  // (the slice passes the block's end).
  void GetSlice(std::span<const BlockKey> keys, uint64_t offset,
                std::span<const std::span<std::byte>> out, std::span<uint64_t> checksums,
                std::span<Status> results);
  void Exists(std::span<const BlockKey> keys, std::span<bool> out) const;
  // Every resident key (for a cache that rebuilds its index over a persistent tier).
  std::vector<BlockKey> Keys() const;
  // Removes keys (writing tombstones, so they stay removed after a restart).
  Status Erase(std::span<const BlockKey> keys);

  // Makes every block written so far durable.
  Status Sync();
  // Whether key is resident and on stable storage (survives a crash).
  bool IsDurable(const BlockKey& key) const;

  uint64_t used_bytes() const;
  uint64_t live_blocks() const;  // blocks resident (the index's size)
  DiskStats stats() const;
  const DiskOptions& options() const { return options_; }

 private:
  struct Segment;
  struct Location {
    uint64_t segment_id = 0;
    uint64_t offset = 0;
    uint64_t seq = 0;
    bool accessed = false;  // read since written: a reinsertion candidate
  };
  struct IoContext {
    // Declared first, destroyed last: registered buffers must outlive the ring.
    std::vector<AlignedBuffer> buffers;
    std::vector<std::array<iovec, 2>> iov;  // per buffer: header page + caller's block
    std::unique_ptr<IoEngine> engine;
  };
  // Whether a caller's buffer can be the I/O buffer itself (page-aligned, whole pages).
  bool ZeroCopy(const void* p) const {
    return options_.block_bytes % 4096 == 0 && reinterpret_cast<uintptr_t>(p) % 4096 == 0;
  }

  struct PutBatch;   // one Put in flight (disk_writer.cc)
  struct ReadBatch;  // one Get or GetSlice in flight (disk_read_batch.h)

  explicit DiskStore(const DiskOptions& options, RemovalFn on_removed);

  // Opening (disk_recovery.cc).
  Status OpenDirectory(std::vector<BlockKey>* removed);
  // Creates and flocks the directory: Internal, or Unavailable when another tier holds it.
  Status LockDirectory();
  // Scans segment `id` and indexes its records (trimming a crashed tail when it is the newest);
  // an empty one is unlinked. InvalidArgument for a future version or a foreign layout.
  Status RecoverSegment(uint64_t id, bool newest, uint64_t* max_seq, uint64_t* recovered_issues)
      KVTIER_REQUIRES(write_mu_);
  // Logs the scan's issues; returns how many count as recovery issues.
  uint64_t ReportScanIssues(const SegmentScan& scan, bool newest, const std::string& path);
  // Adds seg to the table and its records to the index; returns the records skipped.
  uint64_t IndexScannedRecords(const std::shared_ptr<Segment>& seg, const SegmentScan& scan,
                               uint64_t* max_seq);
  // Lowers capacity_bytes_ to what the filesystem holds (at least two segments), and at open
  // also segment_bytes_ when the filesystem holds fewer than two. Logs a change (at most
  // every 10 s when not at_open).
  void ClampCapacityToFilesystem(bool at_open) KVTIER_REQUIRES(write_mu_);

  Result<std::unique_ptr<IoContext>> MakeContext();
  std::unique_ptr<IoContext> AcquireReader();
  void ReleaseReader(std::unique_ptr<IoContext> ctx);
  // Keeps a context whose engine failed until close: requests it lost may still land in its
  // buffers.
  void RetireContext(std::unique_ptr<IoContext> ctx);

  // Writer side; callers hold write_mu_ with no I/O outstanding.
  // Seals the active segment and starts the next one, evicting the oldest to stay under the
  // capacity. On failure nothing is evicted and the (sealed) active segment stays active.
  // With evict_for_space, ENOSPC or EDQUOT lowers the capacity to what the filesystem holds and
  // evicts the oldest sealed segment (the one just sealed last of all) and tries again.
  Status RollSegment(std::vector<BlockKey>* removed, bool evict_for_space = true)
      KVTIER_REQUIRES(write_mu_);
  // Creates, heads and preallocates the next segment file; on failure unlinks it and sets
  // *err to the errno (0 for a short write).
  Result<std::shared_ptr<Segment>> StartSegment(int* err) KVTIER_REQUIRES(write_mu_);
  // Evicts the oldest sealed segment, its hot blocks too; false if none. `just_sealed` (the
  // segment the roll sealed, whose bytes sealed_bytes_ does not count yet) goes only when it
  // is the last one, and then *just_sealed is set to nullptr.
  bool EvictOldestForSpace(std::shared_ptr<Segment>* just_sealed, std::vector<BlockKey>* removed)
      KVTIER_REQUIRES(write_mu_);
  // Whether the next roll would evict a segment with id >= first_id.
  bool RollEvicts(uint64_t first_id) const KVTIER_REQUIRES(mu_);
  void EvictSegment(uint64_t id, std::vector<BlockKey>* removed,
                    std::vector<std::pair<BlockKey, Location>>* hot) KVTIER_REQUIRES(write_mu_);
  void Reinsert(const std::vector<std::pair<BlockKey, Location>>& hot,
                const std::shared_ptr<Segment>& dst, std::vector<BlockKey>* removed)
      KVTIER_REQUIRES(write_mu_);
  // Put's steps: queue writes until the buffers or the segment run out, roll to the next
  // segment (false: b->stop says why not), wait for completions (false: the ring failed).
  void QueueWrites(PutBatch* b) KVTIER_REQUIRES(write_mu_);
  bool RollForBatch(PutBatch* b) KVTIER_REQUIRES(write_mu_);
  void QueueWrite(PutBatch* b, uint64_t off) KVTIER_REQUIRES(write_mu_);
  bool AwaitWrites(PutBatch* b) KVTIER_REQUIRES(write_mu_);
  void FailWriterRing(PutBatch* b, const Status& st) KVTIER_REQUIRES(write_mu_);
  Status SyncLocked() KVTIER_REQUIRES(write_mu_);

  // Get's and GetSlice's steps (disk_reader.cc): find the records, queue reads, check each
  // landed one, drop those found corrupt from the index. RunReads drives them.
  void RunReads(ReadBatch* r);
  void FindRecords(ReadBatch* r);
  void QueueReads(ReadBatch* r);
  void CheckRead(ReadBatch* r, const IoCompletion& c);
  // Whether page is the header of wants[want]'s record (else reported corrupt); sets the
  // payload checksum it holds.
  bool CheckHeader(ReadBatch* r, size_t want, std::span<const std::byte> page,
                   uint64_t* payload_checksum);
  // GetSlice's reads (disk_slice_reader.cc): each want's header page (when checksums are
  // asked for) and its slice, in place or through the bounce buffer.
  void QueueSliceReads(ReadBatch* r);
  void CheckSliceRead(ReadBatch* r, const IoCompletion& c);
  void ReportCorrupt(ReadBatch* r, size_t want, const std::string& problem);
  // Drops the records found corrupt from the index and writes their tombstones: a restart that
  // rebuilt the index from the segments would find them again.
  void DropCorrupt(const std::vector<std::pair<BlockKey, uint64_t>>& corrupt)
      KVTIER_EXCLUDES(write_mu_, mu_);
  // Tombstones for keys just removed from the index, so they stay removed after a restart.
  Status WriteTombstones(std::span<const BlockKey> gone) KVTIER_REQUIRES(write_mu_);

  void Publish(const BlockKey& key, const Location& loc) KVTIER_REQUIRES(mu_);
  // Takes loc's record out of its segment's live counts.
  void Unaccount(const Location& loc) KVTIER_REQUIRES(mu_);
  void SyncLoop();

  const DiskOptions options_;
  // options_.effective_segment_bytes(), or less when the filesystem holds fewer than two
  // segments; set at open, constant after.
  uint64_t segment_bytes_;
  const uint64_t record_bytes_;
  RemovalFn on_removed_;
  int dir_fd_ = -1;  // flock(LOCK_EX) held on it while open
  bool direct_ = true;
  std::string notes_;
  // options_.capacity_bytes, or less when the filesystem holds less: set at open, lowered (or
  // raised back, never above the option) by a roll that meets a full filesystem. Written under
  // write_mu_, read anywhere.
  std::atomic<uint64_t> capacity_bytes_;
  std::atomic<bool> write_failing_{false};  // the last roll failed
  LogLimiter log_limit_;
  LogLimiter space_log_;  // capacity changes
  LogLimiter evict_log_;  // evictions for room

  Mutex write_mu_;  // one writer at a time; held across its I/O. Taken before mu_.
  std::unique_ptr<IoContext> writer_ KVTIER_GUARDED_BY(write_mu_);
  uint64_t next_seq_ KVTIER_GUARDED_BY(write_mu_) = 1;
  uint64_t next_segment_id_ KVTIER_GUARDED_BY(write_mu_) = 1;
  // Set at open from the writer's engine; constant afterwards.
  std::string io_name_;
  bool io_registered_ = false;

  mutable Mutex mu_;  // the index and the segment table; never held across I/O
  std::unordered_map<BlockKey, Location, BlockKeyHash> index_ KVTIER_GUARDED_BY(mu_);
  std::map<uint64_t, std::shared_ptr<Segment>> segments_ KVTIER_GUARDED_BY(mu_);
  // Evicted segments whose hot blocks are being copied forward: those blocks stay indexed at
  // their old place and readable from here until the copy publishes the new one.
  std::map<uint64_t, std::shared_ptr<Segment>> retiring_ KVTIER_GUARDED_BY(mu_);
  std::shared_ptr<Segment> active_ KVTIER_GUARDED_BY(mu_);
  uint64_t sealed_bytes_ KVTIER_GUARDED_BY(mu_) = 0;

  Mutex pool_mu_;
  std::vector<std::unique_ptr<IoContext>> readers_ KVTIER_GUARDED_BY(pool_mu_);
  std::vector<std::unique_ptr<IoContext>> broken_ KVTIER_GUARDED_BY(pool_mu_);

  // Set once an io_uring engine failed: contexts made afterwards use pread/pwrite.
  std::atomic<bool> ring_failed_{false};
  std::atomic<uint64_t> written_seq_{0};
  std::atomic<uint64_t> durable_seq_{0};
  std::atomic<uint64_t> syncs_{0}, corruptions_{0}, recovered_{0}, evicted_segments_{0},
      evicted_blocks_{0}, reinserted_{0}, space_evictions_{0};

  Mutex sync_mu_;    // a leaf: never held with mu_ or write_mu_
  CondVar sync_cv_;  // stopping (waited on under sync_mu_)
  bool stop_ KVTIER_GUARDED_BY(sync_mu_) = false;
  std::thread sync_thread_;
};

}  // namespace kvtier::disk

#endif  // KVTIER_TIERS_DISK_DISK_STORE_H_
