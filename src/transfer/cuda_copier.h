// CudaCopier: batched host<->device copies on dedicated streams, one per direction, with an
// event after each layer, so a layer-wise load can be waited on layer by layer.
//
// A batch goes to the driver in one cudaMemcpyBatchAsync where the toolkit has it (12.8+) and
// as a loop of cudaMemcpyAsync otherwise. Host buffers should be pinned (the host arena is
// registered with cudaHostRegister), or the copies are staged by the driver and serialise.
//
// Built without CUDA, or on a machine without a GPU, Open() says why (Unavailable) and nothing
// else is callable.
//
// Thread-safety: one thread at a time per copier (a stream is an ordered queue; callers that
// want parallel streams open several copiers). Ownership: buffers must stay valid until the
// copy's Wait returns OK.
#ifndef KVTIER_SRC_TRANSFER_CUDA_COPIER_H_
#define KVTIER_SRC_TRANSFER_CUDA_COPIER_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "kvtier/status.h"
#include "transfer/transfer.h"

namespace kvtier {

enum class CopyDirection : uint8_t { kHostToDevice, kDeviceToHost };

// OK when a CUDA device can be used; otherwise Unavailable saying why ("built without CUDA",
// "no CUDA device: ...").
Status CudaAvailable();

class CudaCopier {
 public:
  static Result<std::unique_ptr<CudaCopier>> Open(int device = 0);
  ~CudaCopier();
  CudaCopier(const CudaCopier&) = delete;
  CudaCopier& operator=(const CudaCopier&) = delete;

  // Enqueues segments (ordered by layer, each layer one batch followed by an event) on the
  // direction's stream. Returns at once. InvalidArgument for a layer >= num_layers.
  Status Post(CopyDirection dir, std::span<const CopySegment> segments, uint32_t num_layers);
  // Waits for layer `layer` (or, with WaitAll, everything) of the last Post in that
  // direction; Unavailable("... timed out after N ms") past the deadline, or CUDA's error.
  Status WaitLayer(CopyDirection dir, uint32_t layer, std::chrono::milliseconds timeout);
  Status WaitAll(CopyDirection dir, std::chrono::milliseconds timeout);

  // True when batches go through cudaMemcpyBatchAsync.
  bool batched() const;
  std::string device_name() const;

  struct Impl;

 private:
  explicit CudaCopier(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvtier

#endif  // KVTIER_SRC_TRANSFER_CUDA_COPIER_H_
