// workloads/patterns.h: the tok/blk selections of bench/CASES.md (forced blocks, visibility, order,
// padding, sharing within a query block, fixed seeds) and the attended/visible pair counts.
#include <gtest/gtest.h>

#include <set>

#include "workloads/patterns.h"

namespace msa::test {
namespace {

using bench::Pattern;

bench::SelectionShape one_batch(int64_t lq, int64_t lk, int hkv, int topk, int blk, bool causal) {
  bench::SelectionShape s;
  s.cu_seqlens_q = {0, lq};
  s.cu_seqlens_k = {0, lk};
  s.num_kv_heads = hkv;
  s.topk = topk;
  s.kv_block_size = blk;
  s.causal = causal;
  s.seed = 7;
  return s;
}

const int32_t* row(const std::vector<int32_t>& q2k, const bench::SelectionShape& s, int h, int64_t t) {
  return q2k.data() + (h * s.cu_seqlens_q.back() + t) * s.topk;
}

// Every tok row: ascending distinct visible ids, then -1; min(topk, visible blocks) ids; block 0,
// the diagonal block and the one before it always among them.
TEST(BenchPatterns, TokRowsFollowTheRules) {
  for (bool causal : {true, false}) {
    const auto s = one_batch(1000, 1000, 2, 5, 128, causal);
    const auto q2k = bench::make_selection(Pattern::tok, s);
    for (int h = 0; h < 2; ++h) {
      for (int64_t i = 0; i < 1000; ++i) {
        const int32_t* r = row(q2k, s, h, i);
        const int64_t nvis = causal ? i / 128 + 1 : 8;
        const int64_t diag = i / 128;
        const int64_t n = std::min<int64_t>(5, nvis);
        std::set<int32_t> ids;
        for (int j = 0; j < s.topk; ++j) {
          if (j >= n) {
            EXPECT_EQ(r[j], -1) << "h " << h << " i " << i;
            continue;
          }
          ASSERT_GE(r[j], 0);
          ASSERT_LT(r[j], nvis);
          if (j > 0) EXPECT_LT(r[j - 1], r[j]);
          ids.insert(r[j]);
        }
        EXPECT_TRUE(ids.count(0) && ids.count(static_cast<int32_t>(diag))) << "i " << i;
        if (diag > 0) EXPECT_TRUE(ids.count(static_cast<int32_t>(diag - 1))) << "i " << i;
      }
    }
  }
}

TEST(BenchPatterns, FixedSeedReproducesAndOtherSeedDiffers) {
  auto s = one_batch(4096, 4096, 2, 8, 128, true);
  const auto a = bench::make_selection(Pattern::tok, s);
  EXPECT_EQ(a, bench::make_selection(Pattern::tok, s));
  s.seed = 8;
  EXPECT_NE(a, bench::make_selection(Pattern::tok, s));
}

TEST(BenchPatterns, BlkSharesOneSelectionPerQueryBlock) {
  const auto s = one_batch(1000, 1000, 1, 4, 128, true);
  const auto q2k = bench::make_selection(Pattern::blk, s);
  for (int64_t i = 0; i < 1000; ++i) {
    const int64_t first = i / 128 * 128;
    for (int j = 0; j < 4; ++j) EXPECT_EQ(row(q2k, s, 0, i)[j], row(q2k, s, 0, first)[j]) << i;
  }
  // Different query blocks draw different random blocks somewhere.
  EXPECT_NE(std::vector<int32_t>(row(q2k, s, 0, 900), row(q2k, s, 0, 900) + 4),
            std::vector<int32_t>(row(q2k, s, 0, 999 - 128 * 6), row(q2k, s, 0, 999 - 128 * 6) + 4));
}

TEST(BenchPatterns, QueriesThatSeeNothingGetEmptyRows) {
  const auto s = one_batch(300, 100, 1, 4, 64, true);  // Lq > Lk: the first 200 queries see no key
  const auto q2k = bench::make_selection(Pattern::tok, s);
  for (int64_t i = 0; i < 200; ++i)
    for (int j = 0; j < 4; ++j) EXPECT_EQ(row(q2k, s, 0, i)[j], -1) << i;
  EXPECT_EQ(row(q2k, s, 0, 200)[0], 0);
  EXPECT_EQ(row(q2k, s, 0, 200)[1], -1);
}

TEST(BenchPatterns, PairCountsByHand) {
  // 5 tokens, blocks of 2, topk 1: every query keeps only block 0. Query i sees i + 1 keys, of
  // which min(2, i + 1) lie in block 0; G = 2 query heads share the kv head.
  const auto s = one_batch(5, 5, 1, 1, 2, true);
  const auto q2k = bench::make_selection(Pattern::tok, s);
  const bench::PairCounts c = bench::count_pairs(q2k, s, 2);
  EXPECT_EQ(c.visible, 2 * (1 + 2 + 3 + 4 + 5));
  EXPECT_EQ(c.attended, 2 * (1 + 2 + 2 + 2 + 2));
  EXPECT_EQ(c.selected_keys, 2);  // block 0's two keys, read once for the kv head
  EXPECT_EQ(bench::dense_selection_warning(c, s), "");  // 60% of the visible pairs
}

// Dense when topK reaches the key blocks, or when the selection covers >= 90% of the visible
// pairs anyway (8 blocks, topK 7: only the last 104 queries miss a block).
TEST(BenchPatterns, DenseSelectionWarning) {
  auto warning = [](const bench::SelectionShape& s, int group) {
    return bench::dense_selection_warning(bench::count_pairs(bench::make_selection(Pattern::tok, s), s, group), s);
  };
  const std::string w = warning(one_batch(256, 256, 1, 2, 128, true), 4);
  EXPECT_NE(w.find("covers 100.0% of the causally visible"), std::string::npos) << w;
  EXPECT_NE(w.find("topK 2 >= 2 key blocks"), std::string::npos) << w;
  const std::string m = warning(one_batch(1000, 1000, 1, 7, 128, true), 1);
  EXPECT_NE(m.find("the selection is dense"), std::string::npos) << m;
  EXPECT_EQ(m.find("key blocks"), std::string::npos) << m;
  EXPECT_EQ(warning(one_batch(4096, 4096, 1, 4, 128, true), 1), "");
}

TEST(BenchPatterns, ParseNames) {
  Pattern p;
  for (Pattern want : {Pattern::tok, Pattern::blk, Pattern::idx}) {
    ASSERT_TRUE(bench::parse_pattern(bench::pattern_name(want), &p));
    EXPECT_EQ(p, want);
  }
  EXPECT_FALSE(bench::parse_pattern("token", &p));
}

}  // namespace
}  // namespace msa::test
