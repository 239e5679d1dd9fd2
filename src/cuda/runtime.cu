// CUDA runtime facts for the library (built_with_cuda, device count, the current device's SMs:
// device/info.h) and the status buffer's device side (backend.h: read_status, clear_status).
#include <cuda_runtime.h>

#include <atomic>

#include "backend.h"
#include "cuda/device/check.h"
#include "cuda/device/info.h"

namespace msa {

bool built_with_cuda() { return true; }

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error so later calls start clean
    return 0;
  }
  return n;
}

namespace cuda {

namespace {

// An attribute of the current device, asked of the runtime once per device (a call's launches
// each ask for the SM count: ~0.3 us a query on the H200).
int cached_attribute(std::atomic<int> (&cache)[64], cudaDeviceAttr attr) {
  int dev = 0, n = 0;
  MSA_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < 64 && (n = cache[dev].load(std::memory_order_relaxed)) > 0) return n;
  MSA_CUDA_CHECK(cudaDeviceGetAttribute(&n, attr, dev));
  if (dev < 64) cache[dev].store(n, std::memory_order_relaxed);
  return n;
}

}  // namespace

int current_sm_count() {
  static std::atomic<int> counts[64] = {};
  return cached_attribute(counts, cudaDevAttrMultiProcessorCount);
}

int current_l2_bytes() {
  static std::atomic<int> bytes[64] = {};
  return cached_attribute(bytes, cudaDevAttrL2CacheSize);
}

void read_status(const Tensor& status, cudaStream_t stream, int32_t out[4]) {
  cudaError_t e = cudaMemcpyAsync(out, status.data, 4 * sizeof(int32_t), cudaMemcpyDeviceToHost,
                                  stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
  MSA_CHECK(e == cudaSuccess, "check_status: CUDA error ", cudaGetErrorString(e));
}

void clear_status(const Tensor& status, cudaStream_t stream) {
  const cudaError_t e = cudaMemsetAsync(status.data, 0, 4 * sizeof(int32_t), stream);
  MSA_CHECK(e == cudaSuccess, "clear_status: CUDA error ", cudaGetErrorString(e));
}

}  // namespace cuda

}  // namespace msa
