// Owning host or device buffers for the CLI: msa's entry points take non-owning views and never
// allocate for the caller, so the CLI owns its memory here. Device memory is a bench::DeviceBuffer
// (workloads/device_buffer.h); the CLI's other CUDA calls live in device_runtime.cpp.
#pragma once

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "msa/msa.h"
#include "workloads/device_buffer.h"

namespace msa::cli {

// CUDA runtime wrappers (device_runtime.cpp). Without MSA_WITH_CUDA each throws msa::Error.
cudaStream_t stream_create();
void stream_destroy(cudaStream_t s) noexcept;
void stream_synchronize(cudaStream_t s);
std::string device_description(int index);  // e.g. "NVIDIA H200, 132 SMs, 140 GiB"

// A contiguous allocation on the CPU (256-byte aligned, as msa's row checks want 16) or on a
// CUDA device (bench::DeviceBuffer). Move-only.
class Buffer {
 public:
  Buffer() = default;
  Buffer(size_t bytes, Device device) : bytes_(bytes), device_(device) {
    if (bytes == 0) return;
    if (device.type == DeviceType::cuda) {
      device_mem_ = bench::DeviceBuffer(bytes);
      return;
    }
    host_mem_.reset(std::aligned_alloc(256, (bytes + 255) / 256 * 256));
    MSA_CHECK(host_mem_ != nullptr, "msa cli: out of host memory allocating ", bytes, " bytes");
  }

  void* data() const { return device_.type == DeviceType::cuda ? device_mem_.get() : host_mem_.get(); }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

  // A contiguous view; the shape must fit in the allocation.
  Tensor view(DType dtype, const std::vector<int64_t>& shape) const {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    MSA_CHECK(static_cast<size_t>(n) * dtype_size(dtype) <= bytes_, "msa cli: view of ", n, " ",
              dtype_name(dtype), " elements exceeds a ", bytes_, "-byte buffer");
    return Tensor(data(), dtype, shape, device_);
  }

  // Device copies and fills run on the legacy stream, which does not order against the CLI's
  // non-blocking stream, so each one waits for it before returning (none of them is timed).
  void upload(const void* src, size_t bytes, size_t offset = 0) {
    if (device_.type != DeviceType::cuda) {
      std::memcpy(static_cast<char*>(data()) + offset, src, bytes);
      return;
    }
    device_mem_.upload(src, bytes, nullptr, offset);
    stream_synchronize(nullptr);
  }
  void download(void* dst, size_t bytes, size_t offset = 0) const {
    if (device_.type == DeviceType::cuda) device_mem_.download(dst, bytes, nullptr, offset);
    else std::memcpy(dst, static_cast<const char*>(data()) + offset, bytes);
  }
  // Every byte set to `byte`: 0xff poisons bf16/f32 outputs with NaN before a run.
  void fill(int byte) {
    if (device_.type != DeviceType::cuda) {
      std::memset(data(), byte, bytes_);
      return;
    }
    device_mem_.fill(byte, nullptr);
    stream_synchronize(nullptr);
  }

  template <typename T>
  static Buffer from_host(const std::vector<T>& v, Device device) {
    Buffer b(v.size() * sizeof(T), device);
    b.upload(v.data(), b.bytes());
    return b;
  }

 private:
  struct HostFree {
    void operator()(void* p) const { std::free(p); }
  };
  std::unique_ptr<void, HostFree> host_mem_;  // CPU
  bench::DeviceBuffer device_mem_;           // CUDA
  size_t bytes_ = 0;
  Device device_{};
};

}  // namespace msa::cli
