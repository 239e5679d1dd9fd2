// Argument checks shared by every public entry point. Each message names the argument and the
// rule it broke, then what it got.
#include <cstdint>
#include <sstream>
#include <string>

#include "msa/tensor.h"

namespace msa {

void check_defined(const Tensor& t, const char* name) {
  MSA_CHECK(t.defined(), name, ": required tensor is missing");
  MSA_CHECK(t.data != nullptr || t.numel() == 0, name, ": data pointer is null for ",
            t.describe());
}

void check_dtype(const Tensor& t, const char* name, std::initializer_list<DType> allowed) {
  for (DType d : allowed) {
    if (t.dtype != d) continue;
    // Elements are accessed as their type, so the base address must be a multiple of the element
    // size (strides count elements and keep it): numpy makes unaligned arrays (frombuffer at an
    // odd offset), which would be undefined behaviour on the host and a fault on the GPU.
    const size_t es = dtype_size(d);
    MSA_CHECK(t.numel() == 0 || reinterpret_cast<uintptr_t>(t.data) % es == 0, name,
              ": base pointer must be ", es, "-byte aligned for ", dtype_name(d), " elements");
    return;
  }
  std::ostringstream os;
  int i = 0;
  for (DType d : allowed) os << (i++ ? (i == int(allowed.size()) ? " or " : ", ") : "") << dtype_name(d);
  fail(name, ": dtype must be ", os.str(), ", got ", dtype_name(t.dtype));
}

void check_ndim(const Tensor& t, const char* name, int ndim) {
  MSA_CHECK(t.ndim == ndim, name, ": must have ", ndim, " dims, got ", t.describe());
}

void check_shape(const Tensor& t, const char* name, std::initializer_list<int64_t> expected) {
  std::ostringstream want;
  want << "[";
  int i = 0;
  for (int64_t e : expected) want << (i++ ? ", " : "") << (e < 0 ? std::string("*") : std::to_string(e));
  want << "]";
  MSA_CHECK(t.ndim == int(expected.size()), name, ": shape must be ", want.str(), ", got ",
            t.describe());
  int d = 0;
  for (int64_t e : expected) {
    MSA_CHECK(e < 0 || t.shape[d] == e, name, ": shape must be ", want.str(), ", got ",
              t.describe(), " (dim ", d, ")");
    ++d;
  }
}

// A view with no elements passes the layout rules below: no address is ever formed from its
// strides, and producers give such views arbitrary ones (numpy 2 gives them zero strides).
void check_last_dim_contiguous(const Tensor& t, const char* name) {
  MSA_CHECK(t.ndim == 0 || t.numel() == 0 || t.shape[t.ndim - 1] <= 1 ||
                t.strides[t.ndim - 1] == 1,
            name, ": last dim must be contiguous (stride 1), got stride ", t.strides[t.ndim - 1]);
}

void check_contiguous(const Tensor& t, const char* name) {
  MSA_CHECK(t.is_contiguous(), name, ": must be contiguous, got ", t.describe());
}

void check_row_alignment(const Tensor& t, const char* name, size_t bytes) {
  if (t.numel() == 0) return;
  const size_t es = dtype_size(t.dtype);
  MSA_CHECK(reinterpret_cast<uintptr_t>(t.data) % bytes == 0, name, ": base pointer must be ",
            bytes, "-byte aligned");
  for (int d = 0; d + 1 < t.ndim; ++d) {
    if (t.shape[d] <= 1 || (static_cast<size_t>(t.strides[d]) * es) % bytes == 0) continue;
    // The stride in bytes, for the message, unless it does not fit int64 (a producer's stride).
    int64_t stride_bytes = 0;
    const std::string in_bytes = __builtin_mul_overflow(t.strides[d], int64_t(es), &stride_bytes)
                                     ? " elements of " + std::to_string(es) + " bytes"
                                     : " elements = " + std::to_string(stride_bytes) + " bytes";
    fail(name, ": stride of dim ", d, " (", t.strides[d], in_bytes, ") must be a multiple of ",
         bytes, " bytes");
  }
}

void check_same_device(const Tensor& a, const char* an, const Tensor& b, const char* bn) {
  MSA_CHECK(a.device == b.device, bn, ": must be on the same device as ", an, " (",
            device_name(a.device), "), got ", device_name(b.device));
}

}  // namespace msa
