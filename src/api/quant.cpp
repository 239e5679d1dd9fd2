// Public quantize / dequantize (include/msa/quant.h): checks every argument on the host, then
// hands CPU tensors to cpu::quantize/dequantize and CUDA tensors to the CUDA backend.
#include "msa/quant.h"

#include <cmath>

#include "api/validate.h"
#include "backend.h"

namespace msa {

const char* quant_format_name(QuantFormat f) {
  switch (f) {
    case QuantFormat::fp8_per_tensor: return "fp8_per_tensor";
    case QuantFormat::fp8_per_token: return "fp8_per_token";
    case QuantFormat::fp8_per_token_head: return "fp8_per_token_head";
    case QuantFormat::nvfp4: return "nvfp4";
    case QuantFormat::mxfp4: return "mxfp4";
  }
  return "?";
}

namespace {

// The unquantized side: [T, H, D] f32 | bf16 | f16, D contiguous; on CUDA 16-byte aligned rows
// (the kernels' vector loads; the CPU reads any row, e.g. the 8-byte FP4 rows of D = 16).
void check_plain(const Tensor& t, const char* name) {
  check_defined(t, name);
  check_dtype(t, name, {DType::f32, DType::bf16, DType::f16});
  check_ndim(t, name, 3);
  check_last_dim_contiguous(t, name);
  if (t.is_cuda()) check_row_alignment(t, name);
}

// The quantized values: fp8_e4m3 [T, H, D] or fp4x2 [T, H, D/2] on the same device as `plain`.
void check_values(const Tensor& v, const char* name, DType dtype, const Tensor& plain,
                  const char* plain_name) {
  check_defined(v, name);
  check_dtype(v, name, {dtype});
  const int64_t T = plain.shape[0], H = plain.shape[1], D = plain.shape[2];
  if (dtype == DType::fp4x2) {
    MSA_CHECK(D % 2 == 0, plain_name, ": head dim ", D, " must be even for FP4 (two per byte)");
    check_shape(v, name, {T, H, D / 2});
  } else {
    check_shape(v, name, {T, H, D});
  }
  check_last_dim_contiguous(v, name);
  if (v.is_cuda()) check_row_alignment(v, name);
  check_same_device(plain, plain_name, v, name);
}

// The scale tensor `format` implies, in the public layout (quant.h).
void check_format_scale(const QTensor& out, QuantFormat f, int64_t T, int64_t H, int64_t D) {
  const Tensor& s = out.scale;
  check_defined(s, "out.scale");
  check_same_device(out.values, "out.values", s, "out.scale");
  switch (f) {
    case QuantFormat::fp8_per_tensor:
    case QuantFormat::fp8_per_token:
    case QuantFormat::fp8_per_token_head:
      check_dtype(s, "out.scale", {DType::f32});
      if (f == QuantFormat::fp8_per_tensor) check_shape(s, "out.scale", {1});
      if (f == QuantFormat::fp8_per_token) check_shape(s, "out.scale", {T});
      if (f == QuantFormat::fp8_per_token_head) check_shape(s, "out.scale", {T, H});
      check_contiguous(s, "out.scale");
      return;
    case QuantFormat::nvfp4:
    case QuantFormat::mxfp4: {
      const bool nv = f == QuantFormat::nvfp4;
      const int64_t group = nv ? 16 : 32;
      check_dtype(s, "out.scale", {nv ? DType::fp8_e4m3 : DType::e8m0});
      check_shape(s, "out.scale", {T, H, D / group});
      check_last_dim_contiguous(s, "out.scale");
      if (nv)
        MSA_CHECK(std::isfinite(out.global_scale) && out.global_scale > 0.f,
                  "out.global_scale: must be finite and > 0 for nvfp4, got ", out.global_scale);
      return;
    }
  }
  fail("format: unknown QuantFormat ", int(f));
}

bool is_fp8(QuantFormat f) {
  return f == QuantFormat::fp8_per_tensor || f == QuantFormat::fp8_per_token ||
         f == QuantFormat::fp8_per_token_head;
}

// FP4 formats scale groups of 16 (NVFP4) or 32 (MXFP4) elements along the head dim.
void check_format_dim(QuantFormat f, int64_t D) {
  if (is_fp8(f)) return;
  const int64_t group = f == QuantFormat::nvfp4 ? 16 : 32;
  MSA_CHECK(D % group == 0, "x: head dim ", D, " must be a multiple of ", group, " for ",
            quant_format_name(f));
}

}  // namespace

void quantize(const Tensor& x, QuantFormat format, const QTensor& out, cudaStream_t stream) {
  check_plain(x, "x");
  const int64_t T = x.shape[0], H = x.shape[1], D = x.shape[2];
  check_format_dim(format, D);
  check_values(out.values, "out.values", is_fp8(format) ? DType::fp8_e4m3 : DType::fp4x2, x, "x");
  check_format_scale(out, format, T, H, D);
  if (x.is_cuda()) return cuda::quantize(x, format, out, stream);
  cpu::quantize(x, format, out);
}

void dequantize(const QTensor& x, const Tensor& out, cudaStream_t stream) {
  check_plain(out, "out");
  const int64_t T = out.shape[0], H = out.shape[1], D = out.shape[2];
  check_defined(x.values, "x.values");
  check_dtype(x.values, "x.values", {DType::fp8_e4m3, DType::fp4x2});
  check_values(x.values, "x.values", x.values.dtype, out, "out");
  api::check_qtensor_scale(x, "x", T, H, D);
  if (x.values.dtype == DType::fp4x2 && x.scale.dtype == DType::fp8_e4m3)
    MSA_CHECK(std::isfinite(x.global_scale), "x.global_scale: must be finite, got ", x.global_scale);
  if (out.is_cuda()) return cuda::dequantize(x, out, stream);
  cpu::dequantize(x, out);
}

}  // namespace msa
