// CPU block scores (docs/semantics.md, Block scores; include/msa/indexer.h) against hand-computed
// cases and a reference that follows the definition key by key: visibility tested per key, max per
// block.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>

#include "common/codecs.h"
#include "support/expect_error.h"
#include "support/host_tensor.h"
#include "support/ref_codecs.h"
#include "msa/msa.h"

namespace msa::test {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

struct Shape {
  std::vector<int32_t> lq, lk;
  int64_t hq = 4, hkv = 2, dim = 64;
  int blk = 128;
  bool causal = true;
  int64_t total_q() const { return std::accumulate(lq.begin(), lq.end(), int64_t(0)); }
  int64_t total_k() const { return std::accumulate(lk.begin(), lk.end(), int64_t(0)); }
  int64_t nblk_max() const {
    int64_t m = 0;
    for (int32_t l : lk) m = std::max<int64_t>(m, (l + blk - 1) / blk);
    return m;
  }
};

// Fills a bf16/f16 tensor [T, H, D] with nonzero values in +-[0.05, 1).
void fill_half(HostTensor& x, std::mt19937& rng) {
  std::uniform_real_distribution<float> mag(0.05f, 1.f);
  std::bernoulli_distribution neg(0.5);
  for (int64_t t = 0; t < x.t.shape[0]; ++t)
    for (int64_t h = 0; h < x.t.shape[1]; ++h)
      for (int64_t d = 0; d < x.t.shape[2]; ++d) {
        const float v = neg(rng) ? -mag(rng) : mag(rng);
        x.data<uint16_t>()[x.offset({t, h, d})] =
            x.t.dtype == DType::bf16 ? codec::float_to_bf16(v) : codec::float_to_f16(v);
      }
}

// Fills a u8-like tensor (fp8, fp4x2 or a scale) with random bytes from [lo, hi], skipping NaN
// encodings (0x7f / 0xff for e4m3 and e8m0).
void fill_bytes(HostTensor& x, std::mt19937& rng, int lo, int hi) {
  std::uniform_int_distribution<int> byte(lo, hi);
  uint8_t* p = x.data<uint8_t>();
  for (size_t i = 0; i < x.bytes(); ++i) {
    int b = byte(rng);
    if ((b & 0x7f) == 0x7f) b ^= 1;
    p[i] = uint8_t(b);
  }
}

// scores[hq, kb, t] by the definition: every key j of the batch, visible iff
// j <= i + Lk - Lq (causal), contributes its dot product to block j / blk.
std::vector<double> reference(const Shape& sh, const QTensor& q, const QTensor& k) {
  const int64_t T = sh.total_q(), nb = sh.nblk_max(), G = sh.hq / sh.hkv, D = sh.dim;
  auto dequant = [&](const QTensor& x, int64_t tokens, int64_t heads) {
    std::vector<double> out(tokens * heads * D);
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t d = 0; d < D; ++d) out[(t * heads + h) * D + d] = ref_element(x, t, h, d);
    return out;
  };
  const std::vector<double> qd = dequant(q, T, sh.hq), kd = dequant(k, sh.total_k(), sh.hkv);
  std::vector<double> ref(sh.hq * nb * T, -kInf);
  int64_t t0 = 0, k0 = 0;
  for (size_t b = 0; b < sh.lq.size(); ++b) {
    const int64_t lq = sh.lq[b], lk = sh.lk[b];
    for (int64_t i = 0; i < lq; ++i)
      for (int64_t hq = 0; hq < sh.hq; ++hq)
        for (int64_t j = 0; j < lk; ++j) {
          if (sh.causal && j > i + lk - lq) continue;
          double dot = 0;
          for (int64_t d = 0; d < D; ++d)
            dot += qd[((t0 + i) * sh.hq + hq) * D + d] * kd[((k0 + j) * sh.hkv + hq / G) * D + d];
          double& r = ref[(hq * nb + j / sh.blk) * T + t0 + i];
          r = std::isnan(dot) || std::isnan(r) ? NAN : std::max(r, dot);
        }
    t0 += lq;
    k0 += lk;
  }
  return ref;
}

// Every entry equal to the reference: -inf exactly, NaN where NaN, finite within fp32 rounding.
::testing::AssertionResult matches(const HostTensor& scores, const std::vector<double>& ref) {
  const float* s = scores.data<float>();
  for (size_t i = 0; i < ref.size(); ++i) {
    const bool ok = std::isnan(ref[i])   ? std::isnan(s[i])
                    : std::isinf(ref[i]) ? s[i] == ref[i]
                                         : std::fabs(s[i] - ref[i]) <= 1e-6 * std::max(1.0, std::fabs(ref[i]));
    if (!ok) return ::testing::AssertionFailure() << "entry " << i << ": got " << s[i] << ", want " << ref[i];
  }
  return ::testing::AssertionSuccess();
}

// A flat problem: q, k (bf16/f16 random unless filled by the caller), lengths, scores (poisoned).
struct Flat {
  explicit Flat(const Shape& sh, DType dt = DType::bf16)
      : q(dt, {sh.total_q(), sh.hq, dt == DType::fp4x2 ? sh.dim / 2 : sh.dim}),
        k(dt, {sh.total_k(), sh.hkv, dt == DType::fp4x2 ? sh.dim / 2 : sh.dim}),
        cu_q(i32_tensor(cumulative(sh.lq))),
        cu_k(i32_tensor(cumulative(sh.lk))),
        scores(DType::f32, {sh.hq, sh.nblk_max(), sh.total_q()}) {}

  BlockScoresArgs args(const Shape& sh, const QTensor& qq, const QTensor& kk) const {
    BlockScoresArgs a;
    a.q = qq;
    a.kv.k = kk;
    a.kv.cu_seqlens_k = cu_k.t;
    a.cu_seqlens_q = cu_q.t;
    a.scores = scores.t;
    a.causal = sh.causal;
    a.kv_block_size = sh.blk;
    return a;
  }
  BlockScoresArgs args(const Shape& sh) const { return args(sh, q.t, k.t); }

  HostTensor q, k, cu_q, cu_k, scores;
};

// ------------------------------- hand-computed cases -------------------------------

// q head 0 = e0, head 1 = -e0 and k[j] = j e0, so a score is the largest (or minus the smallest)
// visible key index of the block.
struct IndexKeys {
  IndexKeys(const Shape& sh) : f(sh) {
    std::memset(f.q.data<uint16_t>(), 0, f.q.bytes());
    std::memset(f.k.data<uint16_t>(), 0, f.k.bytes());
    for (int64_t t = 0; t < sh.total_q(); ++t) {
      f.q.data<uint16_t>()[f.q.offset({t, 0, 0})] = codec::float_to_bf16(1.f);
      f.q.data<uint16_t>()[f.q.offset({t, 1, 0})] = codec::float_to_bf16(-1.f);
    }
    int64_t k0 = 0;
    for (int32_t lk : sh.lk) {
      for (int64_t j = 0; j < lk; ++j) f.k.data<uint16_t>()[f.k.offset({k0 + j, 0, 0})] = codec::float_to_bf16(float(j));
      k0 += lk;
    }
  }
  float at(int64_t hq, int64_t kb, int64_t t) const {
    const Tensor& s = f.scores.t;
    return f.scores.data<float>()[hq * s.strides[0] + kb * s.strides[1] + t];
  }
  Flat f;
};

TEST(BlockScores, HandComputedTwoBlocks) {
  // Lq 2, Lk 70, blk 64: block 0 = keys 0..63, block 1 = keys 64..69. Causal: query 0 sees
  // keys <= 68, query 1 sees keys <= 69.
  Shape sh{{2}, {70}, 2, 1, 8, 64, true};
  for (bool causal : {true, false}) {
    sh.causal = causal;
    IndexKeys ik(sh);
    HostTensor wide(DType::f32, {2, 3, 2});  // nblk_max 3 > nblk 2: block 2 must be -inf
    BlockScoresArgs a = ik.f.args(sh);
    a.scores = wide.t;
    block_scores(a);
    ik.f.scores.t = wide.t;
    EXPECT_EQ(ik.at(0, 0, 0), 63.f);
    EXPECT_EQ(ik.at(0, 0, 1), 63.f);
    EXPECT_EQ(ik.at(0, 1, 0), causal ? 68.f : 69.f);
    EXPECT_EQ(ik.at(0, 1, 1), 69.f);
    EXPECT_EQ(ik.at(1, 0, 0), 0.f);    // -min over keys 0..63
    EXPECT_EQ(ik.at(1, 1, 1), -64.f);  // -min over keys 64..69
    for (int64_t hq = 0; hq < 2; ++hq)
      for (int64_t t = 0; t < 2; ++t) EXPECT_EQ(ik.at(hq, 2, t), -kInf);
  }
}

TEST(BlockScores, CausalWithMoreQueriesThanKeys) {
  // Lq 5 > Lk 2: query i sees keys j <= i - 3, so queries 0..2 see nothing (-inf everywhere).
  Shape sh{{5}, {2}, 2, 1, 8, 64, true};
  IndexKeys ik(sh);
  block_scores(ik.f.args(sh));
  for (int64_t t = 0; t < 3; ++t) EXPECT_EQ(ik.at(0, 0, t), -kInf) << "query " << t;
  EXPECT_EQ(ik.at(0, 0, 3), 0.f);  // sees key 0
  EXPECT_EQ(ik.at(0, 0, 4), 1.f);  // sees keys 0, 1
  EXPECT_EQ(ik.at(1, 0, 3), 0.f);
}

TEST(BlockScores, ZeroLengthBatches) {
  // Batch 1 has no queries, batch 2 no keys (its queries get -inf in every block), batch 4 both.
  Shape sh{{3, 0, 4, 2, 0}, {100, 50, 0, 130, 0}, 4, 2, 64, 64, true};
  std::mt19937 rng(21);
  Flat f(sh);
  fill_half(f.q, rng);
  fill_half(f.k, rng);
  block_scores(f.args(sh));
  EXPECT_TRUE(matches(f.scores, reference(sh, f.q.t, f.k.t)));
  for (int64_t t = 3; t < 7; ++t)
    for (int64_t kb = 0; kb < sh.nblk_max(); ++kb) EXPECT_EQ(f.scores.data<float>()[kb * 9 + t], -kInf);
}

TEST(BlockScores, EmptyProblem) {
  Shape sh{{0, 0}, {0, 0}, 4, 2, 64, 128, true};
  Flat f(sh);
  EXPECT_NO_THROW(block_scores(f.args(sh)));
}

// ------------------------------- random vs reference -------------------------------

struct Named {
  const char* name;
  Shape shape;
  DType dtype;
};

TEST(BlockScores, RandomMatchesReference) {
  const Named cases[] = {
      {"G1 blk128 causal bf16", {{37, 1, 20}, {300, 129, 20}, 2, 2, 64, 128, true}, DType::bf16},
      {"G2 blk64 causal f16", {{65, 7}, {200, 70}, 4, 2, 64, 64, true}, DType::f16},
      {"G4 blk64 noncausal bf16", {{9, 30}, {150, 10}, 8, 2, 64, 64, false}, DType::bf16},
      {"G8 blk128 causal Lq>Lk", {{40}, {130}, 8, 1, 64, 128, true}, DType::bf16},
      {"G16 blk64 causal", {{12, 3}, {190, 64}, 16, 1, 32, 64, true}, DType::bf16},
      {"D128 blk128 Lq=Lk", {{50}, {50}, 2, 1, 128, 128, true}, DType::f16},
  };
  std::mt19937 rng(22);
  for (const Named& c : cases) {
    SCOPED_TRACE(c.name);
    Flat f(c.shape, c.dtype);
    fill_half(f.q, rng);
    fill_half(f.k, rng);
    block_scores(f.args(c.shape));
    EXPECT_TRUE(matches(f.scores, reference(c.shape, f.q.t, f.k.t)));
  }
}

// The fused indexer + top-K is, by definition, select_topk applied to block_scores' output.
// select_topk over f's scores (block_scores ran) with `rows` kv heads into `out`; returns its
// arguments.
TopKArgs select_on_scores(const Flat& f, const Shape& sh, int64_t rows, int topk, int sink, int local,
                          const HostTensor& out) {
  TopKArgs ta;
  ta.scores = f.scores.t;
  ta.cu_seqlens_q = f.cu_q.t;
  ta.kv.cu_seqlens_k = f.cu_k.t;
  ta.num_kv_heads = int(rows);
  ta.topk = topk;
  ta.sink_blocks = sink;
  ta.local_blocks = local;
  ta.kv_block_size = sh.blk;
  ta.q2k = out.t;
  select_topk(ta);
  return ta;
}

// block_topk's inputs over f (no q2k yet).
BlockTopKArgs fused_args(const Flat& f, const Shape& sh) {
  BlockTopKArgs fa;
  fa.q = f.q.t;
  fa.kv.k = f.k.t;
  fa.kv.cu_seqlens_k = f.cu_k.t;
  fa.cu_seqlens_q = f.cu_q.t;
  fa.kv_block_size = sh.blk;
  return fa;
}

TEST(BlockTopK, EqualsBlockScoresThenSelectTopK) {
  const Shape sh{{37, 0, 90}, {300, 10, 90}, 8, 2, 64, 64, true};
  std::mt19937 rng(31);
  Flat f(sh);
  fill_half(f.q, rng);
  fill_half(f.k, rng);
  block_scores(f.args(sh));
  for (int topk : {1, 3, 9}) {
    SCOPED_TRACE("topk " + std::to_string(topk));
    HostTensor want(DType::i32, {sh.hkv, sh.total_q(), topk}), got(DType::i32, {sh.hkv, sh.total_q(), topk});
    const TopKArgs ta = select_on_scores(f, sh, sh.hkv, topk, topk > 1 ? 1 : 0, topk > 2 ? 1 : 0, want);
    BlockTopKArgs fa = fused_args(f, sh);
    fa.topk = topk;
    fa.sink_blocks = ta.sink_blocks;
    fa.local_blocks = ta.local_blocks;
    fa.q2k = got.t;
    block_topk(fa);
    EXPECT_EQ(0, std::memcmp(want.data<int32_t>(), got.data<int32_t>(), want.bytes()));
  }
}

// Selection heads finer than k's heads (the serving geometry: 4 query heads on 1 key head, each
// its own selection, or 2 pairs): the ids of select_topk with that many kv heads on the same
// scores. Selection heads that do not divide q's heads are errors.
TEST(BlockTopK, SelectionHeadsFinerThanKeyHeads) {
  const Shape sh{{37, 0, 90}, {300, 10, 90}, 4, 1, 64, 64, true};
  std::mt19937 rng(33);
  Flat f(sh);
  fill_half(f.q, rng);
  fill_half(f.k, rng);
  block_scores(f.args(sh));
  BlockTopKArgs fa = fused_args(f, sh);
  fa.topk = 3;
  for (int64_t rows : {2, 4}) {
    SCOPED_TRACE("selection heads " + std::to_string(rows));
    HostTensor want(DType::i32, {rows, sh.total_q(), 3}), got(DType::i32, {rows, sh.total_q(), 3});
    select_on_scores(f, sh, rows, 3, 1, 1, want);
    fa.q2k = got.t;
    block_topk(fa);
    EXPECT_EQ(0, std::memcmp(want.data<int32_t>(), got.data<int32_t>(), want.bytes()));
  }
  for (int64_t rows : {3, 8}) {
    HostTensor bad(DType::i32, {rows, sh.total_q(), 3});
    fa.q2k = bad.t;
    expect_error([&] { block_topk(fa); },
                 "q2k: its first dim (selection heads) must be k's heads (1) or divide q's heads (4)");
  }
}

TEST(BlockTopK, RejectsBadKnobs) {
  const Shape sh{{4}, {4}, 2, 1, 64, 128, true};
  Flat f(sh);
  HostTensor ids(DType::i32, {1, 4, 2});
  BlockTopKArgs fa;
  fa.q = f.q.t;
  fa.kv.k = f.k.t;
  fa.kv.cu_seqlens_k = f.cu_k.t;
  fa.cu_seqlens_q = f.cu_q.t;
  fa.topk = 2;
  fa.sink_blocks = 2;
  fa.local_blocks = 1;
  fa.q2k = ids.t;
  try {
    block_topk(fa);
    ADD_FAILURE() << "expected msa::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sink_blocks + local_blocks: must be <= topk (2)"), std::string::npos) << e.what();
  }
  fa.sink_blocks = 1;
  fa.topk = 3;
  try {
    block_topk(fa);
    ADD_FAILURE() << "expected msa::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("q2k: last dim must equal topk (3)"), std::string::npos) << e.what();
  }
}

// A NaN key poisons the blocks of the queries that see it and nothing else.
TEST(BlockScores, NanKeyOnlyWhereVisible) {
  Shape sh{{4}, {100}, 2, 1, 64, 64, true};
  std::mt19937 rng(23);
  Flat f(sh);
  fill_half(f.q, rng);
  fill_half(f.k, rng);
  f.k.data<uint16_t>()[f.k.offset({98, 0, 5})] = 0x7fc0;  // key 98: seen by queries 2 and 3 only
  block_scores(f.args(sh));
  const std::vector<double> ref = reference(sh, f.q.t, f.k.t);
  EXPECT_TRUE(matches(f.scores, ref));
  for (int64_t hq = 0; hq < 2; ++hq) {
    const float* s = f.scores.data<float>() + (hq * 2 + 1) * 4;  // block 1 of head hq
    EXPECT_FALSE(std::isnan(s[0]));
    EXPECT_FALSE(std::isnan(s[1]));
    EXPECT_TRUE(std::isnan(s[2]));
    EXPECT_TRUE(std::isnan(s[3]));
  }
}

TEST(BlockScores, StridedQueriesEqualContiguous) {
  Shape sh{{20}, {150}, 4, 2, 64, 64, true};
  std::mt19937 rng(24);
  Flat f(sh);
  fill_half(f.q, rng);
  fill_half(f.k, rng);
  HostTensor qs(DType::bf16, {20, 4, 64}, {4 * 80, 80, 1});  // rows padded to 160 bytes
  for (int64_t t = 0; t < 20; ++t)
    for (int64_t h = 0; h < 4; ++h)
      std::memcpy(&qs.data<uint16_t>()[qs.offset({t, h, 0})], &f.q.data<uint16_t>()[f.q.offset({t, h, 0})], 128);
  block_scores(f.args(sh, qs.t, f.k.t));
  EXPECT_TRUE(matches(f.scores, reference(sh, f.q.t, f.k.t)));
}

// ------------------------------- quantized inputs -------------------------------

// fp8 q and k, each with no scale, a per-tensor, per-token or per-token-head scale.
TEST(BlockScores, Fp8EachScaleGranularity) {
  Shape sh{{10, 17}, {90, 140}, 4, 2, 64, 64, true};
  const int64_t T = sh.total_q(), TK = sh.total_k();
  std::mt19937 rng(25);
  std::uniform_real_distribution<float> sc(0.01f, 2.f);
  auto make_scale = [&](int kind, int64_t tokens, int64_t heads) {
    std::vector<int64_t> shape = kind == 1 ? std::vector<int64_t>{1}
                                 : kind == 2 ? std::vector<int64_t>{tokens}
                                             : std::vector<int64_t>{tokens, heads};
    HostTensor s(DType::f32, shape);
    for (int64_t i = 0; i < s.t.numel(); ++i) s.data<float>()[i] = sc(rng);
    return s;
  };
  for (int qk = 0; qk < 4; ++qk)
    for (int kk = 0; kk < 4; ++kk) {
      SCOPED_TRACE("q scale kind " + std::to_string(qk) + ", k scale kind " + std::to_string(kk));
      Flat f(sh, DType::fp8_e4m3);
      fill_bytes(f.q, rng, 0x00, 0xff);
      fill_bytes(f.k, rng, 0x00, 0xff);
      HostTensor qs = make_scale(qk, T, sh.hq), ks = make_scale(kk, TK, sh.hkv);
      const QTensor q = qk ? QTensor(f.q.t, qs.t) : QTensor(f.q.t);
      const QTensor k = kk ? QTensor(f.k.t, ks.t) : QTensor(f.k.t);
      block_scores(f.args(sh, q, k));
      ASSERT_TRUE(matches(f.scores, reference(sh, q, k)));
    }
}

// A negative FP8 scale is an input error (the GPU factors the scales out of the block max).
// A negative, NaN or infinite FP8 scale is an error (NaN and infinity used to pass and turn the
// scores they touch into NaN), for k's and for q's.
TEST(BlockScores, Fp8NegativeOrNonFiniteScaleIsAnError) {
  Shape sh{{4}, {40}, 2, 1, 64, 64, true};
  Flat f(sh, DType::fp8_e4m3);
  std::mt19937 rng(26);
  fill_bytes(f.q, rng, 0x00, 0xff);
  fill_bytes(f.k, rng, 0x00, 0xff);
  for (const float bad : {-0.5f, std::numeric_limits<float>::quiet_NaN(),
                          std::numeric_limits<float>::infinity()}) {
    HostTensor ks(DType::f32, {sh.total_k()}), qs(DType::f32, {sh.total_q()});
    for (int64_t i = 0; i < sh.total_k(); ++i) ks.data<float>()[i] = i == 7 ? bad : 1.f;
    for (int64_t i = 0; i < sh.total_q(); ++i) qs.data<float>()[i] = i == 2 ? bad : 1.f;
    expect_error([&] { block_scores(f.args(sh, f.q.t, QTensor(f.k.t, ks.t))); },
                 "k.scale: FP8 scales must be finite and >= 0, got ");
    expect_error([&] { block_scores(f.args(sh, QTensor(f.q.t, qs.t), QTensor(f.k.t))); },
                 "q.scale: FP8 scales must be finite and >= 0, got ");
  }
}

// NVFP4 (e4m3 scale per 16 times a global scale) and MXFP4 (e8m0 scale per 32), also mixed.
TEST(BlockScores, Fp4Formats) {
  Shape sh{{9, 14}, {80, 200}, 4, 1, 64, 64, true};
  std::mt19937 rng(26);
  for (int qnv = 0; qnv < 2; ++qnv)
    for (int knv = 0; knv < 2; ++knv) {
      SCOPED_TRACE(std::string("q ") + (qnv ? "nvfp4" : "mxfp4") + ", k " + (knv ? "nvfp4" : "mxfp4"));
      Flat f(sh, DType::fp4x2);
      fill_bytes(f.q, rng, 0x00, 0xff);
      fill_bytes(f.k, rng, 0x00, 0xff);
      auto make_scale = [&](bool nv, int64_t tokens, int64_t heads) {
        HostTensor s(nv ? DType::fp8_e4m3 : DType::e8m0, {tokens, heads, sh.dim / (nv ? 16 : 32)});
        nv ? fill_bytes(s, rng, 0x20, 0x48) : fill_bytes(s, rng, 120, 132);
        return s;
      };
      HostTensor qs = make_scale(qnv, sh.total_q(), sh.hq), ks = make_scale(knv, sh.total_k(), sh.hkv);
      const QTensor q(f.q.t, qs.t, 0.75f), k(f.k.t, ks.t, 1.25f);
      block_scores(f.args(sh, q, k));
      ASSERT_TRUE(matches(f.scores, reference(sh, q, k)));
    }
}

// ------------------------------- paged keys -------------------------------

// The flat keys copied into a shuffled page pool (unused slots and pages stay NaN-poisoned; table
// columns past each batch's pages hold invalid ids that must never be read).
struct Paged {
  Paged(const HostTensor& kflat, const std::vector<int32_t>& lk, int64_t ps, KVLayout layout,
        bool with_seqused, std::mt19937& rng)
      : pool(kflat.t.dtype, pool_shape(kflat, lk, ps, layout)),
        table(DType::i32, {int64_t(lk.size()), max_pages(lk, ps) + (with_seqused ? 1 : 0)}),
        seqused(i32_tensor(lk)),
        layout(layout) {
    const int64_t P = pool.t.shape[0], H = kflat.t.shape[1], rowb = kflat.t.shape[2] * dtype_size(kflat.t.dtype);
    std::vector<int32_t> ids(P);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    const int64_t cols = table.t.shape[1];
    int64_t next = 0, k0 = 0;
    for (size_t b = 0; b < lk.size(); ++b) {
      const int64_t used = (lk[b] + ps - 1) / ps;
      for (int64_t c = 0; c < cols; ++c)
        table.data<int32_t>()[b * cols + c] = c < used ? ids[next++] : (c % 2 ? INT_MAX : -123456);
      for (int64_t j = 0; j < lk[b]; ++j)
        for (int64_t h = 0; h < H; ++h) {
          const int64_t page = table.data<int32_t>()[b * cols + j / ps], slot = j % ps;
          const int64_t dst = layout == KVLayout::paged_nhd ? pool.offset({page, slot, h, 0})
                                                            : pool.offset({page, h, slot, 0});
          std::memcpy(pool.data<uint8_t>() + dst * dtype_size(pool.t.dtype),
                      kflat.data<uint8_t>() + kflat.offset({k0 + j, h, 0}) * dtype_size(pool.t.dtype), rowb);
        }
      k0 += lk[b];
    }
  }
  static int64_t max_pages(const std::vector<int32_t>& lk, int64_t ps) {
    int64_t m = 0;
    for (int32_t l : lk) m = std::max<int64_t>(m, (l + ps - 1) / ps);
    return m;
  }
  static std::vector<int64_t> pool_shape(const HostTensor& k, const std::vector<int32_t>& lk,
                                         int64_t ps, KVLayout layout) {
    int64_t pages = 2;  // two spare pages nobody references
    for (int32_t l : lk) pages += (l + ps - 1) / ps;
    const int64_t H = k.t.shape[1], D = k.t.shape[2];
    return layout == KVLayout::paged_nhd ? std::vector<int64_t>{pages, ps, H, D}
                                         : std::vector<int64_t>{pages, H, ps, D};
  }
  KVCache cache(const QTensor& k_scale_source, bool with_seqused) const {
    KVCache kv;
    kv.k = QTensor(pool.t, k_scale_source.scale);
    kv.layout = layout;
    kv.page_table = table.t;
    if (with_seqused) kv.seqused_k = seqused.t;
    return kv;
  }
  HostTensor pool, table, seqused;
  KVLayout layout;
};

TEST(BlockScores, PagedEqualsFlat) {
  Shape sh{{5, 33, 1}, {40, 300, 129}, 8, 2, 64, 64, true};
  std::mt19937 rng(27);
  for (int blk : {64, 128}) {
    sh.blk = blk;
    Flat f(sh);
    fill_half(f.q, rng);
    fill_half(f.k, rng);
    block_scores(f.args(sh));
    ASSERT_TRUE(matches(f.scores, reference(sh, f.q.t, f.k.t)));
    for (KVLayout layout : {KVLayout::paged_nhd, KVLayout::paged_hnd})
      for (int64_t ps : {16, 64, 256}) {
        SCOPED_TRACE(std::string(kv_layout_name(layout)) + " page " + std::to_string(ps) + " blk " +
                     std::to_string(blk));
        Paged p(f.k, sh.lk, ps, layout, true, rng);
        HostTensor paged_scores(DType::f32, {sh.hq, sh.nblk_max(), sh.total_q()});
        BlockScoresArgs a = f.args(sh);
        a.kv = p.cache(QTensor(f.k.t), true);
        a.scores = paged_scores.t;
        block_scores(a);
        EXPECT_EQ(std::memcmp(paged_scores.data<float>(), f.scores.data<float>(), f.scores.bytes()), 0);
      }
  }
}

// Without seqused_k every batch has max_pages * page_size keys; fp8 pages with a per-tensor scale.
TEST(BlockScores, PagedFp8WithoutSeqused) {
  Shape sh{{7, 40}, {96, 96}, 4, 1, 64, 64, true};
  std::mt19937 rng(28);
  Flat f(sh, DType::fp8_e4m3);
  fill_bytes(f.q, rng, 0x00, 0xff);
  fill_bytes(f.k, rng, 0x00, 0xff);
  HostTensor qs(DType::f32, {1}), ks(DType::f32, {1});
  qs.data<float>()[0] = 0.5f;
  ks.data<float>()[0] = 1.75f;
  const QTensor q(f.q.t, qs.t), k(f.k.t, ks.t);
  block_scores(f.args(sh, q, k));
  ASSERT_TRUE(matches(f.scores, reference(sh, q, k)));
  Paged p(f.k, sh.lk, 32, KVLayout::paged_nhd, false, rng);
  HostTensor paged_scores(DType::f32, {sh.hq, sh.nblk_max(), sh.total_q()});
  BlockScoresArgs a = f.args(sh, q, k);
  a.kv = p.cache(k, false);
  a.scores = paged_scores.t;
  block_scores(a);
  EXPECT_EQ(std::memcmp(paged_scores.data<float>(), f.scores.data<float>(), f.scores.bytes()), 0);
}

// ------------------------------- argument errors -------------------------------

TEST(BlockScoresErrors, MessagesNameArgumentAndRule) {
  Shape sh{{4, 3}, {100, 60}, 4, 2, 64, 64, true};
  std::mt19937 rng(29);
  Flat f(sh);
  fill_half(f.q, rng);
  fill_half(f.k, rng);
  ASSERT_NO_THROW(block_scores(f.args(sh)));

  HostTensor q32(DType::f32, {7, 4, 64});
  expect_error([&] { block_scores(f.args(sh, q32.t, f.k.t)); },
               "q: dtype must be bf16, f16, fp8_e4m3 or fp4x2, got f32");
  HostTensor k16(DType::f16, {160, 2, 64});
  expect_error([&] { block_scores(f.args(sh, f.q.t, k16.t)); }, "k: dtype must equal q's (bf16), got f16");

  const BlockScoresArgs valid = f.args(sh);
  const auto scores = [](const BlockScoresArgs& a) { block_scores(a); };
  HostTensor few_blocks(DType::f32, {4, 1, 7});
  expect_arg_error(scores, valid, [&](BlockScoresArgs& a) { a.scores = few_blocks.t; },
                   "scores: nblk_max (dim 1) must be >= the largest block count");
  HostTensor wrong_heads(DType::f32, {2, 2, 7});
  expect_arg_error(scores, valid, [&](BlockScoresArgs& a) { a.scores = wrong_heads.t; },
                   "scores: shape must be [Hq, nblk_max, total_q] = [4, *, 7]");
  HostTensor bad_cu = i32_tensor({0, 5, 4});
  expect_arg_error(scores, valid, [&](BlockScoresArgs& a) { a.cu_seqlens_q = bad_cu.t; },
                   "cu_seqlens_q: must be non-decreasing");
  HostTensor short_cu = i32_tensor({0, 100, 150});
  expect_arg_error(scores, valid, [&](BlockScoresArgs& a) { a.kv.cu_seqlens_k = short_cu.t; },
                   "cu_seqlens_k: last entry must equal the token count 160");

  HostTensor q_pad(DType::bf16, {7, 4, 64}, {4 * 68, 68, 1});  // 136-byte rows
  expect_error([&] { block_scores(f.args(sh, q_pad.t, f.k.t)); },
               "q: stride of dim 1 (68 elements = 136 bytes) must be a multiple of 16 bytes");

  expect_arg_error(scores, valid, [](BlockScoresArgs& a) { a.kv_block_size = 32; },
                   "kv_block_size: must be 64 or 128, got 32");

  std::mt19937 prng(30);
  Paged p(f.k, sh.lk, 16, KVLayout::paged_nhd, true, prng);
  BlockScoresArgs a = f.args(sh);
  a.kv = p.cache(QTensor(f.k.t), true);
  p.table.data<int32_t>()[p.table.t.shape[1] + 2] = 1000;  // batch 1, column 2
  expect_error([&] { block_scores(a); },
               "page_table: page id 1000 out of range [0, 13) at (batch 1, column 2)");
}

}  // namespace
}  // namespace msa::test
