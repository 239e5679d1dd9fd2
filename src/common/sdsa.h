// The SDSA indexer's rules both backends share (docs/semantics.md, SDSA indexer), host and device:
// the rank order of scores, the sample geometry, the threshold's rank in the sample and the NVFP4
// encoding of one 16-value group.
#pragma once

#include <cstdint>

#include "common/codecs.h"

namespace msa::sdsa {

// A score's place in the selection order as an unsigned key, larger = better: -inf 0 (never
// selected), every NaN 1 (below all other values), then the IEEE order with -0 and +0 equal
// (>= 0x00800000). Two scores tie exactly when their keys are equal.
MSA_HD uint32_t rank_key(float s) {
  const uint32_t u = codec::float_bits(s);
  if (u == 0xff800000u) return 0;                  // -inf
  if ((u & 0x7fffffffu) > 0x7f800000u) return 1;   // NaN, any sign or payload
  if ((u & 0x7fffffffu) == 0) return 0x80000000u;  // -0 and +0
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// The canonical score of a rank key (its inverse on one representative of each tie class):
// 0 -> -inf, 1 -> the quiet NaN 0x7fc00000, the zero class -> +0. Backends return thresholds in
// this form so that equal ranks give equal bits.
MSA_HD float rank_value(uint32_t key) {
  if (key == 0) return codec::bits_float(0xff800000u);
  if (key == 1) return codec::bits_float(0x7fc00000u);
  return codec::bits_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

// Whether the pair (key a, position pa) ranks before (key b, position pb): the higher key, then
// the lower position.
MSA_HD bool ranks_before(uint32_t ka, int32_t pa, uint32_t kb, int32_t pb) {
  return ka != kb ? ka > kb : pa < pb;
}

// The value of an e2m1 nibble as a double, from integer operations alone (codec::e2m1_to_float
// reads a table, which a GPU thread would keep in local memory): magnitudes 0.5 (code 1) and
// 1, 1.5, 2, 3, 4, 6 (codes 2-7, exponent field 1022 + code / 2, top mantissa bit code & 1), the
// sign from bit 3 (code 8 is -0, as e2m1_to_float gives).
MSA_HD double e2m1_value(uint32_t nibble) {
  const uint32_t m = nibble & 7u;
  uint32_t hi = m < 2u ? (m != 0u ? 0x3fe00000u : 0u) : 0x3fe00000u + (m << 19);
  hi |= (nibble & 8u) << 28;
#if defined(__CUDA_ARCH__)
  return __hiloint2double(int(hi), 0);
#else
  const uint64_t u = uint64_t(hi) << 32;
  double d;
  std::memcpy(&d, &u, 8);
  return d;
#endif
}

// ---- The exact NVFP4 x NVFP4 score ----
//
// A query and a key both NVFP4: element i of group g is h(code) / 2 * scale_g * global, h an
// integer in [-12, 12] (twice the e2m1 value). The dot product is then exactly
//   S * 2^-20 * global_q * global_k,   S = sum_g I_g * E(q scale_g) * E(k scale_g),
// with I_g = sum of h(q code) * h(k code) over the group (|I_g| <= 16 * 144) and E(byte) the e4m3
// value times 2^9, an integer (|E| <= 448 * 512 < 2^18). S is an integer below 2^56 in magnitude
// for D <= 4096, so int64 holds it exactly in any summation order, and a backend may form the
// I_g any way it likes (the GPU uses dp4a). The score rounds S once to fp64, multiplies by the
// exact fp64 product of the global scales and 2^-20 (rounded once), and rounds to f32. Per
// element fp64 products of decoded values would not be exact (28 significant bits each), and cost
// the GPU three fp64 operations per element where this costs under one integer operation.

// Twice the e2m1 value of a nibble: 0, 1, 2, 3, 4, 6, 8, 12 for codes 0-7, negated by bit 3.
MSA_HD int32_t e2m1_halves(uint32_t nibble) {
  const int32_t m = int32_t(nibble & 7u);
  const int32_t mag = m < 2 ? m : (2 + (m & 1)) << ((m >> 1) - 1);
  return (nibble & 8u) ? -mag : mag;
}

// An e4m3 byte's value times 2^9, an exact integer (subnormals m * 2^-9, normals
// (8 + m) * 2^(e - 10)); `nan` is set for the NaN bytes 0x7f and 0xff.
MSA_HD int32_t e4m3_units(uint32_t byte, bool& nan) {
  const int32_t e = int32_t((byte >> 3) & 15u), m = int32_t(byte & 7u);
  const int32_t mag = e == 0 ? m : (8 | m) << (e - 1);
  nan = nan || (byte & 0x7fu) == 0x7fu;
  return (byte & 0x80u) ? -mag : mag;
}

// I_g of one group: 8 packed bytes of the query and of the key (element 2i in the low nibble).
MSA_HD int32_t nvfp4_group_dot(const uint8_t* q, const uint8_t* k) {
  int32_t sum = 0;
  for (int i = 0; i < 8; ++i) {
    sum += e2m1_halves(q[i] & 15u) * e2m1_halves(k[i] & 15u);
    sum += e2m1_halves(uint32_t(q[i]) >> 4) * e2m1_halves(uint32_t(k[i]) >> 4);
  }
  return sum;
}

// The f32 score of S (above): NaN (0x7fc00000) when a scale byte was NaN.
MSA_HD float nvfp4_score(int64_t s, bool nan, float global_q, float global_k) {
  if (nan) return codec::bits_float(0x7fc00000u);
  const double unit = double(global_q) * double(global_k) * 0x1p-20;  // exact: 48 bits, in range
#if defined(__CUDA_ARCH__)
  return __double2float_rn(__dmul_rn(__ll2double_rn(s), unit));
#else
  return float(double(s) * unit);
#endif
}

// Keys a strided sample takes from a request of `len` keys: positions offset + i * stride below
// len. 0 <= offset < stride.
MSA_HD int64_t sample_count(int64_t len, int64_t offset, int64_t stride) {
  return len <= offset ? 0 : (len - offset - 1) / stride + 1;
}

// The rank (1-based, among a row's sample scores) of its threshold: about oversample * topk keys
// rank above the sample's r-th best when every stride-th key was sampled. At least 1; the double
// is an exact integer below 2^53 for the validated ranges (topk and stride below 2^31).
inline int64_t threshold_rank(double oversample, int64_t topk, int64_t stride) {
  const double r = oversample * double(topk) / double(stride);
  const double c = double(int64_t(r));
  const int64_t up = int64_t(c < r ? c + 1 : c);
  return up < 1 ? 1 : up;
}

// NVFP4 encoding of 16 values (msa::quantize's rule): scale byte e4m3(amax / (6 * global)), codes
// e2m1(x / step) rounded once, an all-zero group (or a scale that rounds to 0) as zero codes.
// Writes 8 packed bytes (element 2i in the low nibble) and returns the scale byte.
MSA_HD uint8_t nvfp4_encode_group(const float* x, float global, uint8_t* packed) {
  float amax = 0.f;
  for (int i = 0; i < 16; ++i) {
    const float a = x[i] < 0.f ? -x[i] : x[i];
    amax = (a > amax || a != a) ? a : amax;  // NaN propagates, as msa::quantize's amax does
  }
  const uint8_t byte = codec::nvfp4_scale_byte(amax, global);
  const double step = codec::fp4_step(byte, /*nvfp4=*/true, global);
  for (int i = 0; i < 16; i += 2) {
    const uint8_t lo = step != 0.0 ? codec::double_to_e2m1(double(x[i]) / step) : 0;
    const uint8_t hi = step != 0.0 ? codec::double_to_e2m1(double(x[i + 1]) / step) : 0;
    packed[i / 2] = uint8_t(lo | (hi << 4));
  }
  return byte;
}

}  // namespace msa::sdsa
