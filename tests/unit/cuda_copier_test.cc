#include "transfer/cuda_copier.h"

#include <gtest/gtest.h>

#ifdef KVTIER_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include <cstring>
#include <vector>

namespace kvtier {
namespace {

TEST(CudaCopierTest, SaysWhyWhenThereIsNoGpu) {
  Status avail = CudaAvailable();
  if (avail.ok()) GTEST_SKIP() << "a GPU is present; this checks the no-GPU path";
  EXPECT_EQ(avail.code(), StatusCode::kUnavailable);
  EXPECT_FALSE(avail.message().empty());
  auto copier = CudaCopier::Open();
  EXPECT_EQ(copier.status().code(), StatusCode::kUnavailable);
}

TEST(CudaCopierTest, LayerwiseRoundTripThroughTheDevice) {
  Status avail = CudaAvailable();
  if (!avail.ok()) GTEST_SKIP() << "needs a CUDA GPU: " << avail.message();
#ifdef KVTIER_HAVE_CUDA
  constexpr std::chrono::milliseconds kTimeout{30000};
  auto copier = CudaCopier::Open();
  ASSERT_TRUE(copier.ok()) << copier.status().ToString();
  const uint32_t layers = 8;
  const size_t lb = 64 << 10, blocks = 16, bytes = layers * blocks * lb;
  std::byte *host, *back, *dev;
  ASSERT_EQ(cudaHostAlloc(reinterpret_cast<void**>(&host), bytes, cudaHostAllocDefault),
            cudaSuccess);
  ASSERT_EQ(cudaHostAlloc(reinterpret_cast<void**>(&back), bytes, cudaHostAllocDefault),
            cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dev), bytes), cudaSuccess);
  for (size_t i = 0; i < bytes; ++i) host[i] = static_cast<std::byte>(i * 131 + 7);
  std::memset(back, 0, bytes);
  std::vector<CopySegment> up, down;
  for (uint32_t l = 0; l < layers; ++l)
    for (size_t b = 0; b < blocks; ++b) {
      const size_t off = (b * layers + l) * lb;  // block-major, as in a kvtier block
      up.push_back({host + off, dev + off, lb, l});
      down.push_back({dev + off, back + off, lb, l});
    }
  ASSERT_TRUE((*copier)->Post(CopyDirection::kHostToDevice, up, layers).ok());
  for (uint32_t l = 0; l < layers; ++l)
    ASSERT_TRUE((*copier)->WaitLayer(CopyDirection::kHostToDevice, l, kTimeout).ok());
  ASSERT_TRUE((*copier)->Post(CopyDirection::kDeviceToHost, down, layers).ok());
  ASSERT_TRUE((*copier)->WaitAll(CopyDirection::kDeviceToHost, kTimeout).ok());
  EXPECT_EQ(std::memcmp(host, back, bytes), 0);
  EXPECT_EQ((*copier)->WaitLayer(CopyDirection::kHostToDevice, layers, kTimeout).code(),
            StatusCode::kInvalidArgument);
  cudaFree(dev);
  cudaFreeHost(host);
  cudaFreeHost(back);
#endif
}

}  // namespace
}  // namespace kvtier
