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
