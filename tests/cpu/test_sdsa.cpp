// CPU SDSA indexer (include/msa/sdsa.h; docs/semantics.md, SDSA indexer) against hand-computed
// values and a brute-force full sort written from the definition: the threshold select plus
// top-K from candidates equals the full sort whenever the stores did not overflow, and every
// overflow is reported; ties, NaN, -inf, empty rows and requests, and the argument rules.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "common/codecs.h"
#include "common/sdsa.h"
#include "msa/msa.h"
#include "support/expect_error.h"
#include "support/host_tensor.h"
#include "support/ref_codecs.h"
#include "support/sdsa_case.h"

namespace msa::test {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

uint32_t bits(float f) { return codec::float_bits(f); }

// The stores and outputs of one select + top-K run over T rows.
struct Stores {
  HostTensor thresholds, candidates, ties, counts, ids, status;
  Stores(int64_t rows, int64_t cap, int64_t tie_cap, int64_t topk)
      : thresholds(DType::f32, {rows}), candidates(DType::i32, {rows, cap, 2}),
        ties(DType::i32, {rows, tie_cap}), counts(DType::i32, {rows, 3}),
        ids(DType::i32, {rows, topk}), status(DType::i32, {rows}) {
    std::memset(counts.data<int32_t>(), 0, counts.bytes());
  }
  void select(const SdsaCase& c) const {
    ThresholdSelectArgs a;
    a.rows = c.rows();
    a.cache = c.cache();
    a.thresholds = thresholds.t;
    a.candidates = candidates.t;
    a.ties = ties.t;
    a.counts = counts.t;
    indexer_threshold_select(a);
  }
  // Top-K into fresh ids [T, topk].
  void top_k(int topk) {
    ids = HostTensor(DType::i32, {status.t.shape[0], topk});
    TopKFromCandidatesArgs a;
    a.candidates = candidates.t;
    a.ties = ties.t;
    a.counts = counts.t;
    a.topk = topk;
    a.ids = ids.t;
    a.row_status = status.t;
    top_k_from_candidates(a);
  }
  const int32_t* count(int64_t t) const { return counts.data<int32_t>() + 3 * t; }
  std::vector<int32_t> row_ids(int64_t t, int64_t topk) const {
    return {ids.data<int32_t>() + t * topk, ids.data<int32_t>() + (t + 1) * topk};
  }
};

HostTensor scores_of(const SdsaCase& c, int64_t width) {
  HostTensor s(DType::f32, {c.num_rows(), width});
  IndexerScoresArgs a;
  a.rows = c.rows();
  a.cache = c.cache();
  a.scores = s.t;
  indexer_scores(a);
  return s;
}

// A hand-made bf16 case: D = 2, page size 2, keys given per request in position order.
SdsaCase hand_case(const std::vector<std::vector<std::pair<float, float>>>& keys,
                   const std::vector<std::pair<float, float>>& queries,
                   const std::vector<int32_t>& requests) {
  SdsaShape sh;
  sh.dim = 2;
  sh.page_size = 2;
  for (const auto& k : keys) sh.seq_lens.push_back(int32_t(k.size()));
  sh.row_requests = requests;
  SdsaCase c = make_sdsa_case(sh, 1);
  for (size_t b = 0; b < keys.size(); ++b)
    for (size_t j = 0; j < keys[b].size(); ++j) {
      const int64_t page = c.table.data<int32_t>()[b * c.table.t.shape[1] + j / 2];
      uint16_t* row = c.keys.data<uint16_t>() + c.keys.offset({page, int64_t(j % 2), 0});
      row[0] = codec::float_to_bf16(keys[b][j].first);
      row[1] = codec::float_to_bf16(keys[b][j].second);
    }
  for (size_t t = 0; t < queries.size(); ++t) {
    c.query.data<uint16_t>()[2 * t] = codec::float_to_bf16(queries[t].first);
    c.query.data<uint16_t>()[2 * t + 1] = codec::float_to_bf16(queries[t].second);
  }
  return c;
}

TEST(SdsaScores, HandComputedAcrossPagesWithRowLensAndAnEmptyRequest) {
  SdsaCase c = hand_case({{{1, 1}, {-1, 2}, {3, 0}}, {}}, {{1, 2}, {0.5f, -1}, {1, 1}}, {0, 0, 1});
  c.shape.row_lens = true;
  c.row_lens.data<int32_t>()[0] = 3;
  c.row_lens.data<int32_t>()[1] = 1;
  c.row_lens.data<int32_t>()[2] = 0;
  const HostTensor s = scores_of(c, 4);
  const std::vector<float> want = {3, 3, 3, -kInf, -0.5f, -kInf, -kInf, -kInf,
                                   -kInf, -kInf, -kInf, -kInf};
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(s.data<float>()[i], want[i]) << i;
}

// Scores of NVFP4 keys and queries equal the dot products of the values decoded by the test's own
// codecs, rounded once to f32.
// The e2m1 decode the GPU score uses (integer operations only) equals the codec's table.
TEST(SdsaScores, E2m1ValueEqualsTheCodec) {
  for (uint32_t n = 0; n < 16; ++n) {
    const double v = sdsa::e2m1_value(n);
    EXPECT_EQ(v, double(codec::e2m1_to_float(uint8_t(n)))) << "nibble " << n;
    EXPECT_EQ(std::signbit(v), (n & 8u) != 0) << "nibble " << n;
  }
}

// The integers of the exact NVFP4 score equal the codecs' values: twice every e2m1 value, and
// every e4m3 byte's value times 2^9 (NaN bytes flagged).
TEST(SdsaScores, ExactScoreIntegersEqualTheCodecs) {
  for (uint32_t n = 0; n < 16; ++n)
    EXPECT_EQ(double(sdsa::e2m1_halves(n)), 2.0 * codec::e2m1_to_float(uint8_t(n))) << n;
  for (uint32_t b = 0; b < 256; ++b) {
    bool nan = false;
    const int32_t units = sdsa::e4m3_units(b, nan);
    EXPECT_EQ(nan, std::isnan(ref_e4m3_decode(uint8_t(b)))) << b;
    if (!nan) EXPECT_EQ(std::ldexp(double(units), -9), ref_e4m3_decode(uint8_t(b))) << b;
  }
}

// Scores of NVFP4 keys and queries are the exact dot product of the values the test's own codecs
// decode, times the global scales, rounded once to fp64 and once to f32 (docs/semantics.md); NaN
// where a scale byte of the query or the key is NaN. D = 80 (five groups), odd global scales.
TEST(SdsaScores, Nvfp4IsTheExactDotOfIndependentDecodes) {
  SdsaShape sh;
  sh.dim = 80;
  sh.page_size = 16;
  sh.seq_lens = {37, 0, 16};
  sh.row_requests = {0, 2, 0, 1, 0};
  sh.fp4_keys = sh.fp4_query = true;
  SdsaCase c = make_sdsa_case(sh, 7);
  c.key_global = 0.3137f;
  c.query_global = 0.771f;
  const int64_t groups = sh.dim / 16, row = sh.dim / 2;
  const int64_t nan_page = c.table.data<int32_t>()[0];  // request 0, key 5: a NaN scale byte
  c.key_scale.data<uint8_t>()[c.key_scale.offset({nan_page, 5, 3})] = 0x7f;
  c.query_scale.data<uint8_t>()[4 * groups + 1] = 0xff;  // row 4: every key NaN
  const HostTensor s = scores_of(c, 40);
  auto value = [](const HostTensor& v, const HostTensor& sc, int64_t voff, int64_t soff,
                  int64_t d) {
    const uint8_t byte = v.data<uint8_t>()[voff + d / 2];
    return ref_e2m1_decode(d % 2 ? byte >> 4 : byte & 15) *
           ref_e4m3_decode(sc.data<uint8_t>()[soff + d / 16]);
  };
  int nans = 0;
  for (int64_t t = 0; t < c.num_rows(); ++t) {
    const int64_t b = sh.row_requests[t];
    for (int64_t j = 0; j < 40; ++j) {
      const float got = s.data<float>()[t * 40 + j];
      if (j >= sh.seq_lens[b]) {
        EXPECT_EQ(got, -kInf);
        continue;
      }
      const int64_t page = c.table.data<int32_t>()[b * c.table.t.shape[1] + j / 16];
      int64_t units = 0;  // the dot product of the decoded values in units of 2^-20, exact
      bool nan = false;
      for (int64_t d = 0; d < sh.dim; ++d) {
        const double p = value(c.query, c.query_scale, t * row, t * groups, d) *
                         value(c.keys, c.key_scale, c.keys.offset({page, j % 16, 0}),
                               c.key_scale.offset({page, j % 16, 0}), d);
        if (std::isnan(p)) nan = true;
        else units += int64_t(std::ldexp(p, 20));  // a product of two 7-bit values >= 2^-20
      }
      const double unit = double(c.query_global) * double(c.key_global) * 0x1p-20;
      if (nan) {
        EXPECT_EQ(bits(got), 0x7fc00000u) << "row " << t << " key " << j;
        ++nans;
        continue;
      }
      const float want = float(double(units) * unit);
      EXPECT_EQ(bits(got), bits(want)) << "row " << t << " key " << j;
    }
  }
  EXPECT_EQ(nans, 37 + 2);  // row 4's 37 keys, and key 5 of rows 0 and 2
}

// quantize_write_index_qk_nvfp4 writes what msa::quantize (nvfp4) gives for the same rows, at the
// given slots; negative slots and the slots no key names are not written.
TEST(SdsaQuantizeWrite, EqualsQuantizeAtTheSlots) {
  std::mt19937 rng(3);
  const HostTensor key = random_rows(rng, 3, 32, false), query = random_rows(rng, 2, 32, false);
  HostTensor cache(DType::fp4x2, {2, 4, 16}), cache_sc(DType::fp8_e4m3, {2, 4, 2});
  HostTensor qout(DType::fp4x2, {2, 16}), qout_sc(DType::fp8_e4m3, {2, 2});
  const HostTensor slots = i32_tensor({6, -1, 1});
  QuantizeIndexQKArgs w;
  w.key = key.t;
  w.slots = slots.t;
  w.key_cache = QTensor(cache.t, cache_sc.t, 0.5f);
  w.query = query.t;
  w.query_out = QTensor(qout.t, qout_sc.t, 2.f);
  quantize_write_index_qk_nvfp4(w);
  auto expect_row = [](const HostTensor& x, int64_t row, float global, const uint8_t* codes,
                       const uint8_t* scales) {
    HostTensor v(DType::fp4x2, {1, 1, 16}), sc(DType::fp8_e4m3, {1, 1, 2});
    quantize(Tensor(x.data<float>() + row * 32, DType::f32, {1, 1, 32}), QuantFormat::nvfp4,
             QTensor(v.t, sc.t, global));
    EXPECT_EQ(std::memcmp(v.data<uint8_t>(), codes, 16), 0) << row;
    EXPECT_EQ(std::memcmp(sc.data<uint8_t>(), scales, 2), 0) << row;
  };
  expect_row(key, 0, 0.5f, cache.data<uint8_t>() + 6 * 16, cache_sc.data<uint8_t>() + 6 * 2);
  expect_row(key, 2, 0.5f, cache.data<uint8_t>() + 1 * 16, cache_sc.data<uint8_t>() + 1 * 2);
  for (int64_t t = 0; t < 2; ++t)
    expect_row(query, t, 2.f, qout.data<uint8_t>() + t * 16, qout_sc.data<uint8_t>() + t * 2);
  for (int64_t slot : {0, 2, 3, 4, 5, 7})  // not written: still the poison
    for (int64_t i = 0; i < 16; ++i) EXPECT_EQ(cache.data<uint8_t>()[slot * 16 + i], 0xff) << slot;
}

// Thresholds from a sample, then select + top-K: every row whose stores fit equals the full
// sort of its scores; the counts are the brute-force counts against the threshold; every row
// that does not fit says so. Over bf16 and NVFP4, coarse (many ties) and fine values, causal row
// lengths, page sizes 16 and 64, a store small enough to overflow now and then.
TEST(SdsaSelect, ThresholdSelectPlusTopKEqualsFullSort) {
  int checked_exact = 0, reported = 0;
  for (uint32_t seed = 0; seed < 24; ++seed) {
    SdsaShape sh;
    sh.dim = seed % 3 == 0 ? 32 : 64;
    sh.page_size = seed % 2 ? 16 : 64;
    sh.seq_lens = {int32_t(150 + seed * 37 % 400), 0, 1, int32_t(90 + seed * 11)};
    sh.row_requests = {0, 3, 0, 1, 2, 3, 0};
    sh.row_lens = seed % 4 == 1;
    sh.fp4_keys = seed % 3 == 1;
    sh.fp4_query = seed % 6 == 1;
    sh.coarse = seed % 2 == 0;
    const SdsaCase c = make_sdsa_case(sh, seed);
    const int topk = 8 + int(seed % 5) * 7, stride = 4;
    const int64_t width = c.longest_row() + 3;
    const HostTensor s = scores_of(c, width);
    // The thresholds from each row's own scores sampled every stride-th key.
    const int64_t per_row = (width + stride - 1) / stride;
    HostTensor sample(DType::f32, {c.num_rows(), per_row});
    for (int64_t t = 0; t < c.num_rows(); ++t)
      for (int64_t i = 0; i < per_row; ++i)
        sample.data<float>()[t * per_row + i] =
            s.data<float>()[t * width + std::min<int64_t>(i * stride + 1, width - 1)];
    Stores st(c.num_rows(), 2 * topk + int(seed % 3) * topk, topk, topk);
    std::memset(st.counts.data<int32_t>(), 0x7f, st.counts.bytes());
    ThresholdsFromSampleArgs th;
    th.sample_scores = sample.t;
    th.topk = topk;
    th.sample_stride = stride;
    th.oversample = 1.5;
    th.thresholds = st.thresholds.t;
    th.counts = st.counts.t;
    thresholds_from_sample(th);
    st.select(c);
    st.top_k(topk);
    const int64_t cap = st.candidates.t.shape[1], tie_cap = topk;
    for (int64_t t = 0; t < c.num_rows(); ++t) {
      const float* row = s.data<float>() + t * width;
      const float bar = st.thresholds.data<float>()[t];
      int32_t above = 0, equal = 0, below = 0;
      for (int64_t j = 0; j < c.row_len(t); ++j) {
        ASSERT_TRUE(std::isfinite(row[j])) << "a NaN slot or table column was read";
        const bool ninf = row[j] == -kInf;
        const bool nan_row = std::isnan(row[j]), nan_bar = std::isnan(bar);
        const bool gt = nan_bar ? !nan_row && !ninf : (!nan_row && row[j] > bar) ||
                                                           (bar == -kInf && nan_row);
        const bool eq = !ninf && (nan_bar ? nan_row : row[j] == bar);
        above += gt;
        equal += eq;
        below += !gt && !eq && !ninf;
      }
      ASSERT_EQ(st.count(t)[0], above) << "seed " << seed << " row " << t;
      ASSERT_EQ(st.count(t)[1], equal) << "seed " << seed << " row " << t;
      ASSERT_EQ(st.count(t)[2], below) << "seed " << seed << " row " << t;
      const int32_t state = st.status.data<int32_t>()[t];
      const std::vector<int32_t> want = full_sort_topk(row, c.row_len(t), topk);
      if (above > cap) {
        EXPECT_EQ(state, int32_t(CandidateStatus::candidates_overflow));
      } else if (above < topk && equal > tie_cap) {
        EXPECT_EQ(state, int32_t(CandidateStatus::ties_overflow));
      } else if (above + equal < topk && below > 0) {
        EXPECT_EQ(state, int32_t(CandidateStatus::threshold_too_high));
        // What it holds is the row's true best, -1 padded.
        std::vector<int32_t> best = full_sort_topk(row, c.row_len(t), above + equal);
        best.resize(size_t(topk), -1);
        EXPECT_EQ(st.row_ids(t, topk), best) << "seed " << seed << " row " << t;
      } else {
        EXPECT_EQ(state, int32_t(CandidateStatus::exact));
        EXPECT_EQ(st.row_ids(t, topk), want) << "seed " << seed << " row " << t;
        ++checked_exact;
        continue;
      }
      ++reported;
      if (state != int32_t(CandidateStatus::threshold_too_high))
        EXPECT_EQ(st.row_ids(t, topk), std::vector<int32_t>(size_t(topk), -1));
    }
  }
  EXPECT_GT(checked_exact, 100);  // the sampled thresholds make most rows fit
  EXPECT_GT(reported, 0);         // and the small stores overflow now and then
}

// Many equal scores: the ties at the threshold fill the top-K from the lowest positions.
TEST(SdsaSelect, TiesGoToTheLowerPositions) {
  // Request 0: scores (query (1, 0)) 2 at positions 1 and 4, 1 at 0, 2, 3, 5, 6, 0 at 7.
  SdsaCase c = hand_case({{{1, 0}, {2, 0}, {1, 5}, {1, -3}, {2, 1}, {1, 0}, {1, 0}, {0, 0}}},
                         {{1, 0}, {1, 0}}, {0, 0});
  Stores st(2, 4, 8, 4);
  st.thresholds.data<float>()[0] = 1.f;   // candidates 1, 4; ties 0, 2, 3, 5, 6
  st.thresholds.data<float>()[1] = -0.f;  // the zero score at 7 ranks equal to -0
  st.select(c);
  st.top_k(4);
  EXPECT_EQ(std::vector<int32_t>(st.count(0), st.count(0) + 3), (std::vector<int32_t>{2, 5, 1}));
  EXPECT_EQ(st.row_ids(0, 4), (std::vector<int32_t>{0, 1, 2, 4}));
  EXPECT_EQ(st.status.data<int32_t>()[0], 0);
  // The CPU stores candidates in position order, with their score bits.
  EXPECT_EQ(st.candidates.data<int32_t>()[0], 1);
  EXPECT_EQ(uint32_t(st.candidates.data<int32_t>()[1]), bits(2.f));
  EXPECT_EQ(std::vector<int32_t>(st.count(1), st.count(1) + 3), (std::vector<int32_t>{7, 1, 0}));
  // Seven candidates, four kept: the two 2s, then the 1s at 0 and 2.
  EXPECT_EQ(st.status.data<int32_t>()[1], int32_t(CandidateStatus::candidates_overflow));
  EXPECT_EQ(st.row_ids(1, 4), (std::vector<int32_t>{-1, -1, -1, -1}));
}

// -inf scores are never stored; NaN ranks below every other score, above -inf: a -inf threshold
// makes NaN keys candidates, a NaN threshold makes them the ties.
TEST(SdsaSelect, NanAndInfRules) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // Query (1, 0): scores -inf, NaN (inf * 0 + ...), 3, +inf, NaN, -1.
  SdsaCase c = hand_case({{{-kInf, 0}, {kInf, nan}, {3, 0}, {kInf, 0}, {nan, 0}, {-1, 0}}},
                         {{1, 0}, {1, 0}, {1, 0}}, {0, 0, 0});
  const HostTensor s = scores_of(c, 6);
  EXPECT_EQ(s.data<float>()[0], -kInf);
  EXPECT_TRUE(std::isnan(s.data<float>()[1]));
  EXPECT_EQ(s.data<float>()[3], kInf);
  Stores st(3, 6, 6, 5);
  st.thresholds.data<float>()[0] = -kInf;
  st.thresholds.data<float>()[1] = nan;
  st.thresholds.data<float>()[2] = 3.f;
  st.select(c);
  st.top_k(5);
  EXPECT_EQ(std::vector<int32_t>(st.count(0), st.count(0) + 3), (std::vector<int32_t>{5, 0, 0}));
  EXPECT_EQ(std::vector<int32_t>(st.count(1), st.count(1) + 3), (std::vector<int32_t>{3, 2, 0}));
  EXPECT_EQ(std::vector<int32_t>(st.count(2), st.count(2) + 3), (std::vector<int32_t>{1, 1, 3}));
  // Both complete rows: every selectable key, -inf never, NaN last.
  for (int64_t t = 0; t < 2; ++t) {
    EXPECT_EQ(st.row_ids(t, 5), (std::vector<int32_t>{1, 2, 3, 4, 5})) << t;
    EXPECT_EQ(st.row_ids(t, 5), full_sort_topk(s.data<float>(), 6, 5));
  }
  // Threshold 3 keeps +inf and 3: fewer than five while keys rank below.
  EXPECT_EQ(st.status.data<int32_t>()[2], int32_t(CandidateStatus::threshold_too_high));
  EXPECT_EQ(st.row_ids(2, 5), (std::vector<int32_t>{2, 3, -1, -1, -1}));
  st.top_k(3);  // four selectable finite or NaN keys rank: +inf, 3, -1, then NaN
  EXPECT_EQ(st.row_ids(0, 3), (std::vector<int32_t>{2, 3, 5}));
}

// Rows of no key (seq_len 0, row_lens 0), no rows, no requests: counts stay zero, ids -1, exact.
TEST(SdsaSelect, EmptyRowsAndBatches) {
  SdsaCase c = hand_case({{}, {{1, 1}}}, {{1, 1}, {1, 1}}, {0, 1});
  c.shape.row_lens = true;
  c.row_lens.data<int32_t>()[0] = 0;
  c.row_lens.data<int32_t>()[1] = 0;
  Stores st(2, 1, 0, 2);
  st.thresholds.data<float>()[0] = st.thresholds.data<float>()[1] = -kInf;
  st.select(c);
  st.top_k(2);
  for (int64_t t = 0; t < 2; ++t) {
    EXPECT_EQ(std::vector<int32_t>(st.count(t), st.count(t) + 3), (std::vector<int32_t>{0, 0, 0}));
    EXPECT_EQ(st.row_ids(t, 2), (std::vector<int32_t>{-1, -1}));
    EXPECT_EQ(st.status.data<int32_t>()[t], 0);
  }
  SdsaShape none;
  none.dim = 16;
  const SdsaCase empty = make_sdsa_case(none, 2);  // B = 0, T = 0
  Stores st0(0, 1, 1, 1);
  st0.select(empty);
  st0.top_k(1);
  EXPECT_EQ(scores_of(empty, 0).t.numel(), 0);
}

// Overflowing stores are counted past their capacity and never written past their end.
TEST(SdsaSelect, OverflowIsCountedNotWritten) {
  SdsaShape sh;
  sh.dim = 16;
  sh.seq_lens = {100};
  sh.row_requests = {0};
  sh.coarse = true;
  SdsaCase c = make_sdsa_case(sh, 5);
  Stores st(1, 3, 2, 4);
  st.thresholds.data<float>()[0] = -kInf;
  st.select(c);
  EXPECT_EQ(st.count(0)[0], 100);
  for (size_t i = st.candidates.bytes(); i < st.candidates.bytes() + 64; ++i)
    EXPECT_EQ(reinterpret_cast<uint8_t*>(st.candidates.t.data)[i], 0xff);
  st.top_k(4);
  EXPECT_EQ(st.status.data<int32_t>()[0], int32_t(CandidateStatus::candidates_overflow));
  // Ties: one hundred equal scores, all equal to the threshold.
  for (int64_t i = 0; i < c.keys.t.numel(); ++i) c.keys.data<uint16_t>()[i] = codec::float_to_bf16(1.f);
  for (int64_t d = 0; d < 16; ++d) c.query.data<uint16_t>()[d] = codec::float_to_bf16(1.f);
  Stores tie(1, 3, 2, 4);
  tie.thresholds.data<float>()[0] = 16.f;
  tie.select(c);
  tie.top_k(4);
  EXPECT_EQ(std::vector<int32_t>(tie.count(0), tie.count(0) + 3), (std::vector<int32_t>{0, 100, 0}));
  EXPECT_EQ(tie.status.data<int32_t>()[0], int32_t(CandidateStatus::ties_overflow));
  for (size_t i = tie.ties.bytes(); i < tie.ties.bytes() + 64; ++i)
    EXPECT_EQ(reinterpret_cast<uint8_t*>(tie.ties.t.data)[i], 0xff);
  // Even with topk = Ct: which ties a parallel pass kept is unspecified, so an overflowing tie
  // store is reported whenever the row needs ties.
  tie.top_k(2);
  EXPECT_EQ(tie.status.data<int32_t>()[0], int32_t(CandidateStatus::ties_overflow));
}

TEST(SdsaSample, GatherIsTheStridedKeysAndScoresAsAPagedCache) {
  for (bool fp4 : {false, true}) {
    SdsaShape sh;
    sh.dim = 32;
    sh.page_size = 16;
    sh.seq_lens = {50, 3, 0, 37};
    sh.row_requests = {0, 1, 3, 3};
    sh.fp4_keys = fp4;
    const SdsaCase c = make_sdsa_case(sh, 11);
    const int stride = 5, S = 12;
    const HostTensor offsets = i32_tensor({4, 3, 0, 2});
    HostTensor sample(fp4 ? DType::fp4x2 : DType::bf16, {4, S, fp4 ? 16 : 32});
    HostTensor sample_sc(DType::fp8_e4m3, {4, S, 2}), sample_lens(DType::i32, {4});
    GatherKeySampleArgs g;
    g.cache = c.cache();
    g.stride = stride;
    g.offsets = offsets.t;
    g.sample = fp4 ? QTensor(sample.t, sample_sc.t) : QTensor(sample.t);
    g.sample_lens = sample_lens.t;
    gather_key_sample(g);
    EXPECT_EQ(std::vector<int32_t>(sample_lens.data<int32_t>(), sample_lens.data<int32_t>() + 4),
              (std::vector<int32_t>{10, 0, 0, 7}));
    // Scored as a pool of one S-key page a request, each row sees its request's samples.
    const HostTensor table = i32_tensor({0, 1, 2, 3});
    HostTensor sampled(DType::f32, {4, S});
    IndexerScoresArgs a;
    a.rows = c.rows();
    a.cache.key_cache = fp4 ? QTensor(sample.t, sample_sc.t, c.key_global) : QTensor(sample.t);
    a.cache.block_table = Tensor(table.t.data, DType::i32, {4, 1});
    a.cache.seq_lens = sample_lens.t;
    a.scores = sampled.t;
    indexer_scores(a);
    const HostTensor full = scores_of(c, 50);
    for (int64_t t = 0; t < 4; ++t) {
      const int64_t b = sh.row_requests[t], n = sample_lens.data<int32_t>()[b];
      for (int64_t i = 0; i < S; ++i) {
        const float want = i < n ? full.data<float>()[t * 50 + offsets.data<int32_t>()[b] + i * stride]
                                 : -kInf;
        EXPECT_EQ(bits(sampled.data<float>()[t * S + i]), bits(want)) << fp4 << " " << t << " " << i;
      }
    }
  }
}

TEST(SdsaSample, ThresholdsAreTheRthBestSampleScore) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  HostTensor s(DType::f32, {5, 5});
  const float rows[5][5] = {{5, 1, 3, -kInf, nan},   {5, 1, 3, -kInf, nan}, {-0.f, -1, -kInf, -kInf, -kInf},
                            {5, 1, 3, -kInf, -kInf}, {5, nan, 3, -2, nan}};
  std::memcpy(s.data<float>(), rows, sizeof(rows));
  HostTensor th(DType::f32, {5}), counts(DType::i32, {5, 3});
  ThresholdsFromSampleArgs a;
  a.sample_scores = s.t;
  a.topk = 2;
  a.sample_stride = 1;
  a.oversample = 1.0;  // r = 2
  a.thresholds = th.t;
  a.counts = counts.t;
  thresholds_from_sample(a);
  EXPECT_EQ(th.data<float>()[0], 3.f);
  EXPECT_EQ(bits(th.data<float>()[2]), bits(-1.f));
  for (int i = 0; i < 15; ++i) EXPECT_EQ(counts.data<int32_t>()[i], 0);
  a.topk = 4;  // r = 4: row 0's NaN (canonical bits), row 2 and 3 have fewer: -inf
  thresholds_from_sample(a);
  EXPECT_EQ(bits(th.data<float>()[0]), 0x7fc00000u);
  EXPECT_EQ(th.data<float>()[2], -kInf);
  EXPECT_EQ(th.data<float>()[3], -kInf);
  EXPECT_EQ(bits(th.data<float>()[4]), 0x7fc00000u);  // 5, 3, -2, then NaN
  a.topk = 3;
  a.sample_stride = 2;
  a.oversample = 2.0;  // r = 3
  thresholds_from_sample(a);
  EXPECT_EQ(th.data<float>()[1], 1.f);
  a.topk = 1;
  a.oversample = 1.0;  // r = ceil(0.5) = 1: row 2's best, -0, comes back as +0
  thresholds_from_sample(a);
  EXPECT_EQ(bits(th.data<float>()[2]), bits(0.f));
}

TEST(SdsaArgs, EveryBadInputIsAnErrorNamingTheArgument) {
  SdsaShape sh;
  sh.dim = 32;
  sh.seq_lens = {20, 5};
  sh.row_requests = {1, 0};
  SdsaCase c = make_sdsa_case(sh, 4);
  HostTensor scores(DType::f32, {2, 20});
  IndexerScoresArgs valid;
  valid.rows = c.rows();
  valid.cache = c.cache();
  valid.scores = scores.t;
  auto run = [](const IndexerScoresArgs& a) { indexer_scores(a); };
  run(valid);
  HostTensor f32q(DType::f32, {2, 32}), q16(DType::bf16, {2, 16}), narrow(DType::f32, {2, 19});
  HostTensor bad_req = i32_tensor({2, 0}), neg_len = i32_tensor({-1, 0}), long_len = i32_tensor({6, 0});
  HostTensor long_seq = i32_tensor({20, 49}), bad_table(DType::i32, {2, 3}), i64ish(DType::f32, {2});
  std::memcpy(bad_table.data<int32_t>(), c.table.data<int32_t>(), bad_table.bytes());
  bad_table.data<int32_t>()[1] = -3;  // request 0's second page
  HostTensor sc(DType::fp8_e4m3, {2, 2});
  expect_arg_error(run, valid, [&](auto& a) { a.rows.query = QTensor(f32q.t); }, "query: dtype");
  expect_arg_error(run, valid, [&](auto& a) { a.rows.query = QTensor(q16.t); },
                   "query: head dim 16 must equal key_cache's 32");
  expect_arg_error(run, valid, [&](auto& a) { a.rows.query = QTensor(c.query.t, sc.t); },
                   "query.scale: only NVFP4 (fp4x2) values take a scale");
  expect_arg_error(run, valid, [&](auto& a) { a.cache.key_cache = QTensor(c.keys.t, sc.t); },
                   "key_cache.scale: only NVFP4");
  expect_arg_error(run, valid, [&](auto& a) { a.rows.row_requests = bad_req.t; },
                   "row_requests: row 0 names request 2, outside [0, B = 2)");
  expect_arg_error(run, valid, [&](auto& a) { a.rows.row_requests = i64ish.t; }, "row_requests: dtype");
  expect_arg_error(run, valid, [&](auto& a) { a.rows.row_lens = neg_len.t; },
                   "row_lens: row 0 must be in [0, seq_lens[1] = 5], got -1");
  expect_arg_error(run, valid, [&](auto& a) { a.rows.row_lens = long_len.t; }, "row_lens: row 0");
  expect_arg_error(run, valid, [&](auto& a) { a.cache.seq_lens = long_seq.t; },
                   "seq_lens: entry 1 must be in [0, W * page_size = 48], got 49");
  expect_arg_error(run, valid, [&](auto& a) { a.cache.block_table = bad_table.t; },
                   "block_table: page id -3 out of range [0, 5) at (request 0, column 1)");
  expect_arg_error(run, valid, [&](auto& a) { a.scores = narrow.t; },
                   "scores: 19 columns cannot hold a row of 20 keys");
  expect_arg_error(run, valid, [&](auto& a) { a.scores = c.requests.t; }, "scores: dtype");
  expect_arg_error(run, valid, [&](auto& a) { a.cache.seq_lens = Tensor(); }, "seq_lens: ");
  expect_arg_error(run, valid, [&](auto& a) { a.scores.device = {DeviceType::cuda, 0}; },
                   "indexer_scores: scores is on cuda:0, but query on cpu; all on one device");
  expect_arg_error(run, valid, [&](auto& a) { a.rows.query.values.device = {DeviceType::cuda, 0}; },
                   "indexer_scores: row_requests is on cpu, but query on cuda:0");
  // NVFP4 rules.
  SdsaShape fsh = sh;
  fsh.fp4_keys = fsh.fp4_query = true;
  SdsaCase f = make_sdsa_case(fsh, 4);
  IndexerScoresArgs fvalid = valid;
  fvalid.rows = f.rows();
  fvalid.cache = f.cache();
  run(fvalid);
  HostTensor short_sc(DType::fp8_e4m3, {2, 1});
  expect_arg_error(run, fvalid, [&](auto& a) { a.rows.query.scale = short_sc.t; },
                   "query.scale: last dim must be D / 16 = 2");
  expect_arg_error(run, fvalid, [&](auto& a) { a.rows.query.scale = Tensor(); }, "query.scale: ");
  expect_arg_error(run, fvalid, [&](auto& a) { a.cache.key_cache.global_scale = 0.f; },
                   "key_cache.global_scale: must be finite and > 0");

  // The select's stores.
  Stores st(2, 4, 2, 3);
  ThresholdSelectArgs sel;
  sel.rows = c.rows();
  sel.cache = c.cache();
  sel.thresholds = st.thresholds.t;
  sel.candidates = st.candidates.t;
  sel.ties = st.ties.t;
  sel.counts = st.counts.t;
  auto select = [](const ThresholdSelectArgs& a) { indexer_threshold_select(a); };
  HostTensor cand0(DType::i32, {2, 0, 2}), cand3(DType::i32, {2, 4, 3}), ties1(DType::i32, {1, 2});
  HostTensor counts2(DType::i32, {2, 2}), th3(DType::f32, {3});
  expect_arg_error(select, sel, [&](auto& a) { a.candidates = cand0.t; },
                   "candidates: must be [T = 2, C >= 1, 2] (position, score bits)");
  expect_arg_error(select, sel, [&](auto& a) { a.candidates = cand3.t; }, "candidates: must be");
  expect_arg_error(select, sel, [&](auto& a) { a.ties = ties1.t; }, "ties: must be [T = 2, Ct]");
  expect_arg_error(select, sel, [&](auto& a) { a.counts = counts2.t; }, "counts: shape");
  expect_arg_error(select, sel, [&](auto& a) { a.thresholds = th3.t; }, "thresholds: shape");
  st.counts.data<int32_t>()[4] = 1;
  expect_error([&] { select(sel); }, "counts: must be zero on entry (thresholds_from_sample zeroes "
               "them), got (0, 1, 0) for row 1");

  // top_k_from_candidates.
  st.counts.data<int32_t>()[4] = -1;
  TopKFromCandidatesArgs tk;
  tk.candidates = st.candidates.t;
  tk.ties = st.ties.t;
  tk.counts = st.counts.t;
  tk.topk = 3;
  tk.ids = st.ids.t;
  tk.row_status = st.status.t;
  auto top = [](const TopKFromCandidatesArgs& a) { top_k_from_candidates(a); };
  HostTensor zero(DType::i32, {2, 3});
  std::memset(zero.data<int32_t>(), 0, zero.bytes());
  top(TopKFromCandidatesArgs{tk.candidates, tk.ties, zero.t, 3, tk.ids, tk.row_status});
  expect_error([&] { top(tk); }, "counts: row 1 must be >= 0, got (0, -1, 0)");
  expect_arg_error(top, tk, [&](auto& a) { a.topk = 0; }, "topk: must be >= 1, got 0");
  expect_arg_error(top, tk, [&](auto& a) { a.topk = 4; }, "ids: shape");
  expect_arg_error(top, tk, [&](auto& a) { a.row_status = th3.t; }, "row_status: dtype");
  expect_arg_error(top, tk, [&](auto& a) { a.candidates = Tensor(); }, "candidates: ");

  // gather_key_sample.
  HostTensor sample(DType::bf16, {2, 4, 32}), sample_lens(DType::i32, {2});
  const HostTensor offs = i32_tensor({0, 5});
  GatherKeySampleArgs g;
  g.cache = c.cache();
  g.stride = 5;
  g.sample = QTensor(sample.t);
  g.sample_lens = sample_lens.t;
  auto gather = [](const GatherKeySampleArgs& a) { gather_key_sample(a); };
  gather(g);
  HostTensor small(DType::bf16, {2, 3, 32}), f16s(DType::f16, {2, 4, 32});
  expect_arg_error(gather, g, [&](auto& a) { a.stride = 0; }, "stride: must be >= 1, got 0");
  expect_arg_error(gather, g, [&](auto& a) { a.offsets = offs.t; },
                   "offsets: entry 1 must be in [0, stride = 5), got 5");
  expect_arg_error(gather, g, [&](auto& a) { a.sample = QTensor(small.t); },
                   "sample: S = 3 cannot hold request 0's 4 samples (20 keys, stride 5)");
  expect_arg_error(gather, g, [&](auto& a) { a.sample = QTensor(f16s.t); }, "sample: dtype");
  expect_arg_error(gather, g, [&](auto& a) { a.sample_lens = Tensor(); }, "sample_lens: ");

  // thresholds_from_sample.
  HostTensor th(DType::f32, {2}), cnt(DType::i32, {2, 3});
  ThresholdsFromSampleArgs ts;
  ts.sample_scores = scores.t;
  ts.topk = 4;
  ts.sample_stride = 2;
  ts.thresholds = th.t;
  ts.counts = cnt.t;
  auto thresholds = [](const ThresholdsFromSampleArgs& a) { thresholds_from_sample(a); };
  thresholds(ts);
  expect_arg_error(thresholds, ts, [&](auto& a) { a.sample_stride = 0; },
                   "sample_stride: must be >= 1, got 0");
  expect_arg_error(thresholds, ts, [&](auto& a) { a.topk = -2; }, "topk: must be >= 1, got -2");
  expect_arg_error(thresholds, ts, [&](auto& a) { a.oversample = 0.5; },
                   "oversample: must be in [1, 2^20], got 0.5");
  expect_arg_error(thresholds, ts, [&](auto& a) { a.oversample = NAN; }, "oversample: ");
  expect_arg_error(thresholds, ts, [&](auto& a) { a.counts = counts2.t; }, "counts: shape");
  expect_arg_error(thresholds, ts, [&](auto& a) { a.thresholds = th3.t; }, "thresholds: shape");

  // quantize_write_index_qk_nvfp4.
  HostTensor key(DType::f32, {3, 32}), cache(DType::fp4x2, {2, 4, 16}), cache_sc(DType::fp8_e4m3, {2, 4, 2});
  HostTensor qout(DType::fp4x2, {2, 16}), qout_sc(DType::fp8_e4m3, {2, 2}), key24(DType::f32, {3, 24});
  const HostTensor slots = i32_tensor({1, -4, 7}), repeated = i32_tensor({1, 5, 1}), past = i32_tensor({8, 0, 1});
  QuantizeIndexQKArgs w;
  w.key = key.t;
  w.slots = slots.t;
  w.key_cache = QTensor(cache.t, cache_sc.t);
  w.query = f32q.t;
  w.query_out = QTensor(qout.t, qout_sc.t);
  auto write = [](const QuantizeIndexQKArgs& a) { quantize_write_index_qk_nvfp4(a); };
  write(w);
  expect_arg_error(write, w, [&](auto& a) { a.slots = repeated.t; },
                   "slots: slot 1 given twice (entries 0 and 2)");
  expect_arg_error(write, w, [&](auto& a) { a.slots = past.t; },
                   "slots: entry 0 = 8 is past the cache's 8 slots");
  expect_arg_error(write, w, [&](auto& a) { a.key = key24.t; },
                   "key: D must be a positive multiple of 16");
  expect_arg_error(write, w, [&](auto& a) { a.key_cache.global_scale = INFINITY; },
                   "key_cache.global_scale: must be finite and > 0");
  expect_arg_error(write, w, [&](auto& a) { a.key_cache.scale = Tensor(); }, "key_cache.scale: ");
  expect_arg_error(write, w, [&](auto& a) { a.query_out = QTensor(cache.t, cache_sc.t); },
                   "query_out: ");
  expect_arg_error(write, w, [&](auto& a) { a.key = Tensor(); }, "slots, key_cache: given without key");
  expect_arg_error(write, w, [&](auto& a) { a.query = Tensor(); }, "query_out: given without query");
  expect_arg_error(write, QuantizeIndexQKArgs{}, [](auto&) {},
                   "quantize_write_index_qk_nvfp4: give key (with slots and key_cache) or query");
}

}  // namespace
}  // namespace msa::test
