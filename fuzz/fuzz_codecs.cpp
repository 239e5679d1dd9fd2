// Fuzz target over the scalar codecs (src/common/codecs.h) and the CPU quantize / dequantize.
// Codecs: every non-NaN code decodes and encodes back to itself, and every float or double
// encodes to the nearest code (ties to the even code, e4m3 and e2m1 saturating, bf16 and f16
// overflowing to inf), checked exactly against the midpoints between neighbouring codes.
// quantize / dequantize: tensors built from codes and scales that the format represents exactly
// (one element of each scale group at the largest code, so the scale rule finds the same scale)
// come back bit for bit, and any finite input quantizes to non-NaN FP8 codes.
#include <cmath>
#include <cstdio>

#include "common/codecs.h"
#include "fuzz_input.h"

namespace msa::fuzz {
namespace {

namespace codec = msa::codec;

#define FUZZ_ASSERT(cond)                                                           \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "fuzz_codecs: %s failed at line %d\n", #cond, __LINE__); \
      std::abort();                                                                 \
    }                                                                               \
  } while (0)

// Rounds |x| = ax, with lo_val <= ax < hi_val the magnitudes of codes lo and lo + 1, to the
// nearer of the two, ties to the even code. Exact: the midpoint of two neighbours is a double.
int round_between(double ax, double lo_val, double hi_val, int lo) {
  const double mid = lo_val + (hi_val - lo_val) / 2;
  if (ax < mid) return lo;
  if (ax > mid) return lo + 1;
  return lo % 2 == 0 ? lo : lo + 1;
}

// The code of the largest of `n` ascending magnitudes <= ax.
int floor_code(double ax, const double* mag, int n) {
  int lo = 0, hi = n - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (mag[mid] <= ax)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

// A format that saturates at its largest magnitude (e4m3, e2m1).
int nearest_saturating(double ax, const double* mag, int n) {
  const int lo = floor_code(ax, mag, n);
  return lo == n - 1 ? lo : round_between(ax, mag[lo], mag[lo + 1], lo);
}

struct Tables {
  double e4m3[127];  // codes 0x00 .. 0x7e
  double e2m1[8];
  double f16[0x7c00];  // every finite non-negative f16, in code order
  Tables() {
    for (int c = 0; c < 127; ++c) e4m3[c] = codec::e4m3_to_float(uint8_t(c));
    for (int c = 0; c < 8; ++c) e2m1[c] = codec::e2m1_to_float(uint8_t(c));
    for (int c = 0; c < 0x7c00; ++c) f16[c] = codec::f16_to_float(uint16_t(c));
  }
};
const Tables& tables() {
  static const Tables t;
  return t;
}

// The expected encodings of x (a double, or a float widened exactly).
uint8_t want_e4m3(double x) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  if (std::isnan(x)) return uint8_t(sign | 0x7f);
  return uint8_t(sign | nearest_saturating(std::fabs(x), tables().e4m3, 127));
}
uint8_t want_e2m1(double x) {
  if (std::isnan(x)) return 0;
  return uint8_t((std::signbit(x) ? 8 : 0) | nearest_saturating(std::fabs(x), tables().e2m1, 8));
}
// IEEE formats round to nearest even and overflow to inf from the largest finite value plus half
// an ulp (the midpoint to 2^(emax + 1)).
uint16_t want_f16(double x) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double ax = std::fabs(x);
  if (ax >= 65520.0) return uint16_t(sign | 0x7c00);
  const double* m = tables().f16;
  const int lo = floor_code(ax, m, 0x7c00);
  return uint16_t(sign | (lo == 0x7bff ? lo : round_between(ax, m[lo], m[lo + 1], lo)));
}
uint16_t want_bf16(double x) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double ax = std::fabs(x);
  // The largest float <= ax, then the largest bf16 <= it: its upper 16 bits.
  float fa = float(ax);
  if (double(fa) > ax) fa = std::nextafter(fa, 0.f);
  const int lo = int(codec::float_bits(fa) >> 16);
  if (lo >= 0x7f80) return uint16_t(sign | 0x7f80);
  const double hi_val =
      lo + 1 == 0x7f80 ? std::ldexp(1.0, 128) : double(codec::bf16_to_float(uint16_t(lo + 1)));
  return uint16_t(sign | round_between(ax, codec::bf16_to_float(uint16_t(lo)), hi_val, lo));
}

// x's encodings, from a float (float_to_*) or from a double (double_to_*, round to odd first).
void check_encodings(double x, bool from_float) {
  const float f = float(x);
  const uint8_t e4 = from_float ? codec::float_to_e4m3(f) : codec::double_to_e4m3(x);
  const uint8_t e2 = from_float ? codec::float_to_e2m1(f) : codec::double_to_e2m1(x);
  const uint16_t hf = from_float ? codec::float_to_f16(f) : codec::double_to_f16(x);
  const uint16_t hb = from_float ? codec::float_to_bf16(f) : codec::double_to_bf16(x);
  FUZZ_ASSERT(e4 == want_e4m3(x));
  FUZZ_ASSERT(e2 == want_e2m1(x));
  if (std::isnan(x)) {
    FUZZ_ASSERT(std::isnan(codec::f16_to_float(hf)) && std::isnan(codec::bf16_to_float(hb)));
  } else {
    FUZZ_ASSERT(hf == want_f16(x));
    FUZZ_ASSERT(hb == want_bf16(x));
  }
}

void check_scalars(Input& in) {
  // Every code back to itself.
  const uint8_t b = in.u8();
  if ((b & 0x7f) != 0x7f)
    FUZZ_ASSERT(codec::float_to_e4m3(codec::e4m3_to_float(b)) == b);
  else
    FUZZ_ASSERT(std::isnan(codec::e4m3_to_float(b)));
  FUZZ_ASSERT(codec::float_to_e2m1(codec::e2m1_to_float(b & 0xf)) == (b & 0xf));
  if (b != 0xff) {
    FUZZ_ASSERT(codec::e8m0_to_float(b) == std::ldexp(1.f, int(b) - 127));
    if (b <= 252) FUZZ_ASSERT(codec::mxfp4_scale_byte(codec::e8m0_to_float(b) * 4.f) == b);
  }
  const uint16_t h = in.u16();
  if ((h & 0x7fff) <= 0x7f80) FUZZ_ASSERT(codec::float_to_bf16(codec::bf16_to_float(h)) == h);
  if ((h & 0x7fff) <= 0x7c00) FUZZ_ASSERT(codec::float_to_f16(codec::f16_to_float(h)) == h);

  // Any float, and any double, to the nearest code; doubles also near the grids' midpoints.
  check_encodings(double(codec::bits_float(in.u32())), true);
  const uint64_t bits = in.u64();
  double d;
  std::memcpy(&d, &bits, 8);
  if (in.flag()) d = std::ldexp(double(int32_t(in.u32())), int(in.range(-170, 40)));
  check_encodings(d, false);
}

// Whether v is exactly a value of `dtype` (f32, bf16 or f16); writes its bits at `dst`.
bool store_exact(double v, DType dtype, uint8_t* dst) {
  const float f = float(v);
  if (double(f) != v || std::isinf(f)) return false;
  if (dtype == DType::f32) {
    std::memcpy(dst, &f, 4);
    return true;
  }
  const uint16_t h = dtype == DType::bf16 ? codec::float_to_bf16(f) : codec::float_to_f16(f);
  const float back = dtype == DType::bf16 ? codec::bf16_to_float(h) : codec::f16_to_float(h);
  if (back != f || std::signbit(back) != std::signbit(f)) return false;
  std::memcpy(dst, &h, 2);
  return true;
}

// A tensor from codes and scales the format represents exactly: quantize must give them back,
// dequantize the tensor.
void check_round_trip(Input& in) {
  Arena arena;
  Rng rng(in.u32());
  const QuantFormat f =
      in.pick({QuantFormat::fp8_per_tensor, QuantFormat::fp8_per_token,
               QuantFormat::fp8_per_token_head, QuantFormat::nvfp4, QuantFormat::mxfp4});
  const DType dt = in.pick({DType::f32, DType::bf16, DType::f16});
  const bool fp4 = f == QuantFormat::nvfp4 || f == QuantFormat::mxfp4;
  const int64_t T = in.range(1, 3), H = in.range(1, 3);
  const int64_t group = f == QuantFormat::nvfp4 ? 16 : f == QuantFormat::mxfp4 ? 32 : 0;
  // Rows of 16-byte multiples (quantize's alignment rule) for every element size involved.
  const int64_t D = fp4 ? 32 * in.range(1, 3) : 16 * in.range(1, 3);
  const int64_t es = int64_t(dtype_size(dt));
  std::vector<uint8_t> x(size_t(T * H * D * es)), codes(size_t(fp4 ? T * H * D / 2 : T * H * D));
  // One scale per group: fp8 f32 [1] / [T] / [T, H]; fp4 a byte per group of D.
  const int64_t groups = f == QuantFormat::fp8_per_tensor       ? 1
                         : f == QuantFormat::fp8_per_token      ? T
                         : f == QuantFormat::fp8_per_token_head ? T * H
                                                                : T * H * (D / group);
  std::vector<float> fscale(static_cast<size_t>(groups));
  std::vector<uint8_t> bscale(static_cast<size_t>(groups));
  // Scale mantissas short enough that code * scale is exact in the target dtype.
  const int bits = dt == DType::f32 ? 18 : dt == DType::f16 ? 5 : 2;
  float global = 1.f;
  for (int64_t g = 0; g < groups; ++g) {
    const double m = double(1 + in.below(1 << std::min(bits, 8)));
    if (f == QuantFormat::nvfp4)
      bscale[size_t(g)] = uint8_t(in.range(1, 0x7e));
    else if (f == QuantFormat::mxfp4)
      bscale[size_t(g)] = uint8_t(in.range(0, 0xfe));
    else
      fscale[size_t(g)] = float(std::ldexp(m, int(in.range(-140, 100))));
  }
  if (f == QuantFormat::nvfp4)
    global = float(std::ldexp(double(1 + in.below(1 << bits)), int(in.range(-30, 30))));
  std::vector<bool> forced(size_t(groups), false);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t d = 0; d < D; ++d) {
        const int64_t i = (t * H + h) * D + d;
        const int64_t g = f == QuantFormat::fp8_per_tensor  ? 0
                          : f == QuantFormat::fp8_per_token ? t
                          : f == QuantFormat::fp8_per_token_head
                              ? t * H + h
                              : (t * H + h) * (D / group) + d / group;
        double value;
        if (!fp4) {
          uint8_t c = uint8_t(rng.next());
          if ((c & 0x7f) == 0x7f) c &= 0xfe;              // no NaN codes
          if (!forced[size_t(g)]) c = (c & 0x80) | 0x7e;  // +-448: the scale rule finds this scale
          codes[size_t(i)] = c;
          value = double(codec::e4m3_to_float(c)) * double(fscale[size_t(g)]);
        } else {
          uint8_t c = uint8_t(rng.next() & 0xf);
          if (!forced[size_t(g)]) c = (c & 8) | 7;  // +-6
          codes[size_t(i / 2)] |= uint8_t(c << (4 * (i % 2)));
          const double step = codec::fp4_step(bscale[size_t(g)], f == QuantFormat::nvfp4, global);
          value = double(codec::e2m1_to_float(c)) * step;
        }
        forced[size_t(g)] = true;
        if (!store_exact(value, dt, &x[size_t(i * es)])) return;  // not representable: skip
      }
  const Tensor xt = arena.view(dt, {T, H, D}, Layout{row_major({T, H, D}), 0}, x.data(), rng);
  const std::vector<int64_t> vshape = {T, H, fp4 ? D / 2 : D};
  QTensor q(arena.view(fp4 ? DType::fp4x2 : DType::fp8_e4m3, vshape, Layout{row_major(vshape), 0},
                       nullptr, rng));
  std::vector<int64_t> sshape = f == QuantFormat::fp8_per_tensor  ? std::vector<int64_t>{1}
                                : f == QuantFormat::fp8_per_token ? std::vector<int64_t>{T}
                                : f == QuantFormat::fp8_per_token_head
                                    ? std::vector<int64_t>{T, H}
                                    : std::vector<int64_t>{T, H, D / group};
  const DType sdt = f == QuantFormat::nvfp4   ? DType::fp8_e4m3
                    : f == QuantFormat::mxfp4 ? DType::e8m0
                                              : DType::f32;
  q.scale = arena.view(sdt, sshape, Layout{row_major(sshape), 0}, nullptr, rng);
  q.global_scale = global;
  const Tensor back = arena.view(dt, {T, H, D}, Layout{row_major({T, H, D}), 0}, nullptr, rng);
  if (!arena.ok()) return;
  quantize(xt, f, q);
  FUZZ_ASSERT(std::memcmp(q.values.data, codes.data(), codes.size()) == 0);
  if (fp4)
    FUZZ_ASSERT(std::memcmp(q.scale.data, bscale.data(), bscale.size()) == 0);
  else
    FUZZ_ASSERT(std::memcmp(q.scale.data, fscale.data(), fscale.size() * 4) == 0);
  dequantize(q, back);
  FUZZ_ASSERT(std::memcmp(back.data, x.data(), x.size()) == 0);
}

// Any finite input: FP8 codes are never NaN, and dequantize runs.
void check_finite(Input& in) {
  Arena arena;
  Rng rng(in.u32());
  const QuantFormat f = in.pick(
      {QuantFormat::fp8_per_tensor, QuantFormat::fp8_per_token, QuantFormat::fp8_per_token_head});
  const DType dt = in.pick({DType::f32, DType::bf16, DType::f16});
  const int64_t T = in.range(1, 3), H = in.range(1, 3), D = 16 * in.range(1, 3);
  std::vector<uint8_t> x(size_t(T * H * D) * dtype_size(dt));
  for (size_t i = 0; i < x.size(); i += dtype_size(dt)) {
    const float v = float(std::ldexp(double(int32_t(in.u32())), int(in.range(-170, 100))));
    const uint16_t h = dt == DType::bf16 ? codec::float_to_bf16(v) : codec::float_to_f16(v);
    const bool finite = dt == DType::f32    ? std::isfinite(v)
                        : dt == DType::bf16 ? std::isfinite(codec::bf16_to_float(h))
                                            : std::isfinite(codec::f16_to_float(h));
    if (!finite) continue;  // stays 0
    if (dt == DType::f32)
      std::memcpy(&x[i], &v, 4);
    else
      std::memcpy(&x[i], &h, 2);
  }
  const Tensor xt = arena.view(dt, {T, H, D}, Layout{row_major({T, H, D}), 0}, x.data(), rng);
  QTensor q(arena.view(DType::fp8_e4m3, {T, H, D}, Layout{row_major({T, H, D}), 0}, nullptr, rng));
  const std::vector<int64_t> sshape = f == QuantFormat::fp8_per_tensor ? std::vector<int64_t>{1}
                                      : f == QuantFormat::fp8_per_token
                                          ? std::vector<int64_t>{T}
                                          : std::vector<int64_t>{T, H};
  q.scale = arena.view(DType::f32, sshape, Layout{row_major(sshape), 0}, nullptr, rng);
  const Tensor back = arena.view(dt, {T, H, D}, Layout{row_major({T, H, D}), 0}, nullptr, rng);
  if (!arena.ok()) return;
  quantize(xt, f, q);
  for (int64_t i = 0; i < T * H * D; ++i) FUZZ_ASSERT((q.values.ptr<uint8_t>()[i] & 0x7f) != 0x7f);
  dequantize(q, back);
}

}  // namespace
}  // namespace msa::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  msa::fuzz::Input in(data, size);
  switch (in.below(3)) {
    case 0:
      msa::fuzz::check_scalars(in);
      break;
    case 1:
      msa::fuzz::check_round_trip(in);
      break;
    default:
      msa::fuzz::check_finite(in);
      break;
  }
  return 0;
}
