// GPU top-K selection (src/cuda/common/topk.cu) against the CPU reference: identical q2k rows on
// random varlen problems with ties (signed zeros among them), NaN and -inf scores, sequences longer than one shared-memory
// chunk, forced sink/local blocks, and topK above the visible block count.
#include <cmath>
#include <numeric>
#include <random>

#include "support/device_tensor.h"
#include "support/topk_args.h"

namespace msa::test {
namespace {

struct TopKCase {
  std::vector<int32_t> lq, lk;
  int64_t hq = 4, hkv = 2;
  int blk = 128, topk = 8, sink = 1, local = 1;
  bool causal = true;
  int score_levels = 0;  // > 0: scores drawn from few values (ties)
  bool signed_zeros = false;  // level 0 drawn as -0.0 or +0.0 at random (equal scores)
  unsigned seed = 1;
};

void run_case(const TopKCase& c) {
  const int64_t total_q = std::accumulate(c.lq.begin(), c.lq.end(), int64_t(0));
  int64_t nblk_max = 1;
  for (int32_t k : c.lk) nblk_max = std::max<int64_t>(nblk_max, (k + c.blk - 1) / c.blk);
  HostTensor scores(DType::f32, {c.hq, nblk_max, total_q});
  std::mt19937 rng(c.seed);
  std::normal_distribution<float> nd;
  for (int64_t i = 0; i < c.hq * nblk_max * total_q; ++i) {
    float v = c.score_levels ? float(rng() % c.score_levels) : nd(rng);
    if (c.signed_zeros && v == 0.f && rng() % 2) v = -0.f;
    if (rng() % 97 == 0) v = NAN;
    if (rng() % 89 == 0) v = -INFINITY;
    scores.data<float>()[i] = v;
  }
  const HostTensor cu_q = i32_tensor(cumulative(c.lq)), cu_k = i32_tensor(cumulative(c.lk));
  HostTensor ref(DType::i32, {c.hkv, total_q, c.topk});
  const TopKArgs a = topk_args(c, scores.t, cu_q.t, cu_k.t, ref.t);
  select_topk(a);

  TestStream stream;
  DeviceBuffer ds(scores.bytes()), dq(cu_q.bytes()), dk(cu_k.bytes()), dout(ref.bytes() + 4), dst(16);
  copy_to_device(scores, ds, stream);
  copy_to_device(cu_q, dq, stream);
  copy_to_device(cu_k, dk, stream);
  dout.poison(stream);
  TopKArgs g = a;
  g.scores = on_device(scores, ds);
  g.cu_seqlens_q = on_device(cu_q, dq);
  g.kv.cu_seqlens_k = on_device(cu_k, dk);
  g.q2k = on_device(ref, dout);
  g.status = Tensor(dst.get(), DType::i32, {4}, gpu0());
  clear_status(g.status, stream);
  select_topk(g, stream);
  EXPECT_NO_THROW(check_status(g.status, stream));
  const auto got = dout.download<int32_t>(ref.t.numel(), stream);
  int64_t mismatches = 0;
  for (int64_t i = 0; i < ref.t.numel(); ++i)
    if (got[i] != ref.data<int32_t>()[i] && mismatches++ < 5)
      ADD_FAILURE() << "q2k flat index " << i << " (head " << i / (total_q * c.topk) << ", token "
                    << (i / c.topk) % total_q << ", slot " << i % c.topk << "): gpu " << got[i]
                    << " cpu " << ref.data<int32_t>()[i];
  EXPECT_EQ(mismatches, 0);
}

TEST(TopKGpu, MatchesCpuOnRandomVarlen) {
  MSA_REQUIRE_GPU();
  std::mt19937 rng(11);
  const int groups[] = {1, 2, 4, 8, 16};
  for (int trial = 0; trial < 12; ++trial) {
    TopKCase c;
    const int b = 1 + int(rng() % 4);
    for (int i = 0; i < b; ++i) {
      c.lq.push_back(int32_t(rng() % 200));
      c.lk.push_back(c.lq.back() + int32_t(rng() % 3000));
    }
    c.hkv = 1 + trial % 3;
    c.hq = c.hkv * groups[trial % 5];
    c.blk = trial % 2 ? 64 : 128;
    c.topk = 1 + int(rng() % 64);
    c.sink = int(rng() % 3);
    c.local = int(rng() % 3);
    if (c.sink + c.local > c.topk) c.sink = c.local = 0;
    c.causal = trial % 3 != 0;
    c.score_levels = trial % 4 == 0 ? 3 : 0;
    c.seed = 100 + trial;
    SCOPED_TRACE("trial " + std::to_string(trial));
    run_case(c);
  }
}

// -0.0 and +0.0 are equal scores: the lower block id wins either way (the ranking key once put
// -0.0 below +0.0; found by the GPU soak on scores rounded to quarters).
TEST(TopKGpu, SignedZerosTieToTheLowerId) {
  MSA_REQUIRE_GPU();
  TopKCase c;
  c.lq = {30, 7};
  c.lk = {2000, 900};
  c.blk = 64;
  c.topk = 9;
  c.score_levels = 2;
  c.signed_zeros = true;
  for (unsigned seed : {1u, 2u, 3u}) {
    c.seed = seed;
    run_case(c);
  }
}

TEST(TopKGpu, LongerThanOneChunk) {
  MSA_REQUIRE_GPU();
  TopKCase c;
  c.lq = {40, 3};
  c.lk = {150000, 70000};  // 2344 blocks of 64: three shared-memory chunks
  c.blk = 64;
  c.hq = 2;
  c.hkv = 1;
  c.topk = 64;
  c.sink = 2;
  c.local = 3;
  run_case(c);
  c.score_levels = 2;  // mostly ties: the lowest ids must win across chunks
  run_case(c);
}

// Around the register path's bound: CTAs whose tokens see at most 256 blocks take it, the
// others the shared-memory passes (256 and 257 blocks of 64 in one launch); scores of at most
// 256 blocks run the small-chunk kernel. Random and mostly tied scores.
TEST(TopKGpu, AroundTheRegisterPathBound) {
  MSA_REQUIRE_GPU();
  TopKCase c;
  c.lq = {33, 40, 64};
  c.lk = {16384, 16448, 16416};  // 256, 257 and 257 blocks of 64 (the last one partial)
  c.blk = 64;
  c.hq = 4;
  c.hkv = 4;
  c.topk = 64;
  c.sink = 1;
  c.local = 2;
  run_case(c);
  c.score_levels = 2;
  c.topk = 17;
  run_case(c);
  c.lk = {16384, 16000, 16383};  // at most 256 blocks: the small-chunk kernel at its bound
  run_case(c);
  c.score_levels = 0;
  c.topk = 64;
  run_case(c);
}

TEST(TopKGpu, EdgeShapes) {
  MSA_REQUIRE_GPU();
  TopKCase c;
  c.lq = {0, 5, 300};
  c.lk = {0, 1, 130};  // empty batch, one key, Lq > Lk (early queries see nothing)
  run_case(c);
  c.topk = 1;
  c.sink = 0;
  c.local = 1;
  run_case(c);
}

}  // namespace
}  // namespace msa::test
