// Test helpers for the CPU suites: an owning, 64-byte aligned host buffer that hands out
// msa::Tensor views (contiguous or strided), and element get/set by logical index.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "msa/msa.h"

namespace msa::test {

class HostTensor {
 public:
  // Contiguous [shape].
  HostTensor(DType dtype, std::vector<int64_t> shape) : HostTensor(dtype, shape, contiguous(shape)) {}

  // Strided view; the storage covers the largest offset the strides reach.
  HostTensor(DType dtype, std::vector<int64_t> shape, std::vector<int64_t> strides) {
    int64_t span = 1;
    for (size_t d = 0; d < shape.size(); ++d)
      if (shape[d] == 0) span = 0;
    if (span) {
      for (size_t d = 0; d < shape.size(); ++d) span += (shape[d] - 1) * strides[d];
    }
    bytes_ = size_t(span) * dtype_size(dtype);
    const size_t alloc = (bytes_ + 63) / 64 * 64 + 64;
    mem_.reset(static_cast<uint8_t*>(std::aligned_alloc(64, alloc)));
    std::memset(mem_.get(), 0xff, alloc);  // poison: NaN for float types, -1 for int32
    t = Tensor(mem_.get(), dtype, shape, strides);
  }

  template <typename T>
  T* data() const { return static_cast<T*>(t.data); }
  size_t bytes() const { return bytes_; }
  // Element offset of a logical index (strides in elements; fp4x2 counts bytes).
  int64_t offset(std::initializer_list<int64_t> idx) const {
    int64_t o = 0, d = 0;
    for (int64_t i : idx) o += i * t.strides[d++];
    return o;
  }

  Tensor t;

 private:
  static std::vector<int64_t> contiguous(const std::vector<int64_t>& shape) {
    std::vector<int64_t> s(shape.size(), 1);
    for (int d = int(shape.size()) - 2; d >= 0; --d) s[d] = s[d + 1] * shape[d + 1];
    return s;
  }
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  std::unique_ptr<uint8_t, Free> mem_;
  size_t bytes_ = 0;
};

// An int32 [n] tensor holding `v`.
inline HostTensor i32_tensor(const std::vector<int32_t>& v) {
  HostTensor h(DType::i32, {int64_t(v.size())});
  if (!v.empty()) std::memcpy(h.data<int32_t>(), v.data(), v.size() * 4);
  return h;
}

// The cumulative sums [0, l0, l0+l1, ...] of batch lengths.
inline std::vector<int32_t> cumulative(const std::vector<int32_t>& lengths) {
  std::vector<int32_t> c(lengths.size() + 1, 0);
  for (size_t b = 0; b < lengths.size(); ++b) c[b + 1] = c[b] + lengths[b];
  return c;
}

}  // namespace msa::test
