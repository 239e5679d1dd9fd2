// Shared helpers of the GPU tests: skip without a device, an owning device buffer, a test stream
// (never the legacy default stream), and NaN poisoning.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "cuda/device/check.h"
#include "msa/msa.h"

namespace msa::test {

// Use at the top of every GPU test body.
#define MSA_REQUIRE_GPU()                                                  \
  do {                                                                     \
    if (::msa::cuda_device_count() == 0)                                   \
      GTEST_SKIP() << "no CUDA device: skipping GPU test";                 \
  } while (0)

// Owning device allocation (tests only; library entry points never allocate).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes) MSA_CUDA_CHECK(cudaMalloc(&ptr_, bytes));
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr; o.bytes_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  ~DeviceBuffer() { if (ptr_) cudaFree(ptr_); }

  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  template <typename T>
  void upload(const std::vector<T>& h, cudaStream_t s) {
    EXPECT_LE(h.size() * sizeof(T), bytes_);
    MSA_CUDA_CHECK(cudaMemcpyAsync(ptr_, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice, s));
  }
  template <typename T>
  std::vector<T> download(size_t n, cudaStream_t s) const {
    std::vector<T> h(n);
    MSA_CUDA_CHECK(cudaMemcpyAsync(h.data(), ptr_, n * sizeof(T), cudaMemcpyDeviceToHost, s));
    MSA_CUDA_CHECK(cudaStreamSynchronize(s));
    return h;
  }
  // Fills with 0xff bytes: NaN for f32/f16/bf16, -1 for int32.
  void poison(cudaStream_t s) { if (bytes_) MSA_CUDA_CHECK(cudaMemsetAsync(ptr_, 0xff, bytes_, s)); }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// A non-blocking stream for each test.
class TestStream {
 public:
  TestStream() { MSA_CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
  ~TestStream() { cudaStreamDestroy(s_); }
  operator cudaStream_t() const { return s_; }  // NOLINT

 private:
  cudaStream_t s_{};
};

inline Device gpu0() { return {DeviceType::cuda, 0}; }

}  // namespace msa::test
