// GPU quantize / dequantize against the CPU reference: identical codes and scales, bit for bit,
// for every format, on fresh random inputs with the edge rows (all zero, NaN, saturating, tiny);
// the FP4 scale reorders byte for byte against the CPU's.
#include <cmath>
#include <random>

#include "common/codecs.h"
#include "support/device_tensor.h"
#include "support/fp4_preorder.h"

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

// Both directions, each layout and scale dtype, public rows strided, padding rows and groups;
// the outputs are poisoned first, so the preordered padding zeros must come from the kernel.
TEST(QuantGpu, ReorderFp4ScalesMatchCpuBitwise) {
  MSA_REQUIRE_GPU();
  TestStream stream;
  struct Case {
    KVLayout layout;
    std::vector<int64_t> shape;
  };
  const Case cases[] = {{KVLayout::flat, {300, 3, 6}},         {KVLayout::flat, {128, 2, 8}},
                        {KVLayout::flat, {37, 4, 3}},          {KVLayout::paged_nhd, {3, 128, 2, 8}},
                        {KVLayout::paged_nhd, {2, 128, 3, 3}}, {KVLayout::paged_hnd, {2, 3, 128, 6}}};
  std::mt19937 rng(21);
  for (const Case& c : cases)
    for (DType dt : {DType::fp8_e4m3, DType::e8m0}) {
      SCOPED_TRACE(std::string(kv_layout_name(c.layout)) + " " + dtype_name(dt) + " " +
                   HostTensor(dt, c.shape).t.describe());
      const HostTensor pub = random_scales(dt, c.shape, /*strided=*/true, rng);
      HostTensor pre(dt, preordered_shape(pub.t, c.layout));
      reorder_fp4_scales(pub.t, c.layout, pre.t);
      const DeviceTensor dpub = to_device(pub, stream);
      const DeviceTensor dpre = device_like(pre, stream);
      reorder_fp4_scales(dpub.t, c.layout, dpre.t, stream);
      HostTensor got(dt, preordered_shape(pub.t, c.layout));
      copy_to_host(dpre, got, stream);
      EXPECT_EQ(0, std::memcmp(got.t.data, pre.t.data, pre.bytes())) << "preordered bytes differ";

      // Back to a public tensor of pub's strides: both poisoned (0xff) between rows.
      const std::vector<int64_t> strides(pub.t.strides, pub.t.strides + pub.t.ndim);
      HostTensor back(dt, c.shape, strides), gback(dt, c.shape, strides);
      reorder_fp4_scales_to_public(pre.t, c.layout, back.t);
      const DeviceTensor dback = device_like(back, stream);
      reorder_fp4_scales_to_public(dpre.t, c.layout, dback.t, stream);
      copy_to_host(dback, gback, stream);
      EXPECT_EQ(0, std::memcmp(gback.t.data, back.t.data, back.bytes())) << "public bytes differ";
    }
  // Both sides on one device.
  const HostTensor pub = random_scales(DType::e8m0, {5, 2, 4}, false, rng);
  HostTensor pre(DType::e8m0, preordered_shape(pub.t, KVLayout::flat));
  const DeviceTensor dpub = to_device(pub, stream);
  EXPECT_THROW(reorder_fp4_scales(dpub.t, KVLayout::flat, pre.t, stream), Error);
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
