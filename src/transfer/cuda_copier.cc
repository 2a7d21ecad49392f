#include "transfer/cuda_copier.h"

#include <algorithm>
#include <thread>
#include <vector>

#ifdef KVTIER_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include "common/clock.h"

namespace kvtier {

#ifndef KVTIER_HAVE_CUDA

Status CudaAvailable() { return Status::Unavailable("kvtier was built without CUDA"); }

struct CudaCopier::Impl {};
CudaCopier::CudaCopier(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaCopier::~CudaCopier() = default;
Result<std::unique_ptr<CudaCopier>> CudaCopier::Open(int) { return CudaAvailable(); }
Status CudaCopier::Post(CopyDirection, std::span<const CopySegment>, uint32_t) {
  return CudaAvailable();
}
Status CudaCopier::WaitLayer(CopyDirection, uint32_t, std::chrono::milliseconds) {
  return CudaAvailable();
}
Status CudaCopier::WaitAll(CopyDirection, std::chrono::milliseconds) { return CudaAvailable(); }
bool CudaCopier::batched() const { return false; }
std::string CudaCopier::device_name() const { return ""; }

#else

namespace {

Status CudaError(const char* what, cudaError_t err) {
  return Status::Unavailable(std::string(what) + ": " + cudaGetErrorString(err));
}

#define KVTIER_CUDA_RETURN(what, expr)                     \
  do {                                                     \
    cudaError_t err_ = (expr);                             \
    if (err_ != cudaSuccess) return CudaError(what, err_); \
  } while (0)

}  // namespace

Status CudaAvailable() {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return CudaError("no CUDA device", err);
  }
  if (n == 0) return Status::Unavailable("no CUDA device: the driver reports none");
  return Status::Ok();
}

struct CudaCopier::Impl {
  struct Lane {
    cudaStream_t stream = nullptr;
    std::vector<cudaEvent_t> layer_done;  // one per layer of the last Post
    uint32_t posted_layers = 0;
  };
  int device = 0;
  std::string name;
  Lane lanes[2];
  bool batch_api = CUDART_VERSION >= 12080;  // cleared when the driver refuses a batch

  ~Impl() {
    cudaSetDevice(device);
    for (Lane& l : lanes) {
      if (l.stream) cudaStreamSynchronize(l.stream);
      for (cudaEvent_t e : l.layer_done) cudaEventDestroy(e);
      if (l.stream) cudaStreamDestroy(l.stream);
    }
  }

  Status Batch(Lane& lane, std::span<const CopySegment> segs) {
    if (segs.empty()) return Status::Ok();
    std::vector<void*> dsts(segs.size());
    std::vector<const void*> srcs(segs.size());
    std::vector<size_t> sizes(segs.size());
    for (size_t i = 0; i < segs.size(); ++i) {
      dsts[i] = segs[i].dst;
      srcs[i] = segs[i].src;
      sizes[i] = segs[i].bytes;
    }
#if CUDART_VERSION >= 12080
    if (batch_api) {
      cudaMemcpyAttributes attr{};
      attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
      size_t attr_idx = 0;
#if CUDART_VERSION >= 13000
      cudaError_t err = cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), segs.size(),
                                             &attr, &attr_idx, 1, lane.stream);
#else
      size_t fail_idx = 0;
      cudaError_t err =
          cudaMemcpyBatchAsync(dsts.data(), const_cast<void**>(srcs.data()), sizes.data(),
                               segs.size(), &attr, &attr_idx, 1, &fail_idx, lane.stream);
#endif
      if (err == cudaSuccess) return Status::Ok();
      (void)cudaGetLastError();  // the loop below instead, from now on
      batch_api = false;
    }
#endif
    for (size_t i = 0; i < segs.size(); ++i)
      KVTIER_CUDA_RETURN("cudaMemcpyAsync", cudaMemcpyAsync(dsts[i], srcs[i], sizes[i],
                                                            cudaMemcpyDefault, lane.stream));
    return Status::Ok();
  }
};

CudaCopier::CudaCopier(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaCopier::~CudaCopier() = default;

Result<std::unique_ptr<CudaCopier>> CudaCopier::Open(int device) {
  KVTIER_RETURN_IF_ERROR(CudaAvailable());
  auto impl = std::make_unique<Impl>();
  impl->device = device;
  KVTIER_CUDA_RETURN("cudaSetDevice", cudaSetDevice(device));
  cudaDeviceProp prop{};
  KVTIER_CUDA_RETURN("cudaGetDeviceProperties", cudaGetDeviceProperties(&prop, device));
  impl->name = prop.name;
  for (auto& lane : impl->lanes)
    KVTIER_CUDA_RETURN("cudaStreamCreate",
                       cudaStreamCreateWithFlags(&lane.stream, cudaStreamNonBlocking));
  return std::unique_ptr<CudaCopier>(new CudaCopier(std::move(impl)));
}

Status CudaCopier::Post(CopyDirection dir, std::span<const CopySegment> segments,
                        uint32_t num_layers) {
  if (num_layers == 0) return Status::InvalidArgument("num_layers: must be >= 1");
  Impl::Lane& lane = impl_->lanes[static_cast<int>(dir)];
  std::vector<CopySegment> sorted(segments.begin(), segments.end());
  for (size_t i = 0; i < sorted.size(); ++i)
    if (sorted[i].layer >= num_layers)
      return Status::InvalidArgument("segment " + std::to_string(i) + ": layer " +
                                     std::to_string(sorted[i].layer) + " is not below " +
                                     std::to_string(num_layers));
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const CopySegment& a, const CopySegment& b) { return a.layer < b.layer; });
  KVTIER_CUDA_RETURN("cudaSetDevice", cudaSetDevice(impl_->device));
  while (lane.layer_done.size() < num_layers) {
    cudaEvent_t e;
    KVTIER_CUDA_RETURN("cudaEventCreate", cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    lane.layer_done.push_back(e);
  }
  size_t begin = 0;
  for (uint32_t l = 0; l < num_layers; ++l) {
    size_t end = begin;
    while (end < sorted.size() && sorted[end].layer == l) ++end;
    KVTIER_RETURN_IF_ERROR(impl_->Batch(lane, std::span(sorted).subspan(begin, end - begin)));
    KVTIER_CUDA_RETURN("cudaEventRecord", cudaEventRecord(lane.layer_done[l], lane.stream));
    begin = end;
  }
  lane.posted_layers = num_layers;
  return Status::Ok();
}

Status CudaCopier::WaitLayer(CopyDirection dir, uint32_t layer, std::chrono::milliseconds timeout) {
  Impl::Lane& lane = impl_->lanes[static_cast<int>(dir)];
  if (layer >= lane.posted_layers)
    return Status::InvalidArgument("layer " + std::to_string(layer) + " was not posted");
  const auto deadline = MonotonicNow() + timeout;
  for (;;) {
    cudaError_t err = cudaEventQuery(lane.layer_done[layer]);
    if (err == cudaSuccess) return Status::Ok();
    if (err != cudaErrorNotReady) return CudaError("cudaEventQuery", err);
    if (MonotonicNow() >= deadline)
      return Status::Unavailable("layer " + std::to_string(layer) + " copy timed out after " +
                                 std::to_string(timeout.count()) + " ms");
    std::this_thread::yield();
  }
}

Status CudaCopier::WaitAll(CopyDirection dir, std::chrono::milliseconds timeout) {
  Impl::Lane& lane = impl_->lanes[static_cast<int>(dir)];
  if (lane.posted_layers == 0) return Status::Ok();
  return WaitLayer(dir, lane.posted_layers - 1, timeout);
}

bool CudaCopier::batched() const { return impl_->batch_api; }
std::string CudaCopier::device_name() const { return impl_->name; }

#endif  // KVTIER_HAVE_CUDA

}  // namespace kvtier
