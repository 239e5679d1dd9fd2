// Tensor view basics: dtype/device names, construction, contiguity, descriptions.
#include <sstream>

#include "msa/common.h"
#include "msa/tensor.h"

namespace msa {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::fp8_e4m3: return "fp8_e4m3";
    case DType::fp4x2: return "fp4x2";
    case DType::e8m0: return "e8m0";
    case DType::u8: return "u8";
    case DType::i32: return "i32";
    case DType::boolean: return "bool";
  }
  return "?";
}

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: case DType::i32: return 4;
    case DType::f16: case DType::bf16: return 2;
    default: return 1;
  }
}

std::string device_name(Device d) {
  return d.type == DeviceType::cpu ? std::string("cpu") : "cuda:" + std::to_string(d.index);
}

const char* kv_layout_name(KVLayout l) {
  switch (l) {
    case KVLayout::flat: return "flat";
    case KVLayout::paged_nhd: return "paged_nhd";
    case KVLayout::paged_hnd: return "paged_hnd";
  }
  return "?";
}

// A view of more than 2^63 - 1 elements is refused, so numel() and the sizes callers compute from
// it fit int64 (a DLPack producer may claim any shape). The row-major strides of an empty view
// may still not fit ([0, 2^62, 4]: 2^64 for dim 0); they saturate, as no address is formed from
// an empty view's strides.
static void init_view(Tensor& t, const int64_t* shape, int n, const int64_t* strides) {
  MSA_CHECK(n >= 0 && n <= Tensor::kMaxDims, "tensor: ndim must be in [0, ", Tensor::kMaxDims,
            "], got ", n);
  bool empty = false;
  for (int d = n - 1; d >= 0; --d) {
    MSA_CHECK(shape[d] >= 0, "tensor: shape[", d, "] must be >= 0, got ", shape[d]);
    empty |= shape[d] == 0;
    t.shape[d] = shape[d];
  }
  t.ndim = n;
  int64_t count = 1, s = 1;
  for (int d = n - 1; d >= 0; --d) {
    MSA_CHECK(empty || !__builtin_mul_overflow(count, shape[d], &count), "tensor: ",
              t.describe(), " has more than 2^63 - 1 elements");
    t.strides[d] = strides ? strides[d] : s;
    if (shape[d] > 1 && __builtin_mul_overflow(s, shape[d], &s)) s = INT64_MAX;
  }
}

Tensor::Tensor(void* p, DType dt, std::initializer_list<int64_t> shp, Device dev)
    : data(p), dtype(dt), device(dev) {
  init_view(*this, shp.begin(), static_cast<int>(shp.size()), nullptr);
}

Tensor::Tensor(void* p, DType dt, const std::vector<int64_t>& shp, Device dev)
    : data(p), dtype(dt), device(dev) {
  init_view(*this, shp.data(), static_cast<int>(shp.size()), nullptr);
}

Tensor::Tensor(void* p, DType dt, const std::vector<int64_t>& shp,
               const std::vector<int64_t>& str, Device dev)
    : data(p), dtype(dt), device(dev) {
  MSA_CHECK(shp.size() == str.size(), "tensor: shape and strides must have the same length (",
            shp.size(), " vs ", str.size(), ")");
  init_view(*this, shp.data(), static_cast<int>(shp.size()), str.data());
}

// Views made by the constructors hold at most 2^63 - 1 elements; one whose fields were set
// directly may claim more, and saturates (an empty one is 0 whatever its other dims).
int64_t Tensor::numel() const {
  for (int d = 0; d < ndim; ++d)
    if (shape[d] == 0) return 0;
  int64_t n = 1;
  for (int d = 0; d < ndim; ++d)
    if (__builtin_mul_overflow(n, shape[d], &n)) return INT64_MAX;
  return n;
}

bool Tensor::is_contiguous() const {
  if (numel() == 0) return true;  // an empty view has no element whose address strides decide
  int64_t s = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    if (shape[d] != 1 && strides[d] != s) return false;
    if (d > 0 && __builtin_mul_overflow(s, shape[d], &s)) return false;  // no stride equals it
  }
  return true;
}

std::string Tensor::describe() const {
  std::ostringstream os;
  os << dtype_name(dtype) << "[";
  for (int d = 0; d < ndim; ++d) os << (d ? ", " : "") << shape[d];
  os << "] on " << device_name(device);
  return os.str();
}

}  // namespace msa
