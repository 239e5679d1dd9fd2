// CPU reference quantizers (docs/semantics.md, Quantized formats): the exact rounding rules every
// backend's quantize / dequantize reproduces, and the FP4 scale reorders. Called by msa::quantize,
// msa::dequantize and msa::reorder_fp4_scales(_to_public) (src/api/quant.cpp) after validation.
// Every quotient is formed exactly (in double) and rounded once to the target grid.
#include <cmath>
#include <cstring>
#include <vector>

#include "common/fp4_scale_layout.h"
#include "cpu/access.h"

namespace msa::cpu {
namespace {

int64_t offset3(const Tensor& t, int64_t a, int64_t b, int64_t c) {
  return a * t.strides[0] + b * t.strides[1] + c * t.strides[2];
}

// max |x[t, h, d]| over d in [d0, d1). NaN propagates, so a NaN block gets a NaN scale.
float amax_range(const Tensor& x, int64_t t, int64_t h, int64_t d0, int64_t d1) {
  float m = 0.f;
  for (int64_t d = d0; d < d1; ++d) {
    const float a = std::fabs(float(load_value(x, offset3(x, t, h, d))));
    m = (a > m || std::isnan(a)) ? a : m;
  }
  return m;
}

// ---- FP8: scale = amax / 448 rounded to f32 (1 where that is not > 0); code = e4m3(x / s) ----
void quantize_fp8(const Tensor& x, QuantFormat f, const QTensor& out) {
  const int64_t T = x.shape[0], H = x.shape[1], D = x.shape[2];
  float* scale = out.scale.ptr<float>();
  // No element: every amax is 0 (an empty view's other sizes may be any; T * H may overflow).
  if (x.numel() == 0) {
    for (int64_t i = 0; i < out.scale.numel(); ++i) scale[i] = codec::fp8_scale_from_amax(0.f);
    return;
  }
  std::vector<float> row_amax(T * H);
#pragma omp parallel for collapse(2)
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) row_amax[t * H + h] = amax_range(x, t, h, 0, D);

  // One scale per tensor, per token or per (token, head); the scale tensor is contiguous.
  auto scale_index = [&](int64_t t, int64_t h) -> int64_t {
    if (f == QuantFormat::fp8_per_tensor) return 0;
    return f == QuantFormat::fp8_per_token ? t : t * H + h;
  };
  std::vector<float> amax(out.scale.numel(), 0.f);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      float& m = amax[scale_index(t, h)];
      const float a = row_amax[t * H + h];
      m = (a > m || std::isnan(a)) ? a : m;
    }
  for (size_t i = 0; i < amax.size(); ++i) {
    scale[i] = codec::fp8_scale_from_amax(amax[i]);
  }

  uint8_t* codes = out.values.ptr<uint8_t>();
#pragma omp parallel for collapse(2)
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      const double s = scale[scale_index(t, h)];
      for (int64_t d = 0; d < D; ++d)
        codes[offset3(out.values, t, h, d)] = codec::double_to_e4m3(load_value(x, offset3(x, t, h, d)) / s);
    }
}

// ---- FP4 (NVFP4 / MXFP4): one scale byte per group of elements along D ----

void quantize_fp4(const Tensor& x, QuantFormat f, const QTensor& out) {
  const int64_t T = x.shape[0], H = x.shape[1], D = x.shape[2];
  const bool nv = f == QuantFormat::nvfp4;
  const int64_t group = nv ? 16 : 32;
  const Tensor& sc = out.scale;
  const Tensor& v = out.values;
#pragma omp parallel for collapse(2)
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t g = 0; g < D / group; ++g) {
        const float amax = amax_range(x, t, h, g * group, (g + 1) * group);
        const uint8_t byte = nv ? codec::nvfp4_scale_byte(amax, out.global_scale) : codec::mxfp4_scale_byte(amax);
        sc.ptr<uint8_t>()[offset3(sc, t, h, g)] = byte;
        // The step the decoder multiplies by; a zero step (all-zero block, or a scale that
        // rounded to 0) encodes the block as zeros instead of dividing by 0.
        const double step = codec::fp4_step(byte, nv, out.global_scale);
        for (int64_t d = g * group; d < (g + 1) * group; d += 2) {
          const double a = load_value(x, offset3(x, t, h, d));
          const double b = load_value(x, offset3(x, t, h, d + 1));
          const uint8_t lo = step != 0.0 ? codec::double_to_e2m1(a / step) : 0;
          const uint8_t hi = step != 0.0 ? codec::double_to_e2m1(b / step) : 0;
          v.ptr<uint8_t>()[offset3(v, t, h, d / 2)] = uint8_t(lo | (hi << 4));
        }
      }
}

}  // namespace

void quantize(const Tensor& x, QuantFormat f, const QTensor& out) {
  if (f == QuantFormat::nvfp4 || f == QuantFormat::mxfp4) {
    // Without elements there is no value and no scale group to write.
    if (x.numel() > 0) quantize_fp4(x, f, out);
  } else {
    quantize_fp8(x, f, out);
  }
}

void dequantize(const QTensor& x, const Tensor& out) {
  const int64_t T = out.shape[0], H = out.shape[1], D = out.shape[2];
  if (out.numel() == 0) return;  // an empty view's other sizes may be any: T * H overflows
  const RowDecoder dec(x, D);
  const Tensor& v = x.values;
#pragma omp parallel
  {
    std::vector<double> row(D);
#pragma omp for collapse(2)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h) {
        dec.decode(t * v.strides[0] + h * v.strides[1], t, h, row.data());
        for (int64_t d = 0; d < D; ++d) store_value(out, offset3(out, t, h, d), row[d]);
      }
  }
}

void reorder_fp4_scales(const Tensor& pub, const Tensor& pre, KVLayout layout, bool to_public) {
  const fp4_layout::PublicScales p = fp4_layout::public_scales(pub, layout);
  const int64_t rest_m = p.rest_m(), rest_g = p.rest_g();
  uint8_t* pb = pub.ptr<uint8_t>();
  uint8_t* qb = pre.ptr<uint8_t>();
  // Padding rows and groups of a preordered tensor are zero bytes; the loop below writes the rest.
  if (!to_public && pre.numel() > 0) std::memset(qb, 0, size_t(pre.numel()));
#pragma omp parallel for collapse(2)
  for (int64_t l = 0; l < p.matrices; ++l)
    for (int64_t m = 0; m < p.rows; ++m) {
      const int64_t row = fp4_layout::row_offset(l, m, rest_m, rest_g);
      for (int64_t g = 0; g < p.groups; ++g) {
        uint8_t& a = pb[p.offset(l, m, g)];
        uint8_t& b = qb[row + fp4_layout::group_offset(g)];
        if (to_public) a = b;
        else b = a;
      }
    }
}

}  // namespace msa::cpu
