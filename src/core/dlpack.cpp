// DLPack <-> msa::Tensor. Only the dtypes msa computes with are accepted; anything else is an
// msa::Error naming the DLPack code, bits and lanes.
#include "msa/dlpack.h"

namespace msa {

static DType dtype_from_dl(DLDataType t) {
  if (t.lanes == 1) {
    if (t.code == kDLFloat && t.bits == 32) return DType::f32;
    if (t.code == kDLFloat && t.bits == 16) return DType::f16;
    if (t.code == kDLBfloat && t.bits == 16) return DType::bf16;
    if (t.code == kDLFloat8_e4m3fn && t.bits == 8) return DType::fp8_e4m3;
    if (t.code == kDLFloat8_e8m0fnu && t.bits == 8) return DType::e8m0;
    if (t.code == kDLUInt && t.bits == 8) return DType::u8;
    if (t.code == kDLInt && t.bits == 32) return DType::i32;
    if (t.code == kDLBool && t.bits == 8) return DType::boolean;
  }
  if (t.code == kDLFloat4_e2m1fn && t.bits == 4 && t.lanes == 2) return DType::fp4x2;
  fail("from_dlpack: unsupported DLPack dtype (code ", int(t.code), ", bits ", int(t.bits),
       ", lanes ", int(t.lanes), "); msa takes f32, f16, bf16, float8_e4m3fn, float8_e8m0fnu, "
       "float4_e2m1fn x2, uint8, int32, bool");
}

static DLDataType dtype_to_dl(DType t) {
  switch (t) {
    case DType::f32: return {kDLFloat, 32, 1};
    case DType::f16: return {kDLFloat, 16, 1};
    case DType::bf16: return {kDLBfloat, 16, 1};
    case DType::fp8_e4m3: return {kDLFloat8_e4m3fn, 8, 1};
    case DType::fp4x2: return {kDLFloat4_e2m1fn, 4, 2};
    case DType::e8m0: return {kDLFloat8_e8m0fnu, 8, 1};
    case DType::u8: return {kDLUInt, 8, 1};
    case DType::i32: return {kDLInt, 32, 1};
    case DType::boolean: return {kDLBool, 8, 1};
  }
  fail("to_dlpack: unknown dtype");
}

Tensor from_dlpack(const DLTensor& t) {
  MSA_CHECK(t.ndim >= 0 && t.ndim <= Tensor::kMaxDims, "from_dlpack: ndim must be in [0, ",
            Tensor::kMaxDims, "], got ", t.ndim);
  Device dev;
  if (t.device.device_type == kDLCPU || t.device.device_type == kDLCUDAHost) {
    dev = {DeviceType::cpu, 0};
  } else if (t.device.device_type == kDLCUDA) {
    dev = {DeviceType::cuda, t.device.device_id};
  } else {
    fail("from_dlpack: unsupported device type ", int(t.device.device_type),
         "; msa takes CPU and CUDA tensors");
  }
  const std::vector<int64_t> shape(t.shape, t.shape + t.ndim);
  // data + byte_offset is the first element; an offset past the end of the address space is a
  // producer's error, refused before the pointer is formed (forming it would be undefined).
  uintptr_t first = 0;
  if (t.data)
    MSA_CHECK(!__builtin_add_overflow(reinterpret_cast<uintptr_t>(t.data), t.byte_offset, &first),
              "from_dlpack: byte_offset ", t.byte_offset, " overflows the data pointer");
  void* data = reinterpret_cast<void*>(first);
  // The view's constructor checks the shape (every size >= 0, at most 2^63 - 1 elements) and,
  // without producer strides, computes the row-major ones.
  if (!t.strides) return Tensor(data, dtype_from_dl(t.dtype), shape, dev);
  return Tensor(data, dtype_from_dl(t.dtype), shape,
                std::vector<int64_t>(t.strides, t.strides + t.ndim), dev);
}

void to_dlpack(const Tensor& t, DLTensor* out) {
  MSA_CHECK(out != nullptr, "to_dlpack: out must not be null");
  out->data = t.data;
  out->device = {t.device.type == DeviceType::cuda ? kDLCUDA : kDLCPU, t.device.index};
  out->ndim = t.ndim;
  out->dtype = dtype_to_dl(t.dtype);
  out->shape = const_cast<int64_t*>(t.shape);
  out->strides = const_cast<int64_t*>(t.strides);
  out->byte_offset = 0;
}

}  // namespace msa
