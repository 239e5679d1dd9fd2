// DeviceBuffer's CUDA runtime calls (device_buffer.h). Builds without CUDA get stubs that throw
// msa::Error, so host-only users (the CLI) link either way.
#include "workloads/device_buffer.h"

#include <utility>

#include "msa/error.h"

#ifdef MSA_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace msa::bench {
namespace {

#ifdef MSA_WITH_CUDA
void check(cudaError_t e, const char* what) {
  MSA_CHECK(e == cudaSuccess, "device buffer: ", what, " failed: ", cudaGetErrorString(e));
}
#else
[[noreturn]] void no_cuda() { fail("device buffer: this msa was built without CUDA"); }
#endif

void check_range(size_t offset, size_t bytes, size_t size, const char* what) {
  MSA_CHECK(offset <= size && bytes <= size - offset, "device buffer: ", what, " of ", bytes,
            " bytes at offset ", offset, " exceeds a ", size, "-byte buffer");
}

}  // namespace

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes == 0) return;
#ifdef MSA_WITH_CUDA
  check(cudaMalloc(&ptr_, bytes), "cudaMalloc");
#else
  no_cuda();
#endif
}

DeviceBuffer::~DeviceBuffer() {
#ifdef MSA_WITH_CUDA
  if (ptr_) cudaFree(ptr_);
#endif
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept
    : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  std::swap(ptr_, o.ptr_);
  std::swap(bytes_, o.bytes_);
  return *this;
}

void DeviceBuffer::upload(const void* src, size_t bytes, cudaStream_t s, size_t offset) {
  check_range(offset, bytes, bytes_, "upload");
  if (bytes == 0) return;
#ifdef MSA_WITH_CUDA
  check(cudaMemcpyAsync(static_cast<char*>(ptr_) + offset, src, bytes, cudaMemcpyHostToDevice, s),
        "cudaMemcpyAsync to device");
#else
  (void)src;
  (void)s;
  no_cuda();
#endif
}

void DeviceBuffer::download(void* dst, size_t bytes, cudaStream_t s, size_t offset) const {
  check_range(offset, bytes, bytes_, "download");
#ifdef MSA_WITH_CUDA
  if (bytes > 0)
    check(cudaMemcpyAsync(dst, static_cast<const char*>(ptr_) + offset, bytes,
                          cudaMemcpyDeviceToHost, s),
          "cudaMemcpyAsync to host");
  check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
#else
  (void)dst;
  (void)s;
  no_cuda();
#endif
}

void DeviceBuffer::fill(int byte, cudaStream_t s) {
  if (bytes_ == 0) return;
#ifdef MSA_WITH_CUDA
  check(cudaMemsetAsync(ptr_, byte, bytes_, s), "cudaMemsetAsync");
#else
  (void)byte;
  (void)s;
  no_cuda();
#endif
}

}  // namespace msa::bench
