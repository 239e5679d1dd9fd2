// Scalar codecs shared by the CPU and CUDA backends (host + device): bf16, f16, FP8 e4m3 (OCP
// "fn"), e2m1 (FP4) and UE8M0. Encoders round to nearest even; e4m3/e2m1 saturate to their
// largest finite value (448 / 6), as the quantizers of the field do. NaN encodes to NaN where the
// format has one (e2m1 has none: NaN encodes to 0).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define MSA_HD __host__ __device__ __forceinline__
#else
#define MSA_HD inline
#endif

namespace msa::codec {

MSA_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

MSA_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// ---- bf16 ----
MSA_HD float bf16_to_float(uint16_t h) { return bits_float(uint32_t(h) << 16); }
MSA_HD uint16_t float_to_bf16(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);                                         // round to nearest even
  return uint16_t(u >> 16);
}

// ---- f16 (IEEE binary16) ----
MSA_HD float f16_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0) {  // zero / subnormal: man * 2^-24
    const float v = float(man) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  if (exp == 31) return bits_float(sign | 0x7f800000u | (man << 13));
  return bits_float(sign | ((exp + 112u) << 23) | (man << 13));
}
MSA_HD uint16_t float_to_f16(float f) {
  const uint32_t u = float_bits(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return uint16_t(sign | 0x7e00u);
  if (a >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (a < 0x38800000u) {                                   // below 2^-14: subnormal or zero
    const float v = bits_float(a) * 16777216.f;            // in units of 2^-24
    const float r = std::nearbyint(v);                     // default rounding mode: even
    return uint16_t(sign | uint16_t(r));
  }
  uint32_t m = a - 0x38000000u;  // rebias exponent 127 -> 15
  m += 0xfffu + ((m >> 13) & 1u);
  return uint16_t(sign | uint16_t(m >> 13));
}

// ---- FP8 e4m3 (bias 7, no inf, 0x7f/0xff NaN, max 448) ----
MSA_HD float e4m3_to_float(uint8_t x) {
  const uint32_t sign = uint32_t(x & 0x80u) << 24;
  const uint32_t exp = (x >> 3) & 0xfu, man = x & 0x7u;
  if (exp == 15 && man == 7) return bits_float(sign | 0x7fc00000u);
  if (exp == 0) {
    const float v = float(man) * 0.001953125f;  // man * 2^-9
    return sign ? -v : v;
  }
  return bits_float(sign | ((exp + 120u) << 23) | (man << 20));
}

// Rounds |x| to the grid of a small float format with `man_bits` mantissa bits, smallest normal
// exponent `emin` (subnormal step 2^(emin - man_bits)), saturating at `maxv`. Exact: every value
// involved is a float with few bits.
MSA_HD float round_small_float(float a, int man_bits, int emin, float maxv) {
  if (!(a < maxv)) return maxv;  // also catches +inf
  int e;
  (void)std::frexp(a, &e);  // a = f * 2^e, f in [0.5, 1)
  int exp = e - 1;
  if (exp < emin) exp = emin;
  const float step = std::ldexp(1.f, exp - man_bits);
  const float r = std::nearbyint(a / step) * step;
  return r > maxv ? maxv : r;
}

MSA_HD uint8_t float_to_e4m3(float f) {
  const uint32_t u = float_bits(f);
  const uint8_t sign = uint8_t((u >> 24) & 0x80u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint8_t(sign | 0x7fu);
  const float r = round_small_float(bits_float(u & 0x7fffffffu), 3, -6, 448.f);
  if (r == 0.f) return sign;
  int e;
  const float fr = std::frexp(r, &e);  // r = fr * 2^e
  int exp = e - 1 + 7;
  if (exp <= 0) return uint8_t(sign | uint8_t(r * 512.f));  // subnormal: r / 2^-9
  const uint8_t man = uint8_t((fr * 2.f - 1.f) * 8.f);
  return uint8_t(sign | (exp << 3) | man);
}

// ---- FP4 e2m1 (bias 1, values 0, 0.5, 1, 1.5, 2, 3, 4, 6; no inf/NaN) ----
MSA_HD float e2m1_to_float(uint8_t nibble) {
  constexpr float kMag[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
  const float v = kMag[nibble & 7u];
  return (nibble & 8u) ? -v : v;
}
MSA_HD uint8_t float_to_e2m1(float f) {
  const uint32_t u = float_bits(f);
  const uint8_t sign = uint8_t((u >> 28) & 0x8u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0;
  const float r = round_small_float(bits_float(u & 0x7fffffffu), 1, 0, 6.f);
  // r on the grid: index = 2r for r < 2, then 4 + (r-2) for r in {2,3}, 6 for 4, 7 for 6.
  uint8_t m;
  if (r < 2.f) m = uint8_t(r * 2.f);
  else if (r < 4.f) m = uint8_t(4.f + (r - 2.f));
  else m = r < 6.f ? 6 : 7;
  return uint8_t(sign | m);
}

// ---- UE8M0 scale: 2^(x - 127); 0xff is NaN ----
MSA_HD float e8m0_to_float(uint8_t x) {
  if (x == 0xffu) return bits_float(0x7fc00000u);
  if (x == 0) return bits_float(0x00400000u);  // 2^-127 (float subnormal)
  return bits_float(uint32_t(x) << 23);
}

// Packed fp4x2: element 2i in the low nibble, 2i+1 in the high nibble.
MSA_HD float fp4x2_get(const uint8_t* packed, int64_t i) {
  const uint8_t b = packed[i >> 1];
  return e2m1_to_float((i & 1) ? uint8_t(b >> 4) : uint8_t(b & 0xfu));
}

// ---- exact single rounding from double (shared by the CPU reference and the GPU kernels) ----

// Rounds to float with round-to-odd: a later RNE rounding to any format with at least 2 fewer
// mantissa bits than float then equals one correct rounding of x.
MSA_HD float to_float_round_odd(double x) {
  float f = float(x);
  if (double(f) == x || x != x) return f;
  uint32_t u = float_bits(f);
  if ((u & 1u) == 0) u = std::fabs(double(f)) > std::fabs(x) ? u - 1 : u + 1;  // step toward x
  return bits_float(u);
}
MSA_HD uint16_t double_to_bf16(double x) { return float_to_bf16(to_float_round_odd(x)); }
MSA_HD uint16_t double_to_f16(double x) { return float_to_f16(to_float_round_odd(x)); }
MSA_HD uint8_t double_to_e4m3(double x) { return float_to_e4m3(to_float_round_odd(x)); }
MSA_HD uint8_t double_to_e2m1(double x) { return float_to_e2m1(to_float_round_odd(x)); }

// ---- quantization scales (docs/semantics.md, Quantized formats; rules in msa/quant.h) ----

// FP8: amax / 448 rounded to f32; 1 where that is not > 0 (all-zero rows, underflow, NaN).
MSA_HD float fp8_scale_from_amax(float amax) {
  const float s = float(double(amax) / 448.0);
  return s > 0.f ? s : 1.f;
}

// NVFP4 block scale byte: amax / (6 * global) rounded to e4m3 (saturating at 448).
MSA_HD uint8_t nvfp4_scale_byte(float amax, float global) {
  return double_to_e4m3(double(amax) / (6.0 * double(global)));
}

// MXFP4 (OCP MX) scale byte: 2^(floor(log2(amax)) - 2), 2 being e2m1's largest exponent,
// clamped to e8m0's range [2^-127, 2^127]; amax 0 gives the smallest scale (codes 0);
// non-finite -> 0xff (NaN).
MSA_HD uint8_t mxfp4_scale_byte(float amax) {
  if (!(amax - amax == 0.f)) return 0xff;  // inf or NaN
  if (amax == 0.f) return 0;
  int e;
  (void)std::frexp(amax, &e);  // amax = f * 2^e, f in [0.5, 1): floor(log2(amax)) = e - 1
  int exp = e - 1 - 2;
  exp = exp < -127 ? -127 : (exp > 127 ? 127 : exp);
  return uint8_t(exp + 127);
}

// The step an FP4 decoder multiplies codes by (0 for an all-zero block: codes are then 0).
MSA_HD double fp4_step(uint8_t scale_byte, bool nvfp4, float global) {
  return nvfp4 ? double(e4m3_to_float(scale_byte)) * double(global) : double(e8m0_to_float(scale_byte));
}

}  // namespace msa::codec
