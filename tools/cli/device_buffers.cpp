// The CLI's only use of the CUDA runtime: allocation, copies, fills and synchronization behind
// tensors.h. Builds without CUDA get stubs that raise msa::Error, so the CLI links either way.
#include "tensors.h"

#ifdef MSA_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace msa::cli {

#ifdef MSA_WITH_CUDA
namespace {
void check(cudaError_t e, const char* what) {
  MSA_CHECK(e == cudaSuccess, "msa cli: ", what, " failed: ", cudaGetErrorString(e));
}
}  // namespace

void* device_alloc(size_t bytes) {
  void* p = nullptr;
  check(cudaMalloc(&p, bytes), "cudaMalloc");
  return p;
}
void device_free(void* p) noexcept { cudaFree(p); }
// Copies and fills run on the legacy stream, which does not order against the CLI's non-blocking
// stream, so each one waits for the device before returning (none of them is timed).
void copy_to_device(void* dst, const void* src, size_t bytes) {
  check(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy to device");
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}
void copy_to_host(void* dst, const void* src, size_t bytes) {
  check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy to host");
}
void device_fill(void* p, int byte, size_t bytes) {
  check(cudaMemset(p, byte, bytes), "cudaMemset");
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}
cudaStream_t stream_create() {
  cudaStream_t s = nullptr;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  return s;
}
void stream_destroy(cudaStream_t s) noexcept { cudaStreamDestroy(s); }
void stream_synchronize(cudaStream_t s) { check(cudaStreamSynchronize(s), "cudaStreamSynchronize"); }
std::string device_description(int index) {
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, index), "cudaGetDeviceProperties");
  return detail::concat(prop.name, ", ", prop.multiProcessorCount, " SMs, ",
                        prop.totalGlobalMem >> 30, " GiB");
}
#else
namespace {
[[noreturn]] void no_cuda() { fail("msa cli: this msa was built without CUDA"); }
}  // namespace

void* device_alloc(size_t) { no_cuda(); }
void device_free(void*) noexcept {}
void copy_to_device(void*, const void*, size_t) { no_cuda(); }
void copy_to_host(void*, const void*, size_t) { no_cuda(); }
void device_fill(void*, int, size_t) { no_cuda(); }
cudaStream_t stream_create() { no_cuda(); }
void stream_destroy(cudaStream_t) noexcept {}
void stream_synchronize(cudaStream_t) { no_cuda(); }
std::string device_description(int) { no_cuda(); }
#endif

}  // namespace msa::cli
