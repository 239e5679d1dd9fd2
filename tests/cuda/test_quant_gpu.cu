// GPU quantize / dequantize against the CPU reference: identical codes and scales, bit for bit,
// for every format, on fresh random inputs with the edge rows (all zero, NaN, saturating, tiny).
#include <cmath>
#include <random>

#include "common/codecs.h"
#include "support/device_tensor.h"

namespace msa::test {
namespace {

// Random x [T, H, D] in `dtype` with edge rows: row 0 zeros, row 1 holds a NaN, row 2 huge, row 3
// tiny values; other rows normal with per-row magnitudes spanning many binades.
HostTensor make_input(DType dtype, int64_t T, int64_t H, int64_t D, unsigned seed) {
  HostTensor x(dtype, {T, H, D});
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_int_distribution<int> binade(-12, 12);
  for (int64_t r = 0; r < T * H; ++r) {
    const float mag = std::ldexp(1.f, binade(rng));
    for (int64_t d = 0; d < D; ++d) {
      float v = nd(rng) * mag;
      if (r == 0) v = 0.f;
      if (r == 1 && d == 5) v = NAN;
      if (r == 2) v *= 1e30f;
      if (r == 3) v *= 1e-30f;
      const int64_t i = r * D + d;
      if (dtype == DType::f32) x.data<float>()[i] = v;
      else x.data<uint16_t>()[i] = dtype == DType::bf16 ? codec::float_to_bf16(v) : codec::float_to_f16(v);
    }
  }
  return x;
}

struct FormatCase {
  QuantFormat f;
  DType values;
  DType scale;
  std::vector<int64_t> scale_shape;
};

FormatCase format_case(QuantFormat f, int64_t T, int64_t H, int64_t D) {
  switch (f) {
    case QuantFormat::fp8_per_tensor: return {f, DType::fp8_e4m3, DType::f32, {1}};
    case QuantFormat::fp8_per_token: return {f, DType::fp8_e4m3, DType::f32, {T}};
    case QuantFormat::fp8_per_token_head: return {f, DType::fp8_e4m3, DType::f32, {T, H}};
    case QuantFormat::nvfp4: return {f, DType::fp4x2, DType::fp8_e4m3, {T, H, D / 16}};
    default: return {f, DType::fp4x2, DType::e8m0, {T, H, D / 32}};
  }
}

TEST(QuantGpu, QuantizeAndDequantizeMatchCpuBitwise) {
  MSA_REQUIRE_GPU();
  TestStream stream;
  const int64_t T = 37, H = 3, D = 128;
  for (DType in : {DType::f32, DType::bf16, DType::f16})
    for (QuantFormat f : {QuantFormat::fp8_per_tensor, QuantFormat::fp8_per_token,
                          QuantFormat::fp8_per_token_head, QuantFormat::nvfp4, QuantFormat::mxfp4}) {
      SCOPED_TRACE(std::string(quant_format_name(f)) + " from " + dtype_name(in));
      const HostTensor x = make_input(in, T, H, D, 7u + unsigned(f));
      const FormatCase fc = format_case(f, T, H, D);
      const int64_t vd = fc.values == DType::fp4x2 ? D / 2 : D;
      HostTensor cv(fc.values, {T, H, vd}), cs(fc.scale, fc.scale_shape);
      HostTensor gv(fc.values, {T, H, vd}), gs(fc.scale, fc.scale_shape);
      const float global = f == QuantFormat::nvfp4 ? 0.37f : 1.f;
      quantize(x.t, f, QTensor(cv.t, cs.t, global));

      DeviceBuffer dx(x.bytes()), dv(gv.bytes()), ds(gs.bytes());
      copy_to_device(x, dx, stream);
      dv.poison(stream);
      ds.poison(stream);
      const QTensor gq(on_device(gv, dv), on_device(gs, ds), global);
      quantize(on_device(x, dx), f, gq, stream);
      const auto v = dv.download<uint8_t>(gv.bytes(), stream);
      const auto s = ds.download<uint8_t>(gs.bytes(), stream);
      EXPECT_EQ(0, std::memcmp(v.data(), cv.data<uint8_t>(), v.size())) << "codes differ";
      EXPECT_EQ(0, std::memcmp(s.data(), cs.data<uint8_t>(), s.size())) << "scales differ";

      for (DType od : {DType::f32, DType::bf16}) {
        HostTensor co(od, {T, H, D}), go(od, {T, H, D});
        dequantize(QTensor(cv.t, cs.t, global), co.t);
        DeviceBuffer dout(go.bytes());
        dout.poison(stream);
        dequantize(gq, on_device(go, dout), stream);
        const auto o = dout.download<uint8_t>(go.bytes(), stream);
        EXPECT_EQ(0, std::memcmp(o.data(), co.data<uint8_t>(), o.size()))
            << "dequantized to " << dtype_name(od) << " differs";
      }
    }
}

TEST(QuantGpu, EmptyInputIsANoOp) {
  MSA_REQUIRE_GPU();
  TestStream stream;
  DeviceBuffer dummy(256);
  Tensor x(dummy.get(), DType::bf16, {0, 2, 32}, gpu0());
  Tensor v(dummy.get(), DType::fp8_e4m3, {0, 2, 32}, gpu0());
  Tensor s(dummy.get(), DType::f32, {0}, gpu0());
  EXPECT_NO_THROW(quantize(x, QuantFormat::fp8_per_token, QTensor(v, s), stream));
  MSA_CUDA_CHECK(cudaStreamSynchronize(stream));
}

}  // namespace
}  // namespace msa::test
