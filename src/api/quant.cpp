// Public quantize / dequantize and the FP4 scale reorders (include/msa/quant.h): checks every
// argument on the host, then hands CPU tensors to the CPU backend and CUDA tensors to the CUDA one.
#include "msa/quant.h"

#include <cmath>

#include "api/validate.h"
#include "backend.h"
#include "common/fp4_scale_layout.h"

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

// The two sides of an FP4 scale reorder: `pub` in the public layout of `layout` (fp8_e4m3 or
// e8m0; [T, H, G] for flat, a pool of 128-slot pages otherwise; last dim contiguous) and `pre`
// of the same dtype and device in the preordered shape that follows from it.
void check_reorder(const Tensor& pub, const char* pub_name, const Tensor& pre, const char* pre_name,
                   KVLayout layout) {
  MSA_CHECK(layout == KVLayout::flat || layout == KVLayout::paged_nhd ||
                layout == KVLayout::paged_hnd,
            "layout: must be flat, paged_nhd or paged_hnd, got ", int(layout));
  check_defined(pub, pub_name);
  check_dtype(pub, pub_name, {DType::fp8_e4m3, DType::e8m0});
  const bool flat = layout == KVLayout::flat;
  MSA_CHECK(pub.ndim == (flat ? 3 : 4), pub_name, ": public FP4 scales of layout ",
            kv_layout_name(layout), " must be ",
            flat ? "[T, H, G]" : layout == KVLayout::paged_nhd ? "[num_pages, 128, Hkv, G]"
                                                               : "[num_pages, Hkv, 128, G]",
            ", got ", pub.describe());
  check_last_dim_contiguous(pub, pub_name);
  if (!flat) {
    const bool nhd = layout == KVLayout::paged_nhd;
    MSA_CHECK(pub.shape[nhd ? 1 : 2] == fp4_layout::kTileRows, pub_name, ": the preordered "
              "layout of a page pool needs page_size 128 (each page is one 128-row tile), got "
              "page_size ", pub.shape[nhd ? 1 : 2], " in ", pub.describe());
    int64_t matrices = 0;
    MSA_CHECK(!__builtin_mul_overflow(pub.shape[0], pub.shape[nhd ? 2 : 1], &matrices), pub_name,
              ": num_pages * Hkv overflows int64, got ", pub.describe());
  }
  const fp4_layout::PublicScales p = fp4_layout::public_scales(pub, layout);
  check_defined(pre, pre_name);
  check_dtype(pre, pre_name, {pub.dtype});
  check_same_device(pub, pub_name, pre, pre_name);
  api::check_preordered_fp4_scale(pre, pre_name, p.matrices, p.rest_m(), p.rest_g(),
                                  flat ? "[H, ceil(T / 128), ceil(G / 4), 32, 4, 4]"
                                       : "[num_pages * Hkv, 1, ceil(G / 4), 32, 4, 4]");
}

// Both reorders on validated arguments, by the device of the two sides (checked equal).
void run_reorder(const Tensor& pub, const Tensor& pre, KVLayout layout, bool to_public,
                 cudaStream_t stream) {
  if (pre.is_cuda()) return cuda::reorder_fp4_scales(pub, pre, layout, to_public, stream);
  cpu::reorder_fp4_scales(pub, pre, layout, to_public);
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

void reorder_fp4_scales(const Tensor& scale, KVLayout layout, const Tensor& out,
                        cudaStream_t stream) {
  check_reorder(scale, "scale", out, "out", layout);
  run_reorder(scale, out, layout, /*to_public=*/false, stream);
}

void reorder_fp4_scales_to_public(const Tensor& scale, KVLayout layout, const Tensor& out,
                                  cudaStream_t stream) {
  check_reorder(out, "out", scale, "scale", layout);
  run_reorder(out, scale, layout, /*to_public=*/true, stream);
}

}  // namespace msa
