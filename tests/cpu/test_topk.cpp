// CPU top-K block selection (docs/semantics.md, Top-K selection; include/msa/topk.h) against
// hand-computed rows and a reference that tests visibility key by key and picks the remaining
// blocks greedily, one scan each.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "support/expect_error.h"
#include "support/host_tensor.h"
#include "support/topk_args.h"
#include "msa/msa.h"

namespace msa::test {
namespace {

constexpr int32_t kUnwritten = 0x7b7b7b7b;

struct Problem {
  std::vector<int32_t> lq, lk;
  int64_t hq = 2, hkv = 1;
  int blk = 64;
  bool causal = true;
  int topk = 4, sink = 1, local = 1;
  int64_t extra_blocks = 1;  // scores columns past max_b nblk_b (must never be chosen)

  int64_t total_q() const { return std::accumulate(lq.begin(), lq.end(), int64_t(0)); }
  int64_t nblk(size_t b) const { return (lk[b] + blk - 1) / blk; }
  int64_t nblk_max() const {
    int64_t m = 0;
    for (size_t b = 0; b < lk.size(); ++b) m = std::max(m, nblk(b));
    return m + extra_blocks;
  }
};

// Inputs and the (poisoned) output of one select_topk call on a flat cache.
struct Selection {
  explicit Selection(const Problem& p)
      : scores(DType::f32, {p.hq, p.nblk_max(), p.total_q()}),
        cu_q(i32_tensor(cumulative(p.lq))),
        cu_k(i32_tensor(cumulative(p.lk))),
        q2k(DType::i32, {p.hkv, p.total_q(), p.topk}) {
    std::memset(q2k.data<int32_t>(), 0x7b, q2k.bytes());
  }
  float& score(int64_t hq, int64_t kb, int64_t t) {
    return scores.data<float>()[scores.offset({hq, kb, t})];
  }
  int32_t id(int64_t h, int64_t t, int64_t k) const { return q2k.data<int32_t>()[q2k.offset({h, t, k})]; }
  std::vector<int32_t> row(int64_t h, int64_t t) const {
    std::vector<int32_t> r(q2k.t.shape[2]);
    for (size_t k = 0; k < r.size(); ++k) r[k] = id(h, t, int64_t(k));
    return r;
  }
  TopKArgs args(const Problem& p) const { return topk_args(p, scores.t, cu_q.t, cu_k.t, q2k.t); }
  HostTensor scores, cu_q, cu_k, q2k;
};

// ---------------------------------- reference ----------------------------------

// q2k by the definition. Visibility: block kb is visible to query i if one of its keys j is
// (j <= i + Lk - Lq when causal). Forced: sinks and the local window ending at the block of the
// last visible key, if visible. Then greedily the best remaining visible block, scanning ids
// upward and replacing only on a strictly better score (NaN lowest), until topk.
std::vector<int32_t> reference(const Problem& p, Selection& r) {
  const int64_t T = p.total_q(), G = p.hq / p.hkv;
  std::vector<int32_t> out(p.hkv * T * p.topk, -1);
  int64_t t = 0;
  for (size_t b = 0; b < p.lq.size(); ++b)
    for (int64_t i = 0; i < p.lq[b]; ++i, ++t) {
      const int64_t lq = p.lq[b], lk = p.lk[b], nb = p.nblk(b);
      std::vector<bool> visible(nb, false);
      int64_t last_key = -1;
      for (int64_t j = 0; j < lk; ++j)
        if (!p.causal || j <= i + lk - lq) {
          visible[j / p.blk] = true;
          last_key = j;
        }
      for (int64_t h = 0; h < p.hkv; ++h) {
        std::vector<bool> chosen(nb, false);
        for (int64_t kb = 0; kb < nb; ++kb) {
          const bool sink = kb < p.sink;
          const bool local = last_key >= 0 && kb <= last_key / p.blk && kb > last_key / p.blk - p.local;
          chosen[kb] = visible[kb] && (sink || local);
        }
        auto count = [&] { return std::count(chosen.begin(), chosen.end(), true); };
        while (count() < p.topk) {
          int64_t best = -1;
          double best_s = 0;
          for (int64_t kb = 0; kb < nb; ++kb) {
            if (!visible[kb] || chosen[kb]) continue;
            double s = NAN;
            for (int64_t g = 0; g < G; ++g) {
              const double v = r.score(h * G + g, kb, t);
              if (!std::isnan(v) && (std::isnan(s) || v > s)) s = v;
            }
            const bool better = best < 0 || (!std::isnan(s) && (std::isnan(best_s) || s > best_s));
            if (better) {
              best = kb;
              best_s = s;
            }
          }
          if (best < 0) break;
          chosen[best] = true;
        }
        int64_t k = 0;
        for (int64_t kb = 0; kb < nb; ++kb)
          if (chosen[kb]) out[(h * T + t) * p.topk + k++] = int32_t(kb);
      }
    }
  return out;
}

::testing::AssertionResult matches(const Selection& r, const std::vector<int32_t>& ref) {
  const int32_t* q = r.q2k.data<int32_t>();
  for (size_t i = 0; i < ref.size(); ++i)
    if (q[i] != ref[i])
      return ::testing::AssertionFailure() << "q2k entry " << i << " (head " << i / (r.q2k.t.shape[1] * r.q2k.t.shape[2])
                                           << ", token " << (i / r.q2k.t.shape[2]) % r.q2k.t.shape[1] << ", slot "
                                           << i % r.q2k.t.shape[2] << "): got " << q[i] << ", want " << ref[i];
  return ::testing::AssertionSuccess();
}

// Fills scores with values from `draw`; entries of invisible blocks and of blocks past nblk_b get
// +1e30 so that choosing by score instead of visibility shows.
template <typename Draw>
void fill_scores(const Problem& p, Selection& r, Draw draw) {
  int64_t t = 0;
  for (size_t b = 0; b < p.lq.size(); ++b)
    for (int64_t i = 0; i < p.lq[b]; ++i, ++t)
      for (int64_t hq = 0; hq < p.hq; ++hq)
        for (int64_t kb = 0; kb < p.nblk_max(); ++kb) {
          const int64_t first_key = kb * p.blk;
          const bool visible = kb < p.nblk(b) && (!p.causal || first_key <= i + p.lk[b] - p.lq[b]);
          r.score(hq, kb, t) = visible ? draw() : 1e30f;
        }
}

std::vector<int32_t> ids(std::initializer_list<int32_t> v) { return v; }

// ---------------------------------- hand-computed ----------------------------------

TEST(TopK, HandComputedNonCausal) {
  // One query, 6 blocks, topk 3: sink 0 and local 5 are forced, then block 3 (score 7).
  Problem p{{1}, {6 * 64}, 1, 1, 64, false, 3, 1, 1};
  Selection r(p);
  const float s[6] = {0.1f, 5, 3, 7, 2, 0.5f};
  for (int kb = 0; kb < 6; ++kb) r.score(0, kb, 0) = s[kb];
  r.score(0, 6, 0) = 1e30f;  // past nblk: never chosen
  select_topk(r.args(p));
  EXPECT_EQ(r.row(0, 0), ids({0, 3, 5}));
}

TEST(TopK, HandComputedCausal) {
  // Lq = Lk = 300, blk 64: query i sees keys <= i. Query 0 sees block 0, query 70 blocks 0..1,
  // query 200 blocks 0..3 (forced 0 and 3, then block 2 beats block 1).
  Problem p{{300}, {300}, 1, 1, 64, true, 3, 1, 1};
  Selection r(p);
  fill_scores(p, r, [] { return 1.f; });
  r.score(0, 1, 200) = 5;
  r.score(0, 2, 200) = 6;
  select_topk(r.args(p));
  EXPECT_EQ(r.row(0, 0), ids({0, -1, -1}));
  EXPECT_EQ(r.row(0, 70), ids({0, 1, -1}));
  EXPECT_EQ(r.row(0, 200), ids({0, 2, 3}));
  EXPECT_TRUE(matches(r, reference(p, r)));
}

TEST(TopK, TiesGoToTheLowerBlockId) {
  Problem p{{1}, {6 * 64}, 1, 1, 64, false, 3, 0, 0};
  Selection r(p);
  const float s[6] = {1, 2, 2, 2, 2, 1};
  for (int kb = 0; kb < 6; ++kb) r.score(0, kb, 0) = s[kb];
  r.score(0, 6, 0) = 1e30f;
  select_topk(r.args(p));
  EXPECT_EQ(r.row(0, 0), ids({1, 2, 3}));
  p.local = 1;  // block 5 forced, then the two lowest of the tied 2s
  select_topk(r.args(p));
  EXPECT_EQ(r.row(0, 0), ids({1, 2, 5}));
}

// -0.0 and +0.0 are equal scores: the lower block id wins whichever sign it carries.
TEST(TopK, SignedZerosAreTies) {
  Problem p{{1}, {5 * 64}, 1, 1, 64, false, 2, 0, 0};
  Selection r(p);
  const float s[5] = {-1, 0.f, -0.f, 0.f, -0.f};
  for (int kb = 0; kb < 5; ++kb) r.score(0, kb, 0) = s[kb];
  select_topk(r.args(p));
  EXPECT_EQ(r.row(0, 0), ids({1, 2}));
  r.score(0, 1, 0) = -0.f;
  r.score(0, 2, 0) = 0.f;
  select_topk(r.args(p));
  EXPECT_EQ(r.row(0, 0), ids({1, 2}));
}

TEST(TopK, TopkAboveVisibleBlocksTakesAllVisible) {
  // Lk 150 (3 blocks, the last partial), topk 8: every visible block, then -1.
  Problem p{{2}, {150}, 2, 1, 64, true, 8, 1, 1};
  Selection r(p);
  fill_scores(p, r, [] { return -3.f; });
  select_topk(r.args(p));
  EXPECT_EQ(r.row(0, 0), ids({0, 1, 2, -1, -1, -1, -1, -1}));  // query 0 sees keys <= 148
  EXPECT_EQ(r.row(0, 1), ids({0, 1, 2, -1, -1, -1, -1, -1}));
}

TEST(TopK, ForcedBlocksWinOverHigherScores) {
  // 10 blocks, sink 2, local 2, topk 5: blocks 0, 1, 8, 9 score lowest (even -inf) yet are
  // chosen; the free slot goes to the best other block (6).
  Problem p{{1}, {10 * 64}, 1, 1, 64, false, 5, 2, 2};
  Selection r(p);
  const float s[10] = {-INFINITY, -1e30f, 1, 2, 3, 4, 9, 5, -INFINITY, -1e30f};
  for (int kb = 0; kb < 10; ++kb) r.score(0, kb, 0) = s[kb];
  r.score(0, 10, 0) = 1e30f;
  select_topk(r.args(p));
  EXPECT_EQ(r.row(0, 0), ids({0, 1, 6, 8, 9}));
}

TEST(TopK, ForcedBlocksOnlyIfVisible) {
  // Causal, Lq = Lk = 200: query 10 sees only block 0; sink 3 and local 3 add nothing invisible.
  // Query 130 sees blocks 0..2: sinks 0..2 and local 0..2 coincide.
  Problem p{{200}, {200}, 1, 1, 64, true, 6, 3, 3};
  Selection r(p);
  fill_scores(p, r, [] { return 0.f; });
  select_topk(r.args(p));
  EXPECT_EQ(r.row(0, 10), ids({0, -1, -1, -1, -1, -1}));
  EXPECT_EQ(r.row(0, 130), ids({0, 1, 2, -1, -1, -1}));
}

TEST(TopK, LocalWindowEndsAtTheLastVisibleKeysBlock) {
  // Lq 2, Lk 260, blk 128 (3 blocks): query 0 sees keys <= 258 (block 2), so local 2 forces
  // blocks 1 and 2 although block 0's score is higher and sink is 0.
  Problem p{{2}, {260}, 1, 1, 128, true, 2, 0, 2};
  Selection r(p);
  fill_scores(p, r, [] { return 0.f; });
  r.score(0, 0, 0) = 100;
  select_topk(r.args(p));
  EXPECT_EQ(r.row(0, 0), ids({1, 2}));
}

TEST(TopK, GroupScoreIsTheMaxOverTheGroupsHeads) {
  // G = 4: block 3 wins because one head scores it 10; kv head 1's heads prefer block 2.
  Problem p{{1}, {5 * 64}, 8, 2, 64, false, 1, 0, 0};
  Selection r(p);
  fill_scores(p, r, [] { return 1.f; });
  r.score(2, 3, 0) = 10;  // kv head 0 (heads 0..3)
  r.score(5, 2, 0) = 4;   // kv head 1 (heads 4..7)
  r.score(6, 4, 0) = 3;
  select_topk(r.args(p));
  EXPECT_EQ(r.row(0, 0), ids({3}));
  EXPECT_EQ(r.row(1, 0), ids({2}));
}

TEST(TopK, NanScoresRankBelowEveryNumber) {
  Problem p{{1}, {4 * 64}, 2, 1, 64, false, 2, 0, 0};
  Selection r(p);
  const float head0[4] = {NAN, 1, NAN, -INFINITY}, head1[4] = {NAN, NAN, NAN, NAN};
  for (int kb = 0; kb < 4; ++kb) {
    r.score(0, kb, 0) = head0[kb];
    r.score(1, kb, 0) = head1[kb];
  }
  r.score(0, 4, 0) = r.score(1, 4, 0) = 1e30f;
  select_topk(r.args(p));
  EXPECT_EQ(r.row(0, 0), ids({1, 3}));  // group NaN only where both heads are NaN
  p.topk = 3;
  Selection r3(p);
  std::memcpy(r3.scores.data<float>(), r.scores.data<float>(), r.scores.bytes());
  select_topk(r3.args(p));
  EXPECT_EQ(r3.row(0, 0), ids({0, 1, 3}));  // tied NaNs: the lower id
}

TEST(TopK, ZeroLengthsAndMoreQueriesThanKeys) {
  // Batch 0: Lq 5 > Lk 2 (queries 0..2 see nothing); batch 1: Lk 0; batch 2: Lq 0.
  Problem p{{5, 3, 0, 2}, {2, 0, 70, 200}, 2, 2, 64, true, 3, 1, 1};
  Selection r(p);
  std::mt19937 rng(31);
  std::uniform_real_distribution<float> u(-1, 1);
  fill_scores(p, r, [&] { return u(rng); });
  select_topk(r.args(p));
  for (int64_t h = 0; h < 2; ++h) {
    for (int64_t t : {0, 1, 2, 5, 6, 7}) EXPECT_EQ(r.row(h, t), ids({-1, -1, -1})) << "token " << t;
    EXPECT_EQ(r.row(h, 3), ids({0, -1, -1}));
  }
  EXPECT_TRUE(matches(r, reference(p, r)));
}

TEST(TopK, EmptyProblem) {
  Problem p{{}, {}, 2, 1, 64, true, 2, 1, 1, 0};
  Selection r(p);
  EXPECT_NO_THROW(select_topk(r.args(p)));
}

// ---------------------------------- random vs reference ----------------------------------

TEST(TopK, RandomMatchesReference) {
  struct Named {
    const char* name;
    Problem p;
    int levels;  // 0: continuous scores; n: integer scores in [0, n) (many ties)
  };
  const Named cases[] = {
      {"G1 causal blk64", {{40, 3}, {700, 64}, 1, 1, 64, true, 4, 1, 1}, 0},
      {"G2 noncausal blk128 ties", {{9, 17}, {1000, 129}, 4, 2, 128, false, 3, 1, 2}, 3},
      {"G4 causal Lq>Lk", {{300}, {90}, 8, 2, 64, true, 5, 2, 1}, 0},
      {"G8 causal ties sink0", {{33, 1}, {900, 1}, 8, 1, 64, true, 6, 0, 3}, 2},
      {"G16 noncausal topk>nblk", {{7}, {200}, 16, 1, 64, false, 9, 1, 1}, 0},
      {"G16 causal local0", {{64}, {2000}, 16, 1, 128, true, 8, 1, 0}, 4},
  };
  std::mt19937 rng(32);
  for (const Named& c : cases) {
    SCOPED_TRACE(c.name);
    Selection r(c.p);
    std::uniform_real_distribution<float> u(-5, 5);
    std::uniform_int_distribution<int> lv(0, std::max(0, c.levels - 1));
    fill_scores(c.p, r, [&] { return c.levels ? float(lv(rng)) : u(rng); });
    select_topk(r.args(c.p));
    EXPECT_TRUE(matches(r, reference(c.p, r)));
  }
}

// Lengths from a paged cache's seqused_k select exactly as the same lengths of a flat cache.
TEST(TopK, PagedLengthsEqualFlat) {
  Problem p{{20, 6}, {333, 100}, 4, 2, 64, true, 3, 1, 1};
  Selection r(p);
  std::mt19937 rng(33);
  std::uniform_real_distribution<float> u(-5, 5);
  fill_scores(p, r, [&] { return u(rng); });
  select_topk(r.args(p));
  ASSERT_TRUE(matches(r, reference(p, r)));
  const std::vector<int32_t> flat(r.q2k.data<int32_t>(), r.q2k.data<int32_t>() + r.q2k.t.numel());

  HostTensor pool(DType::bf16, {12, 32, 2, 8}), table(DType::i32, {2, 11}), used = i32_tensor(p.lk);
  for (int i = 0; i < 22; ++i) table.data<int32_t>()[i] = i % 12;
  TopKArgs a = r.args(p);
  a.kv = KVCache();
  a.kv.k = pool.t;
  a.kv.layout = KVLayout::paged_nhd;
  a.kv.page_table = table.t;
  a.kv.seqused_k = used.t;
  std::memset(r.q2k.data<int32_t>(), 0x7b, r.q2k.bytes());
  select_topk(a);
  EXPECT_TRUE(std::equal(flat.begin(), flat.end(), r.q2k.data<int32_t>()));
}

TEST(TopK, EveryOutputEntryWritten) {
  Problem p{{13, 0, 4}, {100, 5, 0}, 4, 4, 64, true, 7, 1, 1};
  Selection r(p);
  fill_scores(p, r, [] { return 2.f; });
  select_topk(r.args(p));
  for (int64_t i = 0; i < r.q2k.t.numel(); ++i) ASSERT_NE(r.q2k.data<int32_t>()[i], kUnwritten) << i;
}

// ---------------------------------- argument errors ----------------------------------

TEST(TopKErrors, MessagesNameArgumentAndRule) {
  Problem p{{4, 3}, {100, 60}, 4, 2, 64, true, 3, 1, 1};
  Selection r(p);
  fill_scores(p, r, [] { return 1.f; });
  ASSERT_NO_THROW(select_topk(r.args(p)));

  const TopKArgs valid = r.args(p);
  const auto topk = [](const TopKArgs& a) { select_topk(a); };
  HostTensor s16(DType::f16, {4, 3, 7});
  expect_arg_error(topk, valid, [&](TopKArgs& a) { a.scores = s16.t; }, "scores: dtype must be f32, got f16");
  HostTensor few(DType::f32, {4, 1, 7});
  expect_arg_error(topk, valid, [&](TopKArgs& a) { a.scores = few.t; },
                   "scores: nblk_max (dim 1) must be >= the largest block count");
  expect_arg_error(topk, valid, [](TopKArgs& a) { a.num_kv_heads = 3; },
                   "num_kv_heads: must be > 0 and divide the query heads of scores (4), got 3");
  expect_arg_error(topk, valid, [](TopKArgs& a) { a.sink_blocks = a.local_blocks = 2; },
                   "sink_blocks + local_blocks: must be <= topk (3), got 2 + 2");
  expect_arg_error(topk, valid, [](TopKArgs& a) { a.topk = 5; }, "q2k: last dim must equal topk (5)");
  HostTensor q2k_heads(DType::i32, {1, 7, 3});
  expect_arg_error(topk, valid, [&](TopKArgs& a) { a.q2k = q2k_heads.t; },
                   "q2k: shape must be [Hkv, total_q, topk] = [2, 7, *]");
  expect_arg_error(topk, valid, [](TopKArgs& a) { a.kv_block_size = 256; }, "kv_block_size: must be 64 or 128, got 256");
  HostTensor bad_cu = i32_tensor({0, 5, 4});
  expect_arg_error(topk, valid, [&](TopKArgs& a) { a.cu_seqlens_q = bad_cu.t; }, "cu_seqlens_q: must be non-decreasing");
  HostTensor bad_k = i32_tensor({1, 100, 160});
  expect_arg_error(topk, valid, [&](TopKArgs& a) { a.kv.cu_seqlens_k = bad_k.t; }, "cu_seqlens_k: must start at 0, got 1");
  // Without k, the lengths' total is cu_seqlens_k's last entry. A reversed view (stride -1) of
  // exactly 3 ints: its entry [2] read as if contiguous lies 2 ints past the allocation (found by
  // fuzzing; test-asan reports that read if it comes back).
  std::vector<int32_t> reversed = {160, 100, 0};
  const Tensor cu_reversed(reversed.data() + 2, DType::i32, std::vector<int64_t>{3},
                           std::vector<int64_t>{-1});
  expect_arg_error(topk, valid, [&](TopKArgs& a) { a.kv.cu_seqlens_k = cu_reversed; },
                   "cu_seqlens_k: must be contiguous");
}

}  // namespace
}  // namespace msa::test
