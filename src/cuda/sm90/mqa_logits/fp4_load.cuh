// MXFP4 inputs of the paged MQA logits (seed 001's fp4_paged_mqa_logits): the producer warpgroup
// turns packed e2m1 values with UE8M0 scales per 32 into the e4m3 tiles the FP8 consumers read.
// Hopper has no FP4 MMA, and e2m1 x 2^d is exact in e4m3 for d in [-8, 6]: each key (and each
// query row) is written as e2m1 x 2^(e_g - max_g e_g + 6) per group g, its largest group at the
// top of e4m3's range, and the power of two 2^(max_g e_g - 133) it leaves out becomes the key's
// scale (applied after the ReLU, where FP8 applies its per-token scale) or joins the query row's
// head weight. Exact unless a token's group exponents span more than 14 binades (the smallest
// groups then round in e4m3; they weigh below 2^-14 of its largest). A NaN scale (0xff) makes its
// group NaN, as the reference's values are.
#pragma once

#include <cstdint>

#include "cuda/device/sm90.cuh"

namespace msa::cuda::mqa_logits_sm90 {

// e2m1 code n (bit 3 the sign) as a float: 0, 0.5, 1, 1.5, 2, 3, 4, 6.
__device__ __forceinline__ float e2m1_value(uint32_t n) {
  const uint32_t m = n & 7u;
  const uint32_t mag = m >= 2 ? ((126u + (m >> 1)) << 23) | ((m & 1u) << 22) : (m ? 0x3f000000u : 0u);
  return __uint_as_float(mag | ((n & 8u) << 28));
}

// 2^d as a float for d <= 6; 0 below 2^-126 (such a group is below e4m3's range anyway).
__device__ __forceinline__ float pow2_or_zero(int d) {
  return d >= -126 ? __uint_as_float(uint32_t(d + 127) << 23) : 0.f;
}

// Two floats as e4m3 bytes (lo in the low byte), rounded to nearest, saturating, NaN kept.
__device__ __forceinline__ uint32_t e4m3x2(float lo, float hi) {
  uint16_t r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
}

// The largest of a token's four UE8M0 scale bytes (one word).
__device__ __forceinline__ int max_exponent(uint32_t sf) {
  return max(max(int(sf & 0xffu), int((sf >> 8) & 0xffu)),
             max(int((sf >> 16) & 0xffu), int(sf >> 24)));
}

// The token's left-out factor 2^(max_e - 133) (max_e - 127 - 6).
__device__ __forceinline__ float token_factor(int max_e) { return ldexpf(1.f, max_e - 133); }

// Eight e2m1 values (one word, value i in nibble i) times 2^d for d in [-5, 6] as eight e4m3
// bytes (lo: values 0-3), exactly: a magnitude m's e4m3 byte is T[m] + 8 d (T: 0.5 -> 0x30 up to
// 6 -> 0x4c, 0 -> 0), picked by byte permutes from the table with d added to its nonzero bytes,
// the sign a second permute of 0x80 bytes. The masks are taken once per word and each half's
// selector is a shift of them; with the tables by one multiply-add each, a 32-value group takes
// 48 SASS instructions (60 with a sign branch for the tables and masks per half).
__device__ __forceinline__ void e2m1x8_scaled(uint32_t x, int d, uint32_t& lo, uint32_t& hi) {
  // 8 d in every nonzero byte, two's complement: the bytes of T are >= 0x30 > 40 and
  // 0x4c + 48 < 0x80, so no byte borrows from or carries into its neighbour.
  const uint32_t t0 = uint32_t(d) * 0x08080800u + 0x3c383000u;
  const uint32_t t1 = uint32_t(d) * 0x08080808u + 0x4c484440u;
  const uint32_t m = x & 0x77777777u;         // magnitudes: permute selectors, sign bits clear
  const uint32_t s = (x >> 1) & 0x44444444u;  // signs as selector 4 (0x80) or 0 (0)
  lo = sm90::prmt(t0, t1, m) | sm90::prmt(0u, 0x80808080u, s);
  hi = sm90::prmt(t0, t1, m >> 16) | sm90::prmt(0u, 0x80808080u, s >> 16);
}

// One 128-value token: 64 packed bytes (four 16-byte words) and its scale word -> 128 e4m3 bytes
// written as the 128-byte-swizzled row `row` of the tile at `tile` (chunk c at c ^ (row % 8)).
// Groups within 11 binades of the token's largest take the permute path (e2m1x8_scaled), others
// round through f32 (cvt), NaN scales give NaN bytes. A row whose four groups all permute (the
// usual case) runs as one straight block, so that the groups' chains interleave (a branch per
// group kept them one after another); any other row goes group by group. With the 48-instruction
// groups this took MQAL-PAGED-B64-fp4 from 180.4-180.9 to 139.9-140.5 us on an H100 (alternated,
// medians of 20; test_logits_gpu's MXFP4 cases bit-exact against the CPU). The float path for
// every group measured 514 us at MQAL-PAGED-B64-fp4 (the FP8 case 212 us).
__device__ __forceinline__ void store_fp4_row(uint8_t* tile, int row, const uint4 (&v)[4],
                                              uint32_t sf, int max_e) {
  uint8_t* dst = tile + row * 128;
  const auto exponent = [&](int g) { return int((sf >> (8 * g)) & 0xffu); };
  const auto permutes = [&](int e) { return e != 0xff && e - max_e + 6 >= -5; };
  // Group g (32 values, 16 bytes) -> its two 16-byte e4m3 chunks; permute or through f32.
  const auto convert = [&](int g, uint4 vg, bool permute) {
    const int e = exponent(g), d = e - max_e + 6;
    const uint32_t w[4] = {vg.x, vg.y, vg.z, vg.w};
    uint32_t o[8];
    if (permute) {
#pragma unroll
      for (int i = 0; i < 4; ++i) e2m1x8_scaled(w[i], d, o[2 * i], o[2 * i + 1]);
    } else {
      const float f = e == 0xff ? __uint_as_float(0x7fc00000u) : pow2_or_zero(d);
#pragma unroll
      for (int i = 0; i < 4; ++i) {  // 8 values of word i -> two output words
        const uint32_t x = w[i];
        const uint32_t b0 = e4m3x2(e2m1_value(x) * f, e2m1_value(x >> 4) * f);
        const uint32_t b1 = e4m3x2(e2m1_value(x >> 8) * f, e2m1_value(x >> 12) * f);
        const uint32_t b2 = e4m3x2(e2m1_value(x >> 16) * f, e2m1_value(x >> 20) * f);
        const uint32_t b3 = e4m3x2(e2m1_value(x >> 24) * f, e2m1_value(x >> 28) * f);
        o[2 * i] = b0 | (b1 << 16);
        o[2 * i + 1] = b2 | (b3 << 16);
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int c = 2 * g + h;
      *reinterpret_cast<uint4*>(dst + ((c ^ (row & 7)) << 4)) =
          make_uint4(o[4 * h], o[4 * h + 1], o[4 * h + 2], o[4 * h + 3]);
    }
  };
  // & rather than &&: one branch on the four tests, not four
  if (permutes(exponent(0)) & permutes(exponent(1)) & permutes(exponent(2)) &
      permutes(exponent(3))) {
#pragma unroll
    for (int g = 0; g < 4; ++g) convert(g, v[g], true);
    return;
  }
#pragma unroll 1
  for (int g = 0; g < 4; ++g) {  // v[g] by selects: an indexed v goes to local memory
    const uint4 vg = g == 0 ? v[0] : g == 1 ? v[1] : g == 2 ? v[2] : v[3];
    convert(g, vg, permutes(exponent(g)));
  }
}

// The raw slot's chunk of a thread's 16-byte chunk g: rows are 64 bytes apart, so 8 threads'
// loads of chunk g would share two 16-byte bank groups; xor-ing g with bits 1-2 of the thread
// index spreads them over all eight.
__device__ __forceinline__ int raw_chunk(int g, int tid) { return g ^ ((tid >> 1) & 3); }

__device__ __forceinline__ void zero_row(uint8_t* tile, int row) {
#pragma unroll
  for (int c = 0; c < 8; ++c)
    *reinterpret_cast<uint4*>(tile + row * 128 + c * 16) = make_uint4(0u, 0u, 0u, 0u);
}

}  // namespace msa::cuda::mqa_logits_sm90
