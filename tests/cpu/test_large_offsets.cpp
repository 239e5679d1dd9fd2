// docs/semantics.md, Conventions (64-bit offsets): element offsets past 2^31 are formed in 64 bits.
// The CPU backend runs on strided views whose rows lie 2^31 + 128 elements apart inside one sparse
// (MAP_NORESERVE) mapping, so row 1 already sits past 2^31 elements and only the touched pages use
// memory; the results must equal the same problem on small contiguous tensors.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstring>
#include <random>

#include "common/codecs.h"
#include "support/host_tensor.h"
#include "msa/msa.h"

namespace msa::test {
namespace {

constexpr int64_t kT = 3, kHq = 2, kHkv = 1, kD = 64;
constexpr int64_t kRowStride = (int64_t(1) << 31) + 128;  // elements between token rows

class SparseMapping {
 public:
  explicit SparseMapping(size_t bytes) : bytes_(bytes) {
    p_ = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  }
  ~SparseMapping() { if (p_ != MAP_FAILED) munmap(p_, bytes_); }
  bool ok() const { return p_ != MAP_FAILED; }
  uint16_t* at(int64_t element) const { return static_cast<uint16_t*>(p_) + element; }

 private:
  void* p_;
  size_t bytes_;
};

TEST(LargeOffsets, AttentionAndBlockScoresOnRowsPast2To31Elements) {
  SparseMapping map(size_t(kT) * kRowStride * 2 + (size_t(1) << 20));
  if (!map.ok()) GTEST_SKIP() << "this machine refused a sparse 12 GB mapping";
  std::mt19937 rng(8);
  std::normal_distribution<float> nd;
  // Small contiguous copies and the far-apart strided views of the same values: per token row,
  // q at +0, out at +256, k at +512, v at +640 elements from the row start.
  HostTensor q(DType::bf16, {kT, kHq, kD}), k(DType::bf16, {kT, kHkv, kD}), v(DType::bf16, {kT, kHkv, kD});
  for (int64_t t = 0; t < kT; ++t) {
    for (int64_t i = 0; i < kHq * kD; ++i) q.data<uint16_t>()[t * kHq * kD + i] = codec::float_to_bf16(nd(rng));
    for (int64_t i = 0; i < kHkv * kD; ++i) {
      k.data<uint16_t>()[t * kHkv * kD + i] = codec::float_to_bf16(nd(rng));
      v.data<uint16_t>()[t * kHkv * kD + i] = codec::float_to_bf16(nd(rng));
    }
    std::memcpy(map.at(t * kRowStride), q.data<uint16_t>() + t * kHq * kD, kHq * kD * 2);
    std::memcpy(map.at(t * kRowStride + 512), k.data<uint16_t>() + t * kHkv * kD, kHkv * kD * 2);
    std::memcpy(map.at(t * kRowStride + 640), v.data<uint16_t>() + t * kHkv * kD, kHkv * kD * 2);
  }
  auto far = [&](int64_t offset, int64_t heads) {
    return Tensor(map.at(offset), DType::bf16, std::vector<int64_t>{kT, heads, kD},
                  std::vector<int64_t>{kRowStride, kD, 1});
  };
  const HostTensor cu = i32_tensor({0, int32_t(kT)});

  auto attend = [&](const Tensor& qq, const Tensor& kk, const Tensor& vv, const Tensor& out) {
    HostTensor lse(DType::f32, {kHq, kT});
    AttentionArgs a;
    a.q = qq;
    a.kv.k = kk;
    a.kv.v = vv;
    a.kv.cu_seqlens_k = cu.t;
    a.cu_seqlens_q = cu.t;
    a.out = out;
    a.lse = lse.t;
    attention_forward(a);
    return std::vector<float>(lse.data<float>(), lse.data<float>() + kHq * kT);
  };
  HostTensor out_small(DType::bf16, {kT, kHq, kD});
  const auto lse_small = attend(q.t, k.t, v.t, out_small.t);
  const auto lse_far = attend(far(0, kHq), far(512, kHkv), far(640, kHkv), far(256, kHq));
  EXPECT_EQ(lse_small, lse_far);
  for (int64_t t = 0; t < kT; ++t)
    EXPECT_EQ(0, std::memcmp(map.at(t * kRowStride + 256), out_small.data<uint16_t>() + t * kHq * kD, kHq * kD * 2))
        << "out row " << t;

  auto scores = [&](const Tensor& qq, const Tensor& kk) {
    HostTensor sc(DType::f32, {kHq, 1, kT});
    BlockScoresArgs b;
    b.q = qq;
    b.kv.k = kk;
    b.kv.cu_seqlens_k = cu.t;
    b.cu_seqlens_q = cu.t;
    b.scores = sc.t;
    block_scores(b);
    return std::vector<float>(sc.data<float>(), sc.data<float>() + kHq * kT);
  };
  EXPECT_EQ(scores(q.t, k.t), scores(far(0, kHq), far(512, kHkv)));
}

}  // namespace
}  // namespace msa::test
