// workloads/patterns.h: the tok/blk selections of bench/CASES.md (forced blocks, visibility, order,
// padding, sharing within a query block, fixed seeds), the token ids of the TOKSPARSE-* cases and
// the attended/visible pair counts.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <set>
#include <stdexcept>
#include <tuple>

#include "workloads/cases.h"
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
  // tok over 128-key blocks, and token ids (kv_block_size 1, drawn in parallel over the rows).
  for (const auto& [p, topk, blk] : {std::tuple{Pattern::tok, 8, 128}, {Pattern::ids, 512, 1}}) {
    auto s = one_batch(4096, 4096, 2, topk, blk, true);
    const auto a = bench::make_selection(p, s);
    EXPECT_EQ(a, bench::make_selection(p, s)) << bench::pattern_name(p);
    s.seed = 8;
    EXPECT_NE(a, bench::make_selection(p, s)) << bench::pattern_name(p);
  }
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

// Every ids row of query t (which sees keys [0, vis)): min(topk, vis) ids, ascending (so
// distinct), all visible, the min(kRecentKeys, topk) most recent among them, then -1.
void expect_token_id_rows(const std::vector<int32_t>& q2k, const bench::SelectionShape& s) {
  const int64_t lq = s.cu_seqlens_q[1], lk = s.cu_seqlens_k[1];
  for (int h = 0; h < s.num_kv_heads; ++h) {
    for (int64_t t = 0; t < lq; ++t) {
      const int32_t* r = row(q2k, s, h, t);
      const int64_t vis = bench::visible_key_end(t, lq, lk, s.causal);
      const int64_t n = std::min<int64_t>(s.topk, vis);
      for (int j = 0; j < s.topk; ++j) {
        if (j >= n) {
          ASSERT_EQ(r[j], -1) << "h " << h << " t " << t << " slot " << j;
          continue;
        }
        ASSERT_GE(r[j], 0) << "h " << h << " t " << t;
        ASSERT_LT(r[j], vis) << "h " << h << " t " << t;
        if (j > 0) ASSERT_LT(r[j - 1], r[j]) << "h " << h << " t " << t << " slot " << j;
      }
      // Ascending: the most recent keys present means the row ends with them.
      const int64_t recent = std::min<int64_t>({bench::kRecentKeys, s.topk, vis});
      for (int64_t j = 0; j < recent; ++j)
        ASSERT_EQ(r[n - 1 - j], vis - 1 - j) << "h " << h << " t " << t;
    }
  }
}

TEST(BenchPatterns, TokenIdRowsFollowTheRules) {
  for (bool causal : {true, false}) {
    auto s = one_batch(1500, 1500, 2, 300, 1, causal);
    expect_token_id_rows(bench::make_selection(Pattern::ids, s), s);
    s.topk = 100;  // fewer ids than the recent window: the topk most recent keys
    expect_token_id_rows(bench::make_selection(Pattern::ids, s), s);
  }
  // Lq > Lk: the first 200 queries see nothing; Lq < Lk: the first query sees 801 keys.
  for (const auto& [lq, lk] : {std::pair{300, 100}, {200, 1000}}) {
    const auto s = one_batch(lq, lk, 1, 200, 1, true);
    expect_token_id_rows(bench::make_selection(Pattern::ids, s), s);
  }
}

// The rows draw from the whole range: past the window, the earlier keys' ids spread over it, and
// each kv head draws its own.
TEST(BenchPatterns, TokenIdsAreRandomPerKvHead) {
  const auto s = one_batch(4096, 4096, 2, 256, 1, true);
  const auto q2k = bench::make_selection(Pattern::ids, s);
  const int32_t* a = row(q2k, s, 0, 4095);
  const int32_t* b = row(q2k, s, 1, 4095);
  EXPECT_NE(std::vector<int32_t>(a, a + 128), std::vector<int32_t>(b, b + 128));
  EXPECT_LT(a[0], 200);
  EXPECT_GT(a[127], 3000);  // the 128th of 128 draws from [0, 3968)
}

TEST(BenchPatterns, TokenIdsNeedBlockSizeOne) {
  const auto s = one_batch(256, 256, 1, 16, 128, true);
  EXPECT_THROW(bench::make_selection(Pattern::ids, s), std::invalid_argument);
}

// count_pairs at blk 1 counts the ids: every row holds min(topk, t + 1) visible ids, times G.
TEST(BenchPatterns, TokenIdPairCounts) {
  const auto s = one_batch(5000, 5000, 2, 2048, 1, true);
  const bench::PairCounts c = bench::count_pairs(bench::make_selection(Pattern::ids, s), s, 16);
  int64_t want = 0, visible = 0;
  for (int64_t t = 0; t < 5000; ++t) want += std::min<int64_t>(2048, t + 1), visible += t + 1;
  EXPECT_EQ(c.attended, 16 * 2 * want);
  EXPECT_EQ(c.visible, 16 * 2 * visible);
  EXPECT_EQ(bench::dense_selection_warning(c, s), "");
}

// The TOKSPARSE-* rows of the case table: shape and rule, and a 32K request's 67M ids drawn in a
// few seconds (the benchmark draws them at every run), checked on a stride of rows.
TEST(BenchPatterns, TokSparseCases) {
  for (const auto& [name, seq, hkv] : {std::tuple{"TOKSPARSE-8K", 8192, 1}, {"TOKSPARSE-32K", 32768, 1},
                                       {"TOKSPARSE-32K-G16", 32768, 4}}) {
    const bench::BenchCase* c = bench::find_case(name);
    ASSERT_NE(c, nullptr) << name;
    EXPECT_EQ(c->pattern, Pattern::ids);
    EXPECT_EQ(c->seqlens_q, std::vector<int64_t>{seq});
    EXPECT_EQ(c->seqlens_k, std::vector<int64_t>{seq});
    EXPECT_EQ(c->num_q_heads, 64);
    EXPECT_EQ(c->num_kv_heads, hkv);
    EXPECT_EQ(c->head_dim, 128);
    EXPECT_EQ(c->kv_block_size, 1);
    EXPECT_EQ(c->topk, 2048);
    EXPECT_TRUE(c->causal);
    EXPECT_NE(c->needs.find("kv_block_size 1"), std::string::npos) << c->needs;
  }
  const bench::BenchCase* c = bench::find_case("TOKSPARSE-32K");
  auto s = one_batch(32768, 32768, c->num_kv_heads, c->topk, c->kv_block_size, c->causal);
  const auto start = std::chrono::steady_clock::now();
  const auto q2k = bench::make_selection(Pattern::ids, s);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("TOKSPARSE-32K: %zu ids in %.2f s\n", q2k.size(), seconds);
  EXPECT_LT(seconds, 20.0);  // a few seconds on 2 cores; generous for a loaded machine
  // Query t of the request sees t + 1 keys, as a lone query over t + 1 keys does.
  auto check_row = [&](int64_t t) {
    bench::SelectionShape lone = one_batch(1, t + 1, 1, s.topk, 1, true);
    expect_token_id_rows(std::vector<int32_t>(row(q2k, s, 0, t), row(q2k, s, 0, t) + s.topk), lone);
  };
  for (int64_t t = 0; t < 32768; t += t < 4096 ? 1 : 97) check_row(t);
  check_row(32767);
}

TEST(BenchPatterns, ParseNames) {
  Pattern p;
  for (Pattern want : {Pattern::tok, Pattern::blk, Pattern::idx}) {
    ASSERT_TRUE(bench::parse_pattern(bench::pattern_name(want), &p));
    EXPECT_EQ(p, want);
  }
  EXPECT_FALSE(bench::parse_pattern("token", &p));
  EXPECT_STREQ(bench::pattern_name(Pattern::ids), "ids");
  EXPECT_FALSE(bench::parse_pattern("ids", &p));  // token ids run as the TOKSPARSE-* cases only
}

}  // namespace
}  // namespace msa::test
