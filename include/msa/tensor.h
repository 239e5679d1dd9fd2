// The non-owning tensor view every msa entry point takes, its dtypes and devices, DLPack
// conversion (msa/dlpack.h), and the shape/dtype/stride checks with argument-naming messages.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "msa/error.h"

struct CUstream_st;
// Same typedef as cuda_runtime_api.h, so public headers need no CUDA include.
typedef struct CUstream_st* cudaStream_t;

namespace msa {

enum class DType : uint8_t {
  f32,
  f16,
  bf16,
  fp8_e4m3,  // OCP e4m3 "fn": no inf, NaN = 0x7f/0xff, max 448
  fp4x2,     // two e2m1 values per byte, element 2i in the low nibble (sizes count bytes)
  e8m0,      // UE8M0 power-of-two scale byte: 2^(x - 127), 0xff = NaN
  u8,
  i32,
  boolean,   // one byte, 0 = false, 1 = true (DLPack kDLBool, torch.bool, numpy bool_); "bool"
};

const char* dtype_name(DType t);
size_t dtype_size(DType t);  // bytes per stored element (fp4x2: 1 byte = 2 values)

enum class DeviceType : uint8_t { cpu, cuda };

struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
};
std::string device_name(Device d);

// A non-owning strided view. Strides are in elements (as in DLPack). A default-constructed
// view (data == nullptr, ndim == 0) means "absent" for optional arguments.
struct Tensor {
  static constexpr int kMaxDims = 6;

  void* data = nullptr;
  DType dtype = DType::f32;
  Device device{};
  int ndim = 0;
  int64_t shape[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};

  Tensor() = default;
  // Contiguous (row-major) view.
  Tensor(void* data, DType dtype, std::initializer_list<int64_t> shape, Device device = {});
  Tensor(void* data, DType dtype, const std::vector<int64_t>& shape, Device device = {});
  // Explicit strides (elements).
  Tensor(void* data, DType dtype, const std::vector<int64_t>& shape,
         const std::vector<int64_t>& strides, Device device = {});

  bool defined() const { return data != nullptr || ndim > 0; }
  int64_t size(int d) const { return shape[d < 0 ? d + ndim : d]; }
  int64_t stride(int d) const { return strides[d < 0 ? d + ndim : d]; }
  int64_t numel() const;
  bool is_contiguous() const;
  bool is_cuda() const { return device.type == DeviceType::cuda; }
  template <typename T>
  T* ptr() const { return static_cast<T*>(data); }
  std::string describe() const;  // e.g. "bf16[8192, 64, 128] on cpu"
};


// ---- argument checks: each throws msa::Error naming `name` and the rule ----
// The layout rules (contiguity, alignment) pass a view with no elements, whatever its strides.
void check_defined(const Tensor& t, const char* name);
void check_dtype(const Tensor& t, const char* name, std::initializer_list<DType> allowed);
void check_ndim(const Tensor& t, const char* name, int ndim);
// shape must equal `expected`; an entry of -1 matches any size.
void check_shape(const Tensor& t, const char* name, std::initializer_list<int64_t> expected);
void check_last_dim_contiguous(const Tensor& t, const char* name);
void check_contiguous(const Tensor& t, const char* name);
// Every row (all strides but the last) and the base pointer are 16-byte aligned.
void check_row_alignment(const Tensor& t, const char* name, size_t bytes = 16);
void check_same_device(const Tensor& a, const char* an, const Tensor& b, const char* bn);

}  // namespace msa
