// CPU quantize / dequantize (docs/semantics.md, Quantized formats; include/msa/quant.h) against
// hand-computed bytes and a brute-force reference that picks the nearest code of each format by
// search; the FP4 scale reorders against the preordered layout's definition.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include <cmath>
#include <random>

#include "common/codecs.h"
#include "support/expect_error.h"
#include "support/fp4_preorder.h"
#include "support/host_tensor.h"
#include "support/ref_codecs.h"
#include "msa/msa.h"

namespace msa::test {
namespace {

// ---- independent reference: the nearest code of a format by search (ref_codecs.h values) ----

// Nearest code to `target` among `n` magnitudes, ties to the even code, saturating; sign kept.
template <typename ValueFn>
int nearest_code(double target, int n, int sign_bit, ValueFn value) {
  const double a = std::fabs(target);
  int best = 0;
  for (int c = 1; c < n; ++c) {
    const double dc = std::fabs(value(c) - a), db = std::fabs(value(best) - a);
    if (dc < db || (dc == db && c % 2 == 0)) best = c;
  }
  return std::signbit(target) ? (best | sign_bit) : best;
}
uint8_t ref_e4m3(double t) { return uint8_t(nearest_code(t, 0x7f, 0x80, e4m3_magnitude)); }
uint8_t ref_e2m1(double t) { return uint8_t(nearest_code(t, 8, 0x8, e2m1_magnitude)); }
uint8_t nibble(const HostTensor& v, int64_t byte_offset, int64_t d) {
  const uint8_t b = v.data<uint8_t>()[byte_offset + d / 2];
  return d % 2 ? uint8_t(b >> 4) : uint8_t(b & 15);
}

// Fills x [T, H, D] (f32 | bf16 | f16) with nonzero values in +-[lo, hi); returns them as stored.
std::vector<double> fill_random(HostTensor& x, std::mt19937& rng, double lo, double hi) {
  std::uniform_real_distribution<double> mag(lo, hi);
  std::bernoulli_distribution neg(0.5);
  std::vector<double> out;
  const int64_t T = x.t.shape[0], H = x.t.shape[1], D = x.t.shape[2];
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t d = 0; d < D; ++d) {
        const float v = float(neg(rng) ? -mag(rng) : mag(rng));
        const int64_t o = x.offset({t, h, d});
        if (x.t.dtype == DType::f32) x.data<float>()[o] = v;
        if (x.t.dtype == DType::bf16) x.data<uint16_t>()[o] = codec::float_to_bf16(v);
        if (x.t.dtype == DType::f16) x.data<uint16_t>()[o] = codec::float_to_f16(v);
        out.push_back(x.t.dtype == DType::f32 ? v
                      : x.t.dtype == DType::bf16 ? ref_bf16_decode(codec::float_to_bf16(v))
                                                 : ref_f16_decode(codec::float_to_f16(v)));
      }
  return out;
}

// ---------------------------------- FP8 ----------------------------------

TEST(QuantFp8, PerTensorHandComputed) {
  // amax 896 -> scale 2; x / 2 gives the codes below (e4m3: 1.0 = 0x38, 448 = 0x7e).
  HostTensor x(DType::f32, {1, 1, 16});
  const float vals[16] = {896, 2, -4, 1, 2.125f, 2.375f, 0, -0.0f,
                          std::ldexp(1.f, -8), 3, 6, 8, 10, 12, 14, 16};
  for (int d = 0; d < 16; ++d) x.data<float>()[d] = vals[d];
  HostTensor v(DType::fp8_e4m3, {1, 1, 16}), s(DType::f32, {1});
  quantize(x.t, QuantFormat::fp8_per_tensor, QTensor(v.t, s.t));
  EXPECT_EQ(s.data<float>()[0], 2.f);
  const uint8_t* c = v.data<uint8_t>();
  EXPECT_EQ(c[0], 0x7e);  // 448
  EXPECT_EQ(c[1], 0x38);  // 1.0
  EXPECT_EQ(c[2], 0xc0);  // -2.0
  EXPECT_EQ(c[3], 0x30);  // 0.5
  EXPECT_EQ(c[4], 0x38);  // 1.0625: tie between 1.0 (even) and 1.125 -> 1.0
  EXPECT_EQ(c[5], 0x3a);  // 1.1875: tie between 1.125 and 1.25 (even) -> 1.25
  EXPECT_EQ(c[6], 0x00);
  EXPECT_EQ(c[7], 0x80);  // -0 keeps its sign
  EXPECT_EQ(c[8], 0x01);  // 2^-9: smallest subnormal
  EXPECT_EQ(c[9], 0x3c);  // 1.5: exponent 7, mantissa 4
}

TEST(QuantFp8, ZeroInputGivesScaleOne) {
  HostTensor x(DType::bf16, {2, 1, 16}), v(DType::fp8_e4m3, {2, 1, 16}), s(DType::f32, {2});
  std::memset(x.data<uint16_t>(), 0, x.bytes());
  quantize(x.t, QuantFormat::fp8_per_token, QTensor(v.t, s.t));
  EXPECT_EQ(s.data<float>()[0], 1.f);
  EXPECT_EQ(s.data<float>()[1], 1.f);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(v.data<uint8_t>()[i], 0);
}

// Each granularity on random inputs: scale = f32(amax of its group / 448), code = nearest e4m3
// to x / scale by search.
TEST(QuantFp8, EachScaleGranularityMatchesReference) {
  const int64_t T = 5, H = 3, D = 32;
  const QuantFormat fmts[3] = {QuantFormat::fp8_per_tensor, QuantFormat::fp8_per_token,
                               QuantFormat::fp8_per_token_head};
  const DType dts[3] = {DType::f32, DType::bf16, DType::f16};
  std::mt19937 rng(11);
  for (QuantFormat f : fmts)
    for (DType dt : dts) {
      SCOPED_TRACE(std::string(quant_format_name(f)) + " from " + dtype_name(dt));
      HostTensor x(dt, {T, H, D});
      const std::vector<double> xv = fill_random(x, rng, 0.01, 40.0);
      std::vector<int64_t> sshape = f == QuantFormat::fp8_per_tensor  ? std::vector<int64_t>{1}
                                    : f == QuantFormat::fp8_per_token ? std::vector<int64_t>{T}
                                                                      : std::vector<int64_t>{T, H};
      HostTensor v(DType::fp8_e4m3, {T, H, D}), s(DType::f32, sshape);
      quantize(x.t, f, QTensor(v.t, s.t));
      auto group = [&](int64_t t, int64_t h) {
        return f == QuantFormat::fp8_per_tensor ? 0 : f == QuantFormat::fp8_per_token ? t : t * H + h;
      };
      std::vector<double> amax(s.t.numel(), 0.0);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t d = 0; d < D; ++d)
            amax[group(t, h)] = std::max(amax[group(t, h)], std::fabs(xv[(t * H + h) * D + d]));
      for (size_t g = 0; g < amax.size(); ++g) EXPECT_EQ(s.data<float>()[g], float(amax[g] / 448));
      for (int64_t t = 0; t < T; ++t)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t d = 0; d < D; ++d) {
            const double sc = s.data<float>()[group(t, h)];
            ASSERT_EQ(v.data<uint8_t>()[(t * H + h) * D + d], ref_e4m3(xv[(t * H + h) * D + d] / sc))
                << "t " << t << " h " << h << " d " << d;
          }
    }
}

// Values that are exactly code * scale, with a +-448 code in every scale group, quantize back
// to the same codes and scales, and dequantize to the same values.
TEST(QuantFp8, RoundTripExactOnRepresentableValues) {
  const int64_t T = 4, H = 2, D = 16;
  std::mt19937 rng(12);
  std::uniform_int_distribution<int> code(0, 0xfd), kint(1, 1 << 16), ex(-20, 4);
  for (QuantFormat f : {QuantFormat::fp8_per_token, QuantFormat::fp8_per_token_head}) {
    const bool per_head = f == QuantFormat::fp8_per_token_head;
    HostTensor v0(DType::fp8_e4m3, {T, H, D});
    HostTensor s0(DType::f32, per_head ? std::vector<int64_t>{T, H} : std::vector<int64_t>{T});
    for (int64_t i = 0; i < s0.t.numel(); ++i)  // <= 17 significant bits: code * scale exact in f32
      s0.data<float>()[i] = std::ldexp(float(kint(rng)), ex(rng) - 16);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t d = 0; d < D; ++d) {
          int c = code(rng);
          if ((c & 0x7f) == 0x7f) c = 0x10;  // not NaN
          if (d == (t + h) % D && (per_head || h == 0)) c = (c & 0x80) | 0x7e;  // amax = 448 * scale
          v0.data<uint8_t>()[v0.offset({t, h, d})] = uint8_t(c);
        }
    HostTensor x(DType::f32, {T, H, D});
    dequantize(QTensor(v0.t, s0.t), x.t);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t d = 0; d < D; ++d) {
          const double sc = s0.data<float>()[per_head ? t * H + h : t];
          ASSERT_EQ(x.data<float>()[x.offset({t, h, d})],
                    ref_e4m3_decode(v0.data<uint8_t>()[v0.offset({t, h, d})]) * sc);
        }
    HostTensor v1(DType::fp8_e4m3, {T, H, D}), s1(DType::f32, std::vector<int64_t>(
        s0.t.shape, s0.t.shape + s0.t.ndim));
    quantize(x.t, f, QTensor(v1.t, s1.t));
    EXPECT_EQ(std::memcmp(v0.data<uint8_t>(), v1.data<uint8_t>(), v0.bytes()), 0);
    EXPECT_EQ(std::memcmp(s0.data<float>(), s1.data<float>(), s0.bytes()), 0);
  }
}

// The dequantized value is rounded once: 1.125 * s lies just above the bf16 tie 1 + 2^-8, so a
// detour through f32 (which rounds to the tie, then to even 1.0) would give the wrong answer.
TEST(QuantFp8, DequantizeRoundsOnceToBf16) {
  float s = float((1.0 + std::ldexp(1.0, -8)) * 8.0 / 9.0);
  while (1.125 * double(s) <= 1.0 + std::ldexp(1.0, -8)) s = std::nextafter(s, 2.f);
  ASSERT_EQ(float(1.125 * double(s)), 1.f + std::ldexp(1.f, -8));  // the f32 detour hits the tie
  HostTensor v(DType::fp8_e4m3, {1, 1, 16}), sc(DType::f32, {1}), out(DType::bf16, {1, 1, 16});
  std::memset(v.data<uint8_t>(), 0x39, 16);  // 1.125
  sc.data<float>()[0] = s;
  dequantize(QTensor(v.t, sc.t), out.t);
  EXPECT_EQ(out.data<uint16_t>()[0], 0x3f81);  // 1 + 2^-7
}

// ---------------------------------- FP4 ----------------------------------

TEST(QuantFp4, Nvfp4HandComputed) {
  // Block 0 has amax 12 with global 2 -> scale e4m3(12 / 12) = 1.0 (0x38); codes of x / 2.
  // Block 1 is all zero -> scale 0 and zero codes.
  HostTensor x(DType::f32, {1, 1, 32});
  std::memset(x.data<float>(), 0, x.bytes());
  const float b0[4] = {12, 6, -3, 1};
  for (int d = 0; d < 4; ++d) x.data<float>()[d] = b0[d];
  x.data<float>()[5] = 5;  // 2.5: tie between 2 (even code 4) and 3 -> 2
  HostTensor v(DType::fp4x2, {1, 1, 16}), s(DType::fp8_e4m3, {1, 1, 2});
  quantize(x.t, QuantFormat::nvfp4, QTensor(v.t, s.t, 2.f));
  EXPECT_EQ(s.data<uint8_t>()[0], 0x38);
  EXPECT_EQ(s.data<uint8_t>()[1], 0x00);
  EXPECT_EQ(v.data<uint8_t>()[0], 0x57);  // lo: 6 -> 7, hi: 3 -> 5
  EXPECT_EQ(v.data<uint8_t>()[1], 0x1b);  // lo: -1.5 -> 8|3, hi: 0.5 -> 1
  EXPECT_EQ(v.data<uint8_t>()[2], 0x40);  // lo: 0, hi: 2.5 -> 2.0 (code 4)
  for (int i = 8; i < 16; ++i) EXPECT_EQ(v.data<uint8_t>()[i], 0);
}

TEST(QuantFp4, Mxfp4HandComputed) {
  // Scale 2^(floor(log2(amax)) - 2): amax 7 -> 2^0 (byte 127), 7 saturates to 6;
  // amax 0.75 -> 2^-3 (byte 124), 0.75 / 0.125 = 6.
  HostTensor x(DType::f32, {1, 1, 64});
  std::memset(x.data<float>(), 0, x.bytes());
  x.data<float>()[0] = 7;
  x.data<float>()[1] = -1;
  x.data<float>()[32] = 0.75f;
  x.data<float>()[33] = 0.1875f;  // 1.5
  HostTensor v(DType::fp4x2, {1, 1, 32}), s(DType::e8m0, {1, 1, 2});
  quantize(x.t, QuantFormat::mxfp4, QTensor(v.t, s.t));
  EXPECT_EQ(s.data<uint8_t>()[0], 127);
  EXPECT_EQ(s.data<uint8_t>()[1], 124);
  EXPECT_EQ(v.data<uint8_t>()[0], 0xa7);   // lo 6 -> 7, hi -1 -> 8|2
  EXPECT_EQ(v.data<uint8_t>()[16], 0x37);  // lo 6 -> 7, hi 1.5 -> 3
}

// Random inputs: NVFP4 block scale = nearest e4m3 to amax / (6 g); MXFP4 scale exponent =
// floor(log2(amax)) - 2; codes = nearest e2m1 to x / step. Dequantize = code * step exactly.
TEST(QuantFp4, RandomMatchesReference) {
  const int64_t T = 3, H = 2, D = 64;
  std::mt19937 rng(13);
  for (QuantFormat f : {QuantFormat::nvfp4, QuantFormat::mxfp4})
    for (DType dt : {DType::f32, DType::bf16}) {
      SCOPED_TRACE(std::string(quant_format_name(f)) + " from " + dtype_name(dt));
      const bool nv = f == QuantFormat::nvfp4;
      const int64_t grp = nv ? 16 : 32;
      const float g = nv ? 0.37f : 1.f;
      HostTensor x(dt, {T, H, D});
      const std::vector<double> xv = fill_random(x, rng, 0.001, 30.0);
      HostTensor v(DType::fp4x2, {T, H, D / 2});
      HostTensor s(nv ? DType::fp8_e4m3 : DType::e8m0, {T, H, D / grp});
      quantize(x.t, f, QTensor(v.t, s.t, g));
      HostTensor back(DType::f32, {T, H, D});
      dequantize(QTensor(v.t, s.t, g), back.t);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t k = 0; k < D / grp; ++k) {
            double amax = 0;
            for (int64_t d = k * grp; d < (k + 1) * grp; ++d)
              amax = std::max(amax, std::fabs(xv[(t * H + h) * D + d]));
            const uint8_t sb = s.data<uint8_t>()[s.offset({t, h, k})];
            double step;
            if (nv) {
              ASSERT_EQ(sb, ref_e4m3(amax / (6.0 * g)));
              step = ref_e4m3_decode(sb) * g;
            } else {
              ASSERT_EQ(int(sb) - 127, int(std::floor(std::log2(amax))) - 2);
              step = std::ldexp(1.0, int(sb) - 127);
            }
            for (int64_t d = k * grp; d < (k + 1) * grp; ++d) {
              const uint8_t n = nibble(v, v.offset({t, h, 0}), d);
              ASSERT_EQ(n, ref_e2m1(xv[(t * H + h) * D + d] / step)) << "d " << d;
              ASSERT_EQ(back.data<float>()[back.offset({t, h, d})], float(ref_e2m1_decode(n) * step));
            }
          }
    }
}

// Codes and scales with a +-6 code in every block dequantize to values that quantize back to the
// same bytes (global 1.5 keeps code * scale * global exact in f32).
TEST(QuantFp4, RoundTripExactOnRepresentableValues) {
  const int64_t T = 3, H = 2, D = 64;
  std::mt19937 rng(14);
  std::uniform_int_distribution<int> nib(0, 15), e4(0x08, 0x70), e8(100, 150);
  for (QuantFormat f : {QuantFormat::nvfp4, QuantFormat::mxfp4}) {
    SCOPED_TRACE(quant_format_name(f));
    const bool nv = f == QuantFormat::nvfp4;
    const int64_t grp = nv ? 16 : 32;
    const float g = nv ? 1.5f : 1.f;
    HostTensor v0(DType::fp4x2, {T, H, D / 2}), s0(nv ? DType::fp8_e4m3 : DType::e8m0, {T, H, D / grp});
    for (int64_t i = 0; i < s0.t.numel(); ++i) s0.data<uint8_t>()[i] = uint8_t(nv ? e4(rng) : e8(rng));
    for (int64_t i = 0; i < v0.t.numel(); ++i) {
      uint8_t b = uint8_t(nib(rng) | (nib(rng) << 4));
      if ((2 * i) % grp == 0) b = uint8_t((b & 0xf8) | 7);  // first element of each block: +-6
      v0.data<uint8_t>()[i] = b;
    }
    HostTensor x(DType::f32, {T, H, D});
    dequantize(QTensor(v0.t, s0.t, g), x.t);
    HostTensor v1(DType::fp4x2, {T, H, D / 2}), s1(s0.t.dtype, {T, H, D / grp});
    quantize(x.t, f, QTensor(v1.t, s1.t, g));
    EXPECT_EQ(std::memcmp(v0.data<uint8_t>(), v1.data<uint8_t>(), v0.bytes()), 0);
    EXPECT_EQ(std::memcmp(s0.data<uint8_t>(), s1.data<uint8_t>(), s0.bytes()), 0);
  }
}

TEST(QuantFp4, DequantizeStridedOutputAndF16) {
  // out is a strided f16 view (rows padded); every element lands in its slot, padding untouched.
  const int64_t T = 2, H = 2, D = 32;
  HostTensor v(DType::fp4x2, {T, H, D / 2}), s(DType::e8m0, {T, H, 1});
  for (int64_t i = 0; i < v.t.numel(); ++i) v.data<uint8_t>()[i] = uint8_t(i * 37 + 11);
  for (int64_t i = 0; i < s.t.numel(); ++i) s.data<uint8_t>()[i] = uint8_t(125 + i);
  HostTensor out(DType::f16, {T, H, D}, {H * (D + 8), D + 8, 1});
  dequantize(QTensor(v.t, s.t), out.t);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t d = 0; d < D; ++d) {
        const double want = ref_e2m1_decode(nibble(v, v.offset({t, h, 0}), d)) *
                            std::ldexp(1.0, int(s.data<uint8_t>()[t * H + h]) - 127);
        EXPECT_EQ(ref_f16_decode(out.data<uint16_t>()[out.offset({t, h, d})]), want);
      }
      if (t * H + h + 1 < T * H)  // the row padding (the last row has none)
        for (int64_t d = D; d < D + 8; ++d)
          EXPECT_EQ(out.data<uint16_t>()[out.offset({t, h, 0}) + d], 0xffff);
    }
}

TEST(QuantFp4, EmptyTensorIsANoOp) {
  HostTensor x(DType::f32, {0, 2, 32}), v(DType::fp4x2, {0, 2, 16}), s(DType::e8m0, {0, 2, 1});
  EXPECT_NO_THROW(quantize(x.t, QuantFormat::mxfp4, QTensor(v.t, s.t)));
  EXPECT_NO_THROW(dequantize(QTensor(v.t, s.t), x.t));
}

// ---------------------------------- FP4 scale reorders ----------------------------------

// Each layout and scale dtype, with padding rows (T not a multiple of 128) and padding groups
// (G not a multiple of 4): the output (poisoned before) equals the definition's loop byte for
// byte, its padding bytes are exactly the zero ones, and the inverse gives back every public
// scale without writing between rows.
TEST(QuantFp4Reorder, MatchesTheDefinitionBothWays) {
  struct Case {
    KVLayout layout;
    std::vector<int64_t> shape;
  };
  const Case cases[] = {{KVLayout::flat, {1, 3, 8}},         {KVLayout::flat, {128, 2, 4}},
                        {KVLayout::flat, {300, 3, 6}},       {KVLayout::flat, {129, 1, 1}},
                        {KVLayout::paged_nhd, {3, 128, 2, 8}}, {KVLayout::paged_nhd, {2, 128, 3, 3}},
                        {KVLayout::paged_hnd, {3, 2, 128, 6}}, {KVLayout::paged_hnd, {1, 4, 128, 4}}};
  std::mt19937 rng(15);
  for (const Case& c : cases)
    for (DType dt : {DType::fp8_e4m3, DType::e8m0})
      for (bool strided : {false, true}) {
        SCOPED_TRACE(std::string(kv_layout_name(c.layout)) + " " + dtype_name(dt) + " " +
                     HostTensor(dt, c.shape).t.describe() + (strided ? " strided" : ""));
        const HostTensor pub = random_scales(dt, c.shape, strided, rng);
        HostTensor out(dt, preordered_shape(pub.t, c.layout));
        reorder_fp4_scales(pub.t, c.layout, out.t);
        const HostTensor want = preorder(pub, c.layout);
        ASSERT_EQ(out.bytes(), want.bytes());
        EXPECT_EQ(std::memcmp(out.t.data, want.t.data, out.bytes()), 0);
        const int64_t zeros = std::count(out.data<uint8_t>(), out.data<uint8_t>() + out.bytes(), 0);
        int64_t scales = 1;
        for (int64_t d : c.shape) scales *= d;
        EXPECT_EQ(zeros, out.t.numel() - scales);  // every byte but the scales is padding

        HostTensor back(dt, c.shape, std::vector<int64_t>(pub.t.strides, pub.t.strides + pub.t.ndim));
        reorder_fp4_scales_to_public(out.t, c.layout, back.t);
        for (size_t i = 0; i < pub.bytes(); ++i) {
          const bool scale = strided ? (i % pub.t.strides[pub.t.ndim - 2]) < size_t(c.shape.back()) : true;
          ASSERT_EQ(back.data<uint8_t>()[i], scale ? pub.data<uint8_t>()[i] : 0xff) << "byte " << i;
        }
      }
}

TEST(QuantFp4Reorder, EmptyIsANoOp) {
  HostTensor pub(DType::e8m0, {0, 2, 4}), out(DType::e8m0, {2, 0, 1, 32, 4, 4});
  EXPECT_NO_THROW(reorder_fp4_scales(pub.t, KVLayout::flat, out.t));
  EXPECT_NO_THROW(reorder_fp4_scales_to_public(out.t, KVLayout::flat, pub.t));
  HostTensor pool(DType::e8m0, {0, 128, 2, 4}), pool_out(DType::e8m0, {0, 1, 1, 32, 4, 4});
  EXPECT_NO_THROW(reorder_fp4_scales(pool.t, KVLayout::paged_nhd, pool_out.t));
}

TEST(QuantFp4ReorderErrors, MessagesNameArgumentAndRule) {
  HostTensor pub(DType::fp8_e4m3, {300, 3, 6}), out(DType::fp8_e4m3, {3, 3, 2, 32, 4, 4});
  ASSERT_NO_THROW(reorder_fp4_scales(pub.t, KVLayout::flat, out.t));
  HostTensor f32(DType::f32, {300, 3, 6});
  expect_error([&] { reorder_fp4_scales(f32.t, KVLayout::flat, out.t); },
               "scale: dtype must be fp8_e4m3 or e8m0, got f32");
  expect_error([&] { reorder_fp4_scales(pub.t, KVLayout(7), out.t); },
               "layout: must be flat, paged_nhd or paged_hnd, got 7");
  expect_error([&] { reorder_fp4_scales(pub.t, KVLayout::paged_nhd, out.t); },
               "scale: public FP4 scales of layout paged_nhd must be [num_pages, 128, Hkv, G], got "
               "fp8_e4m3[300, 3, 6]");
  HostTensor pool(DType::fp8_e4m3, {3, 128, 2, 8}), pool_out(DType::fp8_e4m3, {6, 1, 2, 32, 4, 4});
  ASSERT_NO_THROW(reorder_fp4_scales(pool.t, KVLayout::paged_nhd, pool_out.t));
  expect_error([&] { reorder_fp4_scales(pool.t, KVLayout::flat, pool_out.t); },
               "scale: public FP4 scales of layout flat must be [T, H, G], got fp8_e4m3[3, 128, 2, 8]");
  expect_error([&] { reorder_fp4_scales(pool.t, KVLayout::paged_hnd, pool_out.t); },
               "scale: the preordered layout of a page pool needs page_size 128 (each page is one "
               "128-row tile), got page_size 2");
  HostTensor pool64(DType::fp8_e4m3, {3, 64, 2, 8});
  expect_error([&] { reorder_fp4_scales(pool64.t, KVLayout::paged_nhd, pool_out.t); },
               "got page_size 64");
  HostTensor e8m0_out(DType::e8m0, {3, 3, 2, 32, 4, 4});
  expect_error([&] { reorder_fp4_scales(pub.t, KVLayout::flat, e8m0_out.t); },
               "out: dtype must be fp8_e4m3, got e8m0");
  HostTensor short_out(DType::fp8_e4m3, {3, 2, 2, 32, 4, 4});
  expect_error([&] { reorder_fp4_scales(pub.t, KVLayout::flat, short_out.t); },
               "out: preordered FP4 scales must be [3, 3, 2, 32, 4, 4] ([H, ceil(T / 128), "
               "ceil(G / 4), 32, 4, 4]), got fp8_e4m3[3, 2, 2, 32, 4, 4]");
  expect_error([&] { reorder_fp4_scales(pool.t, KVLayout::paged_nhd, out.t); },
               "out: preordered FP4 scales must be [6, 1, 2, 32, 4, 4] ([num_pages * Hkv, 1, "
               "ceil(G / 4), 32, 4, 4])");
  HostTensor strided_out(DType::fp8_e4m3, {3, 3, 2, 32, 4, 4}, {3 * 2 * 1024, 2 * 1024, 1024, 32, 8, 2});
  expect_error([&] { reorder_fp4_scales(pub.t, KVLayout::flat, strided_out.t); }, "out: must be contiguous");
  expect_error([&] { reorder_fp4_scales(pub.t, KVLayout::flat, Tensor()); }, "out: required tensor is missing");
  HostTensor cols(DType::fp8_e4m3, {300, 3, 6}, {3 * 12, 12, 2});
  expect_error([&] { reorder_fp4_scales(cols.t, KVLayout::flat, out.t); },
               "scale: last dim must be contiguous (stride 1), got stride 2");
  // The inverse: the preordered side is `scale`, the public one `out`.
  expect_error([&] { reorder_fp4_scales_to_public(short_out.t, KVLayout::flat, pub.t); },
               "scale: preordered FP4 scales must be [3, 3, 2, 32, 4, 4]");
  expect_error([&] { reorder_fp4_scales_to_public(out.t, KVLayout::flat, pool.t); },
               "out: public FP4 scales of layout flat must be [T, H, G]");
  expect_error([&] { reorder_fp4_scales_to_public(e8m0_out.t, KVLayout::flat, pub.t); },
               "scale: dtype must be fp8_e4m3, got e8m0");
  // Ops other than the indexer read the public layout only.
  HostTensor values(DType::fp4x2, {300, 3, 48}), plain(DType::f32, {300, 3, 96});
  expect_error([&] { dequantize(QTensor(values.t, out.t), plain.t); },
               "x.scale: the preordered (6-D) FP4 scale layout is read by the indexer only "
               "(block_scores, block_topk); this op takes the public layout [T, H, D / group]");
}

// ---------------------------------- argument errors ----------------------------------

TEST(QuantErrors, MessagesNameArgumentAndRule) {
  HostTensor x(DType::f32, {2, 2, 32});
  HostTensor v8(DType::fp8_e4m3, {2, 2, 32}), s_tok(DType::f32, {2}), s_th(DType::f32, {2, 2});
  HostTensor v_bf(DType::bf16, {2, 2, 32});
  expect_error([&] { quantize(x.t, QuantFormat::fp8_per_token, QTensor(v_bf.t, s_tok.t)); },
               "out.values: dtype must be fp8_e4m3, got bf16");
  expect_error([&] { quantize(x.t, QuantFormat::fp8_per_token_head, QTensor(v8.t, s_tok.t)); },
               "out.scale: shape must be [2, 2]");
  HostTensor v_short(DType::fp8_e4m3, {2, 2, 16});
  expect_error([&] { quantize(x.t, QuantFormat::fp8_per_tensor, QTensor(v_short.t, s_tok.t)); },
               "out.values: shape must be [2, 2, 32]");
  HostTensor xi(DType::i32, {2, 2, 32});
  expect_error([&] { quantize(xi.t, QuantFormat::fp8_per_token, QTensor(v8.t, s_tok.t)); },
               "x: dtype must be f32, bf16 or f16, got i32");

  // Rows of any stride on the CPU (16-byte rows are a CUDA rule): 148-byte rows quantize as the
  // same values in contiguous rows do.
  HostTensor x_pad(DType::f32, {2, 2, 32}, {2 * 37, 37, 1}), x_dense(DType::f32, {2, 2, 32});
  for (int64_t i = 0; i < 2 * 2 * 32; ++i) {
    const float val = float(i % 7) - 3.f;
    x_dense.data<float>()[i] = val;
    x_pad.data<float>()[(i / 64) * 74 + ((i / 32) % 2) * 37 + i % 32] = val;
  }
  HostTensor v_pad(DType::fp8_e4m3, {2, 2, 32}), s_pad(DType::f32, {2}), v_dense(DType::fp8_e4m3, {2, 2, 32}),
      s_dense(DType::f32, {2});
  quantize(x_pad.t, QuantFormat::fp8_per_token, QTensor(v_pad.t, s_pad.t));
  quantize(x_dense.t, QuantFormat::fp8_per_token, QTensor(v_dense.t, s_dense.t));
  EXPECT_EQ(std::memcmp(v_pad.t.data, v_dense.t.data, v_pad.bytes()), 0);
  EXPECT_EQ(std::memcmp(s_pad.t.data, s_dense.t.data, s_pad.bytes()), 0);

  HostTensor x24(DType::f32, {2, 2, 24}), v24(DType::fp4x2, {2, 2, 12}), s24(DType::fp8_e4m3, {2, 2, 1});
  expect_error([&] { quantize(x24.t, QuantFormat::nvfp4, QTensor(v24.t, s24.t)); },
               "x: head dim 24 must be a multiple of 16 for nvfp4");

  HostTensor v4(DType::fp4x2, {2, 2, 16}), s_nv(DType::fp8_e4m3, {2, 2, 2}), s_mx(DType::e8m0, {2, 2, 1});
  expect_error([&] { quantize(x.t, QuantFormat::nvfp4, QTensor(v4.t, s_nv.t, 0.f)); },
               "out.global_scale: must be finite and > 0");
  expect_error([&] { quantize(x.t, QuantFormat::mxfp4, QTensor(v4.t, s_nv.t)); },
               "out.scale: dtype must be e8m0, got fp8_e4m3");
  expect_error([&] { dequantize(QTensor(v4.t, s_mx.t), v_short.t); },
               "out: dtype must be f32, bf16 or f16");
  HostTensor out_wrong(DType::f32, {2, 3, 32});
  expect_error([&] { dequantize(QTensor(v4.t, s_mx.t), out_wrong.t); },
               "x.values: shape must be [2, 3, 16]");
  expect_error([&] { dequantize(QTensor(v8.t, s_th.t), x24.t); }, "x.values: shape must be [2, 2, 24]");
}

}  // namespace
}  // namespace msa::test
