// Owning host or device buffers for the CLI: msa's entry points take non-owning views and never
// allocate for the caller, so the CLI owns its memory here. CUDA calls live in device_buffers.cpp.
#pragma once

#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "msa/msa.h"

namespace msa::cli {

// CUDA runtime wrappers (device_buffers.cpp). Without MSA_WITH_CUDA each throws msa::Error.
void* device_alloc(size_t bytes);
void device_free(void* p) noexcept;
void copy_to_device(void* dst, const void* src, size_t bytes);
void copy_to_host(void* dst, const void* src, size_t bytes);
void device_fill(void* p, int byte, size_t bytes);
cudaStream_t stream_create();
void stream_destroy(cudaStream_t s) noexcept;
void stream_synchronize(cudaStream_t s);
std::string device_description(int index);  // e.g. "NVIDIA H200, 132 SMs, 140 GiB"

// A contiguous allocation on the CPU (256-byte aligned, as msa's row checks want 16) or on a
// CUDA device. Move-only.
class Buffer {
 public:
  Buffer() = default;
  Buffer(size_t bytes, Device device) : bytes_(bytes), device_(device) {
    if (bytes == 0) return;
    data_ = device.type == DeviceType::cuda ? device_alloc(bytes)
                                            : std::aligned_alloc(256, (bytes + 255) / 256 * 256);
    MSA_CHECK(data_ != nullptr, "msa cli: out of host memory allocating ", bytes, " bytes");
  }
  ~Buffer() { release(); }
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::exchange(o.data_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
      device_ = o.device_;
    }
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

  // A contiguous view; the shape must fit in the allocation.
  Tensor view(DType dtype, const std::vector<int64_t>& shape) const {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    MSA_CHECK(static_cast<size_t>(n) * dtype_size(dtype) <= bytes_, "msa cli: view of ", n, " ",
              dtype_name(dtype), " elements exceeds a ", bytes_, "-byte buffer");
    return Tensor(data_, dtype, shape, device_);
  }

  void upload(const void* src, size_t bytes, size_t offset = 0) {
    char* dst = static_cast<char*>(data_) + offset;
    if (device_.type == DeviceType::cuda) copy_to_device(dst, src, bytes);
    else std::memcpy(dst, src, bytes);
  }
  void download(void* dst, size_t bytes, size_t offset = 0) const {
    const char* src = static_cast<const char*>(data_) + offset;
    if (device_.type == DeviceType::cuda) copy_to_host(dst, src, bytes);
    else std::memcpy(dst, src, bytes);
  }
  // Every byte set to `byte`: 0xff poisons bf16/f32 outputs with NaN before a run.
  void fill(int byte) {
    if (device_.type == DeviceType::cuda) device_fill(data_, byte, bytes_);
    else std::memset(data_, byte, bytes_);
  }

  template <typename T>
  static Buffer from_host(const std::vector<T>& v, Device device) {
    Buffer b(v.size() * sizeof(T), device);
    b.upload(v.data(), b.bytes());
    return b;
  }

 private:
  void release() noexcept {
    if (data_ == nullptr) return;
    if (device_.type == DeviceType::cuda) device_free(data_);
    else std::free(data_);
    data_ = nullptr;
  }

  void* data_ = nullptr;
  size_t bytes_ = 0;
  Device device_{};
};

}  // namespace msa::cli
