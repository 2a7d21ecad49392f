// Transfers: asynchronous, batched copies of KV bytes, in NIXL's shape.
//
//   auto h = engine->Prepare(segments, num_layers);  // validate, coalesce, order by layer
//   engine->Post(*h, timeout);                       // queue it (waits while the queue is full)
//   h->Poll();  h->Wait(timeout);  h->WaitLayer(l, timeout);
//   h->Release();                                    // or destroy: cancels what has not started
//
// A segment belongs to one layer: WaitLayer(l) returns once every segment of layer l is copied,
// so an engine computes layer l while layer l + 1 is still arriving. Segments whose source and
// destination both continue the previous one's are coalesced into one copy; large segments are
// split so every worker thread shares them. "In progress" is a state of the handle, never a
// Status code.
//
// Thread-safety: TransferEngine's methods may be called from any thread. A TransferHandle is
// used by one thread at a time (Wait and Poll may race with the workers, not with Release).
// Ownership: the buffers a transfer names must stay valid until it is done, cancelled or
// released; after Release() (or the handle's destruction) returns, no worker touches them.
// Handles must be released before their engine is destroyed.
#ifndef KVTIER_TRANSFER_TRANSFER_H_
#define KVTIER_TRANSFER_TRANSFER_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "kvtier/layout.h"
#include "kvtier/status.h"

namespace kvtier {

struct CopySegment {
  const std::byte* src = nullptr;
  std::byte* dst = nullptr;
  size_t bytes = 0;
  uint32_t layer = 0;  // completion group: WaitLayer(layer) waits for it
};

enum class TransferState : uint8_t {
  kPrepared,   // built, not posted
  kPosted,     // queued or copying
  kDone,       // every byte copied
  kCancelled,  // released before it finished: some bytes may not have been copied
};
std::string_view TransferStateName(TransferState state);

struct TransferOptions {
  int threads = 2;                         // worker threads, 1..64
  size_t queue_bytes = size_t{256} << 20;  // posted, no copy started; Post waits beyond it
  size_t chunk_bytes = size_t{4} << 20;    // a longer segment is split into chunks this big
  // OK, or InvalidArgument naming the field.
  Status Validate() const;
};

class TransferEngine;

// Move-only; an empty handle (default-constructed or moved from) is not valid().
class TransferHandle {
 public:
  struct State;  // the transfer's copies and progress, shared with the engine's workers

  TransferHandle() = default;
  TransferHandle(TransferHandle&& other) noexcept;
  TransferHandle& operator=(TransferHandle&& other) noexcept;
  TransferHandle(const TransferHandle&) = delete;
  TransferHandle& operator=(const TransferHandle&) = delete;
  // Release()s.
  ~TransferHandle();

  bool valid() const { return t_ != nullptr; }
  TransferState Poll() const;
  // OK once every segment is copied. Unavailable("transfer timed out after N ms") when the
  // timeout passes first (the transfer goes on), or "transfer was cancelled"; InvalidArgument
  // on an empty or unposted handle.
  Status Wait(std::chrono::milliseconds timeout) const;
  // The same for the segments of one layer; InvalidArgument for a layer >= num_layers().
  Status WaitLayer(uint32_t layer, std::chrono::milliseconds timeout) const;

  uint32_t num_layers() const;
  uint64_t bytes() const;
  size_t num_copies() const;  // copies after coalescing and splitting

  // Drops the copies not yet started and waits for those in progress; the handle stays, in
  // state kCancelled unless everything was already copied. No-op on an empty handle.
  void Cancel();
  // Cancel(), then empties the handle. Idempotent.
  void Release();

 private:
  friend class TransferEngine;
  std::shared_ptr<State> t_;
};

class TransferEngine {
 public:
  static Result<std::unique_ptr<TransferEngine>> Open(const TransferOptions& options);
  // Cancels whatever is still queued and joins the workers.
  ~TransferEngine();
  TransferEngine(const TransferEngine&) = delete;
  TransferEngine& operator=(const TransferEngine&) = delete;

  // Validates (no null pointer with bytes, no layer >= num_layers, num_layers >= 1), orders by
  // layer (stable), coalesces and splits. InvalidArgument naming the segment otherwise.
  Result<TransferHandle> Prepare(std::span<const CopySegment> segments, uint32_t num_layers);
  // Queues a prepared transfer. Waits up to timeout while the queue holds queue_bytes (a
  // transfer larger than the whole queue goes in once the queue is empty); ResourceExhausted
  // ("transfer queue full for N ms") then, and the handle stays prepared.
  Status Post(TransferHandle& handle, std::chrono::milliseconds timeout);

  const TransferOptions& options() const;
  size_t queued_bytes() const;

  class Impl;

 private:
  explicit TransferEngine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Segments that copy blocks src[i] -> dst[i] of `layout` one layer slice at a time (layer l of
// every block is segment group l), for a layer-wise load between two block-contiguous pools.
// InvalidArgument when the spans differ in length or a block has the wrong size.
Result<std::vector<CopySegment>> LayerwiseSegments(const KvLayout& layout,
                                                   std::span<const std::span<const std::byte>> src,
                                                   std::span<const std::span<std::byte>> dst);

}  // namespace kvtier

#endif  // KVTIER_TRANSFER_TRANSFER_H_
