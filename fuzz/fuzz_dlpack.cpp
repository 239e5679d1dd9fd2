// Fuzz target over the DLPack import the Python bindings use (msa::from_dlpack,
// src/core/dlpack.cpp; python/src/args.cpp hands it the DLTensor nanobind imports) and over the
// view checks every op then applies (numel, contiguity, row alignment, describe). A DLTensor of any
// fields must be imported or refused with msa::Error; an imported view must carry the DLTensor's
// fields, and to_dlpack then from_dlpack must give it back unchanged. The shape and strides arrays
// are allocated with exactly ndim entries, so reading past them is an ASan report. The data is
// never read (the import only forms pointers).
#include <cstdio>

#include "fuzz_input.h"

namespace msa::fuzz {
namespace {

#define FUZZ_ASSERT(cond)                                                           \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "fuzz_dlpack: %s failed at line %d\n", #cond, __LINE__); \
      std::abort();                                                                 \
    }                                                                               \
  } while (0)

int64_t dl_size(Input& in) {
  if (in.flag()) return in.below(9);
  return in.pick<int64_t>({-1, 0, 1, 2, 16, -(int64_t(1) << 62), int64_t(1) << 31, int64_t(1) << 32,
                           int64_t(1) << 62, INT64_MAX, INT64_MIN});
}

bool same_view(const Tensor& a, const Tensor& b) {
  if (a.data != b.data || a.dtype != b.dtype || !(a.device == b.device) || a.ndim != b.ndim)
    return false;
  for (int d = 0; d < a.ndim; ++d)
    if (a.shape[d] != b.shape[d] || a.strides[d] != b.strides[d]) return false;
  return true;
}

void run(Input& in) {
  DLTensor t{};
  t.ndim = int32_t(in.pick<int64_t>({0, 1, 2, 3, 4, 6, 7, -1, 64}));
  const size_t n = size_t(std::max(t.ndim, 0));
  std::unique_ptr<int64_t[]> shape(new int64_t[n]), strides(new int64_t[n]);
  for (size_t d = 0; d < n; ++d) shape[d] = dl_size(in);
  const bool given_strides = in.flag();
  for (size_t d = 0; d < n; ++d) strides[d] = dl_size(in);
  t.shape = shape.get();
  t.strides = given_strides ? strides.get() : nullptr;
  t.dtype.code =
      uint8_t(in.flag() ? in.u8()
                        : in.pick<int64_t>({kDLInt, kDLUInt, kDLFloat, kDLBfloat, kDLFloat8_e4m3fn,
                                            kDLFloat8_e8m0fnu, kDLFloat4_e2m1fn}));
  t.dtype.bits = uint8_t(in.flag() ? in.u8() : in.pick<int64_t>({32, 16, 8, 4, 64}));
  t.dtype.lanes = uint16_t(in.flag() ? in.u16() : in.pick<int64_t>({1, 2, 4}));
  t.device.device_type =
      DLDeviceType(in.flag() ? int32_t(in.u8())
                             : int32_t(in.pick<int64_t>({kDLCPU, kDLCUDA, kDLCUDAHost, kDLROCM})));
  t.device.device_id = int32_t(in.flag() ? int32_t(in.u32()) : 0);
  alignas(64) static char buffer[256];
  t.data = in.u8() < 32 ? nullptr : buffer + in.below(64);
  t.byte_offset = in.flag() ? uint64_t(in.below(128))
                            : in.pick<uint64_t>({0, 16, uint64_t(1) << 40, UINT64_MAX});

  Tensor v;
  try {
    v = from_dlpack(t);
  } catch (const Error&) {
    return;
  }
  // The imported view carries the DLTensor's fields: data at byte_offset, shape, strides (or
  // row-major ones), the device.
  FUZZ_ASSERT(v.ndim == t.ndim);
  FUZZ_ASSERT(reinterpret_cast<uintptr_t>(v.data) ==
              (t.data ? reinterpret_cast<uintptr_t>(t.data) + t.byte_offset : 0));
  for (int d = 0; d < v.ndim; ++d) {
    FUZZ_ASSERT(v.shape[d] == t.shape[d]);
    if (t.strides) FUZZ_ASSERT(v.strides[d] == t.strides[d]);
  }
  FUZZ_ASSERT(v.is_cuda() == (t.device.device_type == kDLCUDA));
  DLTensor back{};
  to_dlpack(v, &back);
  FUZZ_ASSERT(same_view(from_dlpack(back), v));

  // What every op does with an argument next.
  (void)v.numel();
  (void)v.is_contiguous();
  (void)v.describe();
  for (int check = 0; check < 4; ++check) {
    try {
      switch (check) {
        case 0:
          check_contiguous(v, "x");
          break;
        case 1:
          check_last_dim_contiguous(v, "x");
          break;
        case 2:
          check_row_alignment(v, "x");
          break;
        default:
          check_defined(v, "x");
          break;
      }
    } catch (const Error&) {
    }
  }
}

}  // namespace
}  // namespace msa::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  msa::fuzz::Input in(data, size);
  msa::fuzz::run(in);
  return 0;
}
