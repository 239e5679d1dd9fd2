// An owning device allocation with stream-ordered copies and fills: the one buffer type of the
// GPU tests, the benchmark runners and the CLI (msa's entry points never allocate for the caller).
// Host code: the CUDA calls live in device_buffer.cpp, which throws msa::Error without CUDA.
#pragma once

#include <cstddef>
#include <vector>

#include "msa/tensor.h"

namespace msa::bench {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  // Exactly `bytes` on the current device (none, get() null, for 0): no slack, so that
  // compute-sanitizer flags a kernel reading past a tensor.
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }

  // Copies and fills are ordered on `s` (nullptr: the legacy default stream). upload and fill
  // return once the host data is staged; download waits for `s`, so its result is ready on
  // return. Ranges past bytes() throw msa::Error.
  void upload(const void* src, size_t bytes, cudaStream_t s, size_t offset = 0);
  void download(void* dst, size_t bytes, cudaStream_t s, size_t offset = 0) const;
  void fill(int byte, cudaStream_t s);
  // 0xff in every byte: NaN for f32/f16/bf16, -1 for int32, so unwritten outputs show.
  void poison(cudaStream_t s) { fill(0xff, s); }

  template <typename T>
  void upload(const std::vector<T>& h, cudaStream_t s) {
    upload(h.data(), h.size() * sizeof(T), s);
  }
  template <typename T>
  std::vector<T> download(size_t n, cudaStream_t s) const {
    std::vector<T> h(n);
    download(h.data(), n * sizeof(T), s);
    return h;
  }
  // A buffer of exactly h's bytes holding h.
  template <typename T>
  static DeviceBuffer from_host(const std::vector<T>& h, cudaStream_t s) {
    DeviceBuffer b(h.size() * sizeof(T));
    b.upload(h, s);
    return b;
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace msa::bench
