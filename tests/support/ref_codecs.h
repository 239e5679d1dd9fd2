// Test-side reference decoders written from the format definitions (docs/semantics.md, Quantized
// formats), independent of src/common/codecs.h and src/cpu/access.h, so the CPU tests check those
// against a second implementation. Used by test_quant and test_block_scores.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "msa/msa.h"

namespace msa::test {

// OCP e4m3fn magnitude of a byte without its sign bit (0..0x7e; 0x7f is NaN).
inline double e4m3_magnitude(int byte) {
  const int exp = (byte >> 3) & 15, man = byte & 7;
  return exp == 0 ? man * std::ldexp(1.0, -9) : (1.0 + man / 8.0) * std::ldexp(1.0, exp - 7);
}
// e2m1 magnitude of a nibble without its sign bit (0..7).
inline double e2m1_magnitude(int code) {
  const double mag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  return mag[code & 7];
}
inline double ref_e4m3_decode(uint8_t b) {
  if ((b & 0x7f) == 0x7f) return NAN;
  return (b & 0x80 ? -1 : 1) * e4m3_magnitude(b & 0x7f);
}
inline double ref_e2m1_decode(uint8_t n) { return (n & 8 ? -1 : 1) * e2m1_magnitude(n & 7); }
inline double ref_e8m0_decode(uint8_t b) { return b == 0xff ? NAN : std::ldexp(1.0, int(b) - 127); }
inline double ref_bf16_decode(uint16_t h) {
  const int exp = (h >> 7) & 0xff, man = h & 0x7f;
  const double v = exp == 255 ? (man ? NAN : INFINITY)
                   : exp == 0 ? man * std::ldexp(1.0, -133)
                              : (1.0 + man / 128.0) * std::ldexp(1.0, exp - 127);
  return h & 0x8000 ? -v : v;
}
inline double ref_f16_decode(uint16_t h) {
  const int exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  const double v = exp == 31 ? (man ? NAN : INFINITY)
                   : exp == 0 ? man * std::ldexp(1.0, -24)
                              : (1.0 + man / 1024.0) * std::ldexp(1.0, exp - 15);
  return h & 0x8000 ? -v : v;
}

// Element (t, h, d) of a [T, H, D] QTensor (fp4x2 stored as [T, H, D/2]), dequantized exactly:
// bf16/f16 value; fp8 * f32 scale ([1], [T] or [T, H]); NVFP4 e2m1 * e4m3 scale (per 16) * global;
// MXFP4 e2m1 * e8m0 scale (per 32).
inline double ref_element(const QTensor& x, int64_t t, int64_t h, int64_t d) {
  const Tensor& v = x.values;
  const Tensor& s = x.scale;
  const int64_t row = t * v.strides[0] + h * v.strides[1];
  switch (v.dtype) {
    case DType::bf16: return ref_bf16_decode(v.ptr<uint16_t>()[row + d]);
    case DType::f16: return ref_f16_decode(v.ptr<uint16_t>()[row + d]);
    case DType::fp8_e4m3: {
      double sc = 1.0;
      if (s.defined())
        sc = s.numel() == 1 ? s.ptr<float>()[0]
             : s.ndim == 1  ? s.ptr<float>()[t]
                            : s.ptr<float>()[t * s.shape[1] + h];
      return ref_e4m3_decode(v.ptr<uint8_t>()[row + d]) * sc;
    }
    case DType::fp4x2: {
      const uint8_t byte = v.ptr<uint8_t>()[row + d / 2];
      const double e = ref_e2m1_decode(d % 2 ? uint8_t(byte >> 4) : uint8_t(byte & 15));
      const bool nv = s.dtype == DType::fp8_e4m3;
      const uint8_t sb = s.ptr<uint8_t>()[t * s.strides[0] + h * s.strides[1] + (d / (nv ? 16 : 32)) * s.strides[2]];
      return nv ? e * ref_e4m3_decode(sb) * double(x.global_scale) : e * ref_e8m0_decode(sb);
    }
    default: return NAN;
  }
}

}  // namespace msa::test
