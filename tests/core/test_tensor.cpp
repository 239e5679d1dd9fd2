// Tests of the core layer: tensor views, DLPack conversion both ways, argument checks (each
// message names the argument and the rule), the status buffer, and the scalar codecs.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "common/codecs.h"
#include "msa/msa.h"

namespace msa {
namespace {

// Expects `fn` to throw msa::Error whose message contains every one of `parts`.
template <typename Fn>
void expect_error(Fn&& fn, std::initializer_list<const char*> parts) {
  try {
    fn();
    ADD_FAILURE() << "expected msa::Error";
  } catch (const Error& e) {
    for (const char* p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
          << "message '" << e.what() << "' lacks '" << p << "'";
  }
}

TEST(Tensor, ContiguousViewHasRowMajorStrides) {
  std::vector<float> buf(2 * 3 * 4);
  Tensor t(buf.data(), DType::f32, {2, 3, 4});
  EXPECT_EQ(t.ndim, 3);
  EXPECT_EQ(t.stride(0), 12);
  EXPECT_EQ(t.stride(1), 4);
  EXPECT_EQ(t.stride(-1), 1);
  EXPECT_EQ(t.numel(), 24);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.describe(), "f32[2, 3, 4] on cpu");
  Tensor s(buf.data(), DType::f32, {2, 3}, {12, 4});
  EXPECT_FALSE(s.is_contiguous());
  EXPECT_FALSE(Tensor().defined());
  Tensor empty(buf.data(), DType::f32, std::vector<int64_t>{16, 0, 0}, std::vector<int64_t>{0, 0, 1});
  EXPECT_TRUE(empty.is_contiguous());
}

TEST(Tensor, RejectsNegativeShapeAndMismatchedStrides) {
  expect_error([] { Tensor(nullptr, DType::f32, {2, -1}); }, {"shape[1]", ">= 0"});
  expect_error([] { Tensor(nullptr, DType::f32, std::vector<int64_t>{2, 3}, std::vector<int64_t>{1}); },
               {"strides", "same length"});
}

// Sizes a DLPack producer may claim (found by fuzzing: the row-major strides and numel()
// overflowed int64, which is undefined behaviour). An empty view may have any other sizes.
TEST(Tensor, SizesPastInt64) {
  const int64_t big = int64_t(1) << 62;
  const Tensor empty(nullptr, DType::f32, {0, big, 4});
  EXPECT_EQ(empty.numel(), 0);
  EXPECT_EQ(empty.strides[0], INT64_MAX);  // 2^64 saturates: no address is formed from it
  EXPECT_TRUE(empty.is_contiguous());
  EXPECT_EQ(Tensor(nullptr, DType::f32, {big, big, 0}).numel(), 0);
  expect_error([&] { Tensor(nullptr, DType::f32, {int64_t(1) << 32, int64_t(1) << 32}); },
               {"f32[4294967296, 4294967296] on cpu", "more than 2^63 - 1 elements"});
  expect_error([&] { Tensor(nullptr, DType::u8, std::vector<int64_t>{big, 4}, std::vector<int64_t>{0, 0}); },
               {"more than 2^63 - 1 elements"});
  Tensor by_fields;  // set field by field (as a binding may): numel() saturates
  by_fields.ndim = 2;
  by_fields.shape[0] = big;
  by_fields.shape[1] = 4;
  EXPECT_EQ(by_fields.numel(), INT64_MAX);
  // A stride whose byte count does not fit int64 still gets its message.
  alignas(16) float buf[4];
  const Tensor far(buf, DType::f32, std::vector<int64_t>{2, 1}, std::vector<int64_t>{INT64_MAX, 1});
  expect_error([&] { check_row_alignment(far, "x"); },
               {"x: stride of dim 0 (9223372036854775807 elements of 4 bytes) must be a multiple of 16"});
}

TEST(Tensor, DtypeSizesAndNames) {
  EXPECT_EQ(dtype_size(DType::bf16), 2u);
  EXPECT_EQ(dtype_size(DType::fp4x2), 1u);
  EXPECT_EQ(dtype_size(DType::i32), 4u);
  EXPECT_STREQ(dtype_name(DType::fp8_e4m3), "fp8_e4m3");
}

TEST(DLPack, RoundTripKeepsEverything) {
  std::vector<uint16_t> buf(64);
  for (DType dt : {DType::f32, DType::f16, DType::bf16, DType::fp8_e4m3, DType::fp4x2, DType::e8m0,
                   DType::u8, DType::i32}) {
    Tensor t(buf.data(), dt, std::vector<int64_t>{4, 2}, std::vector<int64_t>{4, 1});
    DLTensor dl;
    to_dlpack(t, &dl);
    Tensor back = from_dlpack(dl);
    EXPECT_EQ(back.dtype, dt);
    EXPECT_EQ(back.data, t.data);
    EXPECT_EQ(back.ndim, 2);
    EXPECT_EQ(back.shape[0], 4);
    EXPECT_EQ(back.strides[0], 4);
  }
}

TEST(DLPack, DefaultStridesByteOffsetAndCuda) {
  std::vector<float> buf(32);
  int64_t shape[2] = {4, 8};
  DLTensor dl{};
  dl.data = buf.data();
  dl.device = {kDLCUDA, 3};
  dl.ndim = 2;
  dl.dtype = {kDLFloat, 32, 1};
  dl.shape = shape;
  dl.strides = nullptr;
  dl.byte_offset = 16;
  Tensor t = from_dlpack(dl);
  EXPECT_EQ(t.strides[0], 8);
  EXPECT_EQ(t.strides[1], 1);
  EXPECT_EQ(t.data, static_cast<void*>(buf.data() + 4));
  EXPECT_TRUE(t.is_cuda());
  EXPECT_EQ(t.device.index, 3);
}

// Fields a producer may get wrong (found by fuzzing: the row-major strides overflowed int64, and
// data + byte_offset wrapped around the address space): refused, never undefined behaviour.
TEST(DLPack, RejectsSizesAndOffsetsPastInt64) {
  float buf[4];
  int64_t shape[3] = {0, int64_t(1) << 62, 4};
  DLTensor dl{};
  dl.data = buf;
  dl.device = {kDLCPU, 0};
  dl.ndim = 3;
  dl.dtype = {kDLFloat, 32, 1};
  dl.shape = shape;
  EXPECT_EQ(from_dlpack(dl).numel(), 0);
  shape[0] = int64_t(1) << 62;
  expect_error([&] { from_dlpack(dl); }, {"more than 2^63 - 1 elements"});
  shape[0] = -(int64_t(1) << 62);
  expect_error([&] { from_dlpack(dl); }, {"shape[0] must be >= 0"});
  shape[0] = 1;
  dl.byte_offset = UINT64_MAX;
  expect_error([&] { from_dlpack(dl); }, {"from_dlpack: byte_offset 18446744073709551615 overflows"});
}

TEST(DLPack, RejectsUnsupported) {
  int64_t shape[1] = {4};
  DLTensor dl{};
  dl.ndim = 1;
  dl.shape = shape;
  dl.device = {kDLCPU, 0};
  dl.dtype = {kDLFloat, 64, 1};
  expect_error([&] { from_dlpack(dl); }, {"unsupported DLPack dtype", "bits 64"});
  dl.dtype = {kDLFloat, 32, 1};
  dl.device = {kDLMetal, 0};
  expect_error([&] { from_dlpack(dl); }, {"unsupported device type"});
}

TEST(Checks, MessagesNameArgumentAndRule) {
  alignas(16) uint16_t buf[4 * 3 * 8];
  Tensor q(buf, DType::f32, {4, 3, 8});
  expect_error([&] { check_dtype(q, "q", {DType::bf16, DType::f16}); },
               {"q", "dtype must be bf16 or f16", "got f32"});
  expect_error([&] { check_shape(q, "q", {4, 2, -1}); }, {"q", "shape must be [4, 2, *]", "dim 1"});
  expect_error([&] { check_ndim(q, "q", 2); }, {"q", "must have 2 dims"});
  Tensor strided(buf, DType::bf16, std::vector<int64_t>{4, 8}, std::vector<int64_t>{8, 2});
  expect_error([&] { check_last_dim_contiguous(strided, "k"); }, {"k", "last dim must be contiguous"});
  Tensor misaligned(buf, DType::bf16, std::vector<int64_t>{4, 8}, std::vector<int64_t>{9, 1});
  expect_error([&] { check_row_alignment(misaligned, "v"); }, {"v", "stride of dim 0", "multiple of 16"});
  Tensor gpu = q;
  gpu.device = {DeviceType::cuda, 0};
  expect_error([&] { check_same_device(q, "q", gpu, "k"); }, {"k", "same device as q"});
  expect_error([&] { check_defined(Tensor(), "lse"); }, {"lse", "missing"});
}

TEST(Checks, DtypeNeedsElementAlignedBase) {
  alignas(16) uint8_t buf[64];
  EXPECT_NO_THROW(check_dtype(Tensor(buf + 4, DType::f32, {4}), "x", {DType::f32}));
  expect_error([&] { check_dtype(Tensor(buf + 2, DType::f32, {4}), "x", {DType::f32}); },
               {"x: base pointer must be 4-byte aligned for f32 elements"});
  expect_error([&] { check_dtype(Tensor(buf + 1, DType::bf16, {4}), "x", {DType::bf16}); },
               {"x: base pointer must be 2-byte aligned for bf16 elements"});
  EXPECT_NO_THROW(check_dtype(Tensor(buf + 1, DType::u8, {4}), "x", {DType::u8}));
  EXPECT_NO_THROW(check_dtype(Tensor(buf + 1, DType::i32, {0}), "x", {DType::i32}));  // no element
}

TEST(Checks, EmptyViewsPassLayoutRules) {
  // numpy 2 exports a view of no elements with zero strides (and its base need not be aligned):
  // no address is formed from either, so the layout rules must not reject it.
  alignas(16) uint8_t buf[32];
  const Tensor empty(buf + 2, DType::bf16, std::vector<int64_t>{0, 4, 8}, std::vector<int64_t>{0, 0, 0});
  EXPECT_NO_THROW(check_last_dim_contiguous(empty, "q"));
  EXPECT_NO_THROW(check_contiguous(empty, "q"));
  EXPECT_NO_THROW(check_row_alignment(empty, "q"));
  // The same strides over elements are still wrong.
  const Tensor full(buf, DType::bf16, std::vector<int64_t>{1, 4, 2}, std::vector<int64_t>{0, 0, 0});
  expect_error([&] { check_last_dim_contiguous(full, "q"); }, {"q", "last dim must be contiguous"});
  expect_error([&] { check_row_alignment(Tensor(buf + 2, DType::bf16, {2, 8}), "k"); },
               {"k", "base pointer must be 16-byte aligned"});
}

TEST(Status, DescribesAndThrowsOnCpuBuffers) {
  int32_t s[4] = {int32_t(StatusCode::block_id_out_of_range), 1, 2, 3};
  EXPECT_EQ(describe_status(s), "q2k: block id out of range at (head 1, token 2, slot 3)");
  Tensor st(s, DType::i32, {4});
  expect_error([&] { check_status(st, nullptr); }, {"head 1, token 2, slot 3"});
  clear_status(st, nullptr);
  EXPECT_NO_THROW(check_status(st, nullptr));
  EXPECT_EQ(s[0], 0);
  // The CUDA forward's k2q check names the row, or the head whose entry count is off.
  const int32_t row[4] = {int32_t(StatusCode::k2q_mismatch), 1, 7, 0};
  EXPECT_EQ(describe_status(row),
            "k2q: does not match q2k at (head 1, row 7); build it with build_k2q_csr from the same q2k");
  const int32_t count[4] = {int32_t(StatusCode::k2q_mismatch), 2, -1, 0};
  EXPECT_NE(describe_status(count).find("k2q: does not match q2k for kv head 2"), std::string::npos);
  // A paged length past the table names seqused_k.
  const int32_t past[4] = {int32_t(StatusCode::kv_length_past_table), 1, 300, 256};
  EXPECT_EQ(describe_status(past),
            "seqused_k: batch 1 has 300 keys, more than its page table holds (max_pages * page_size "
            "= 256); the keys past the table were not read");
}

TEST(Codecs, E4m3AndE2m1RoundTripEveryCode) {
  using namespace codec;
  for (int x = 0; x < 256; ++x) {
    const float f = e4m3_to_float(uint8_t(x));
    if (std::isnan(f)) {
      EXPECT_EQ(x & 0x7f, 0x7f);
      continue;
    }
    if (f == 0.f) continue;  // +0 and -0 both valid
    EXPECT_EQ(float_to_e4m3(f), x) << x;
  }
  for (int x = 1; x < 16; ++x)
    if (x != 8) EXPECT_EQ(float_to_e2m1(e2m1_to_float(uint8_t(x))), x) << x;
  EXPECT_EQ(e4m3_to_float(0x7e), 448.f);
  EXPECT_EQ(float_to_e4m3(1e6f), 0x7e);    // saturates
  EXPECT_EQ(float_to_e4m3(-1e6f), 0xfe);
  EXPECT_EQ(e4m3_to_float(0x01), 0.001953125f);  // smallest subnormal 2^-9
  EXPECT_EQ(e2m1_to_float(float_to_e2m1(2.5f)), 2.f);  // tie to even
  EXPECT_EQ(e2m1_to_float(float_to_e2m1(5.f)), 4.f);
  EXPECT_EQ(e2m1_to_float(float_to_e2m1(100.f)), 6.f);
  EXPECT_EQ(e8m0_to_float(127), 1.f);
  EXPECT_EQ(e8m0_to_float(130), 8.f);
  const uint8_t packed[1] = {0x72};  // low nibble 2 -> 1.0, high 7 -> 6.0
  EXPECT_EQ(fp4x2_get(packed, 0), 1.f);
  EXPECT_EQ(fp4x2_get(packed, 1), 6.f);
}

TEST(Codecs, Bf16AndF16RoundNearestEven) {
  using namespace codec;
  for (uint32_t x = 0; x < 65536; x += 7) {
    const float b = bf16_to_float(uint16_t(x));
    if (!std::isnan(b)) EXPECT_EQ(float_to_bf16(b), x);
    const float h = f16_to_float(uint16_t(x));
    if (!std::isnan(h)) EXPECT_EQ(float_to_f16(h), x);
  }
  EXPECT_EQ(float_to_bf16(1.f + 1.f / 256), 0x3f80);  // tie -> even (down)
  EXPECT_EQ(float_to_bf16(1.f + 3.f / 256), 0x3f82);  // tie -> even (up)
  EXPECT_EQ(f16_to_float(float_to_f16(65519.f)), 65504.f);
  EXPECT_TRUE(std::isinf(f16_to_float(float_to_f16(65520.f))));
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(Version, ReportsBuild) {
  EXPECT_GE(cuda_device_count(), 0);
  if (!built_with_cuda()) EXPECT_EQ(cuda_device_count(), 0);
}

}  // namespace
}  // namespace msa
