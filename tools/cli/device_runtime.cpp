// The CLI's CUDA runtime calls besides device memory (bench::DeviceBuffer): streams, their
// synchronization and the device's description, declared in tensors.h. Builds without CUDA get
// stubs that raise msa::Error, so the CLI links either way.
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

cudaStream_t stream_create() { no_cuda(); }
void stream_destroy(cudaStream_t) noexcept {}
void stream_synchronize(cudaStream_t) { no_cuda(); }
std::string device_description(int) { no_cuda(); }
#endif

}  // namespace msa::cli
