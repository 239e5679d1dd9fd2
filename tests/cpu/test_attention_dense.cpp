// CPU dense-attention semantics (docs/semantics.md, Dense attention; include/msa/attention.h):
// per-batch causal offsets, key masks per batch and per query, soft-cap, head dims 1-256 and GQA
// groups 1-16 against the brute force of support/attention_problem.h; paged == flat bit for bit;
// masks with sparse selections; empty batches; one test per input rule, CUDA's refusals included.
#include <gtest/gtest.h>

#include <climits>
#include <cstring>
#include <random>

#include "support/attention_problem.h"

namespace msa::test {
namespace {

// The visibility of one call as host data (for the reference) and as the tensors attention takes.
struct VisArgs {
  Visibility vis;
  std::optional<HostTensor> offset, mask;

  // Per-batch offsets.
  void set_offsets(std::vector<int32_t> off) {
    vis.causal_offset = off;
    offset.emplace(i32_tensor(off));
  }
  // A random mask (each key kept with probability `keep`) of `rows` rows and lk_max columns;
  // bool masks hold 0 / 1, u8 masks any nonzero byte for a kept key.
  void set_random_mask(int64_t rows, int64_t lk_max, bool per_query, DType dtype, double keep,
                       unsigned seed) {
    std::mt19937 rng(seed), bytes(seed + 1);  // the kept keys depend on the seed alone
    std::bernoulli_distribution kept(keep);
    std::uniform_int_distribution<int> nonzero(1, 255);
    vis.per_query = per_query;
    vis.lk_max = lk_max;
    vis.mask.assign(size_t(rows * lk_max), 0);
    mask.emplace(dtype, std::vector<int64_t>{rows, lk_max});
    for (int64_t i = 0; i < rows * lk_max; ++i) {
      const bool k = kept(rng);
      vis.mask[size_t(i)] = k;
      mask->data<uint8_t>()[i] = !k ? 0 : dtype == DType::boolean ? 1 : uint8_t(nonzero(bytes));
    }
  }
  void apply(AttentionArgs& a, KeyMaskRows rows = KeyMaskRows::from_shape) const {
    if (offset) a.causal_offset = offset->t;
    if (mask) a.key_mask = mask->t;
    a.key_mask_rows = rows;
  }
};

int64_t longest(const std::vector<int32_t>& v) {
  return v.empty() ? 0 : *std::max_element(v.begin(), v.end());
}

Outputs run_dense(const Problem& p, const KVCache& kv, const HostTensor* q2k,
                  const AttentionParams& prm, const VisArgs& v,
                  KeyMaskRows rows = KeyMaskRows::from_shape) {
  Outputs o(p.out_dtype(), p.total_q(), p.hq, p.dim);
  AttentionArgs a = make_args(p, kv, o, q2k, prm);
  v.apply(a, rows);
  attention_forward(a);
  return o;
}

void expect_reference(const Problem& p, const AttentionParams& prm, const VisArgs& v,
                      KeyMaskRows rows = KeyMaskRows::from_shape) {
  expect_matches(run_dense(p, p.flat_kv(), nullptr, prm, v, rows),
                 reference_attention(p, nullptr, 0, prm, v.vis), prm.temperature > 0);
}

// ---------------------------------- causal offsets ----------------------------------

TEST(DenseAttention, CausalOffsetsMatchBruteForce) {
  const Problem p = make_problem({7, 20, 1, 12}, {30, 20, 9, 5}, 4, 2, 32, 10);
  AttentionParams prm;
  prm.temperature = 0.5f;
  const std::vector<std::vector<int32_t>> offsets = {
      {0, 0, 0, 0},            // query i sees keys 0..i (top-left)
      {23, -3, 8, -12},        // bottom-right for batch 0, partial hiding elsewhere
      {-1000, 5, INT32_MIN, 2},  // every key hidden in batches 0 and 2
      {INT32_MAX, INT32_MAX - 1, 1 << 30, 100},  // non-causal: no overflow near INT32_MAX
  };
  for (const auto& off : offsets) {
    SCOPED_TRACE(::testing::PrintToString(off));
    VisArgs v;
    v.set_offsets(off);
    expect_reference(p, prm, v);
  }
}

TEST(DenseAttention, OffsetsEqualTheirCausalAndNonCausalForms) {
  const Problem p = make_problem({7, 20, 3}, {30, 20, 9}, 4, 1, 64, 20);
  AttentionParams causal;
  VisArgs bottom_right, huge, hide_all;
  bottom_right.set_offsets({30 - 7, 0, 9 - 3});
  huge.set_offsets({INT32_MAX, INT32_MAX, INT32_MAX});
  hide_all.set_offsets({-7, -20, INT32_MIN});
  expect_same_bits(run_dense(p, p.flat_kv(), nullptr, causal, bottom_right),
                   run_dense(p, p.flat_kv(), nullptr, causal, {}));
  AttentionParams full;
  full.causal = false;
  expect_same_bits(run_dense(p, p.flat_kv(), nullptr, causal, huge),
                   run_dense(p, p.flat_kv(), nullptr, full, {}));
  // An offset of -Lq_b (or less) hides every key from every query of batch b.
  const Outputs o = run_dense(p, p.flat_kv(), nullptr, causal, hide_all);
  for (int64_t i = 0; i < o.out.t.numel(); ++i) ASSERT_EQ(load(o.out.t, i), 0.0) << i;
  for (int64_t i = 0; i < o.lse.t.numel(); ++i) ASSERT_EQ(o.lse.data<float>()[i], -kInf) << i;
}

// ---------------------------------- key masks ----------------------------------

TEST(DenseAttention, KeyMasksMatchBruteForce) {
  const Problem p = make_problem({5, 9, 1}, {40, 9, 70}, 8, 2, 32, 30);
  unsigned seed = 31;
  for (DType dt : {DType::boolean, DType::u8})
    for (bool per_query : {false, true})
      for (bool causal : {true, false}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + (per_query ? " per query" : " per batch") +
                     (causal ? " causal" : " non-causal"));
        AttentionParams prm;
        prm.causal = causal;
        VisArgs v;
        // Lk_max longer than every batch: the columns past a batch's keys are never read.
        v.set_random_mask(per_query ? p.total_q() : p.batch(), 75, per_query, dt, 0.6, seed++);
        if (causal) v.set_offsets({36, 2, 69});
        expect_reference(p, prm, v);
      }
}

TEST(DenseAttention, U8MaskBytesCountAsSetWhenNonzero) {
  const Problem p = make_problem({6, 4}, {50, 20}, 2, 2, 32, 40);
  VisArgs as_bool, as_u8;
  as_bool.set_random_mask(p.total_q(), 50, true, DType::boolean, 0.5, 41);
  as_u8.set_random_mask(p.total_q(), 50, true, DType::u8, 0.5, 41);  // same keys, other bytes
  ASSERT_EQ(as_bool.vis.mask, as_u8.vis.mask);
  expect_same_bits(run_dense(p, p.flat_kv(), nullptr, {}, as_bool),
                   run_dense(p, p.flat_kv(), nullptr, {}, as_u8));
}

TEST(DenseAttention, WholeFalseMaskRowsGiveZeroAndMinusInf) {
  const Problem p = make_problem({3, 4}, {10, 12}, 2, 1, 16, 50);
  AttentionParams prm;
  prm.temperature = 2.f;
  VisArgs v;
  v.set_random_mask(p.total_q(), 12, true, DType::boolean, 0.7, 51);
  std::fill_n(v.mask->data<uint8_t>() + 1 * 12, 12, 0);  // token 1 (batch 0)
  std::fill_n(v.mask->data<uint8_t>() + 5 * 12, 12, 0);  // token 5 (batch 1)
  std::fill_n(v.vis.mask.begin() + 1 * 12, 12, 0);
  std::fill_n(v.vis.mask.begin() + 5 * 12, 12, 0);
  const Outputs o = run_dense(p, p.flat_kv(), nullptr, prm, v);
  for (int64_t t : {1, 5}) {
    for (int64_t i = 0; i < 2 * 16; ++i) EXPECT_EQ(load(o.out.t, t * 2 * 16 + i), 0.0);
    for (int64_t h = 0; h < 2; ++h) {
      EXPECT_EQ(o.lse.data<float>()[h * p.total_q() + t], -kInf);
      EXPECT_EQ(o.tlse.data<float>()[h * p.total_q() + t], -kInf);
    }
  }
  expect_matches(o, reference_attention(p, nullptr, 0, prm, v.vis), true);
}

// Rows of key_mask with stride 0 (one row broadcast to every query, as torch's expand gives) and
// rows padded past Lk_max.
TEST(DenseAttention, StridedMasks) {
  const Problem p = make_problem({4, 6}, {30, 17}, 4, 2, 32, 60);
  VisArgs row;
  row.set_random_mask(1, 30, false, DType::boolean, 0.5, 61);
  VisArgs v;
  v.vis = row.vis;
  v.vis.per_query = true;
  v.vis.mask.clear();
  for (int64_t t = 0; t < p.total_q(); ++t) v.vis.mask.insert(v.vis.mask.end(), row.vis.mask.begin(), row.vis.mask.end());
  v.mask.emplace(DType::boolean, std::vector<int64_t>{p.total_q(), 30}, std::vector<int64_t>{0, 1});
  std::memcpy(v.mask->data<uint8_t>(), row.mask->data<uint8_t>(), 30);
  expect_reference(p, {}, v);
  VisArgs padded;
  padded.set_random_mask(p.batch(), 30, false, DType::u8, 0.5, 62);
  HostTensor wide(DType::u8, {p.batch(), 30}, {48, 1});
  for (int64_t b = 0; b < p.batch(); ++b)
    std::memcpy(wide.data<uint8_t>() + b * 48, padded.mask->data<uint8_t>() + b * 30, 30);
  padded.mask = std::move(wide);
  expect_reference(p, {}, padded);
}

// ---------------------------------- soft-cap ----------------------------------

TEST(DenseAttention, SoftCapMatchesBruteForce) {
  const Problem p = make_problem({9, 3}, {40, 70}, 4, 2, 64, 70);
  for (float cap : {0.5f, 3.f, 50.f}) {
    SCOPED_TRACE(cap);
    AttentionParams prm;
    prm.soft_cap = cap;
    prm.softmax_scale = 0.5f;  // large scores: the cap bites
    prm.temperature = 0.7f;
    VisArgs v;
    v.set_random_mask(p.batch(), 70, false, DType::boolean, 0.8, 71);
    expect_reference(p, prm, v);
  }
}

// HandCase's one query over two keys, scores 0.5 and 1, cap 0.5: the capped scores are
// 0.5 tanh(1) and 0.5 tanh(2).
TEST(DenseAttention, SoftCapHandComputed) {
  AttentionParams prm;
  prm.softmax_scale = 1.f;
  prm.soft_cap = 0.5f;
  const Outputs o = HandCase(1).run(prm);
  const double e0 = std::exp(0.5 * std::tanh(1.0)), e1 = std::exp(0.5 * std::tanh(2.0));
  EXPECT_NEAR(o.lse.data<float>()[0], std::log(e0 + e1), 1e-6);
  for (int d = 0; d < 8; ++d) {
    const double want = (e0 * (d + 1) - e1 * (d + 1) / 2) / (e0 + e1);
    EXPECT_NEAR(load(o.out.t, d), want, std::fabs(want) / 256) << "d = " << d;
  }
}

// ---------------------------------- head dims, GQA ----------------------------------

TEST(DenseAttention, HeadDimsAndGroups) {
  struct Case {
    int64_t dim, hq, hkv;
    DType dtype;
  };
  // A curated matrix: every head dim of the dense family and every GQA group of section 1 once,
  // plus head dims whose rows are not 16-byte aligned (the CPU reads elements).
  // Groups past the sparse path's: 3, 5, 7, 12 and 48 (dense attention takes any G up to 128).
  const std::vector<Case> cases = {{32, 16, 1, DType::bf16}, {64, 16, 2, DType::f16},
                                   {128, 4, 2, DType::bf16}, {256, 2, 2, DType::f16},
                                   {128, 8, 1, DType::bf16}, {1, 2, 1, DType::bf16},
                                   {5, 3, 3, DType::f16},    {96, 4, 4, DType::bf16},
                                   {64, 6, 2, DType::bf16},  {128, 10, 2, DType::f16},
                                   {32, 7, 1, DType::bf16},  {16, 24, 2, DType::bf16},
                                   {8, 96, 2, DType::f16}};
  unsigned seed = 80;
  for (const Case& c : cases) {
    SCOPED_TRACE("D " + std::to_string(c.dim) + ", Hq " + std::to_string(c.hq) + ", Hkv " +
                 std::to_string(c.hkv));
    const Problem p = make_problem({5, 11}, {37, 11}, c.hq, c.hkv, c.dim, seed++, c.dtype);
    AttentionParams prm;
    prm.soft_cap = 20.f;
    VisArgs v;
    v.set_offsets({34, 3});
    v.set_random_mask(p.total_q(), 37, true, DType::boolean, 0.7, seed++);
    expect_reference(p, prm, v);
  }
}

// k rows of 65 elements (130 bytes, not a multiple of 16): accepted on the CPU, the same bits as
// a contiguous copy.
TEST(DenseAttention, UnalignedRowStridesOnTheCpu) {
  const Problem p = make_problem({4, 2}, {300, 20}, 4, 2, 64, 90);
  HostTensor k_odd(DType::bf16, {320, 2, 64}, {2 * 65, 65, 1});
  for (int64_t t = 0; t < 320; ++t)
    for (int64_t h = 0; h < 2; ++h)
      std::memcpy(k_odd.data<uint16_t>() + k_odd.offset({t, h, 0}),
                  p.k.data<uint16_t>() + p.k.offset({t, h, 0}), 64 * 2);
  KVCache kv = p.flat_kv();
  kv.k = k_odd.t;
  expect_same_bits(run_dense(p, kv, nullptr, {}, {}), run_dense(p, p.flat_kv(), nullptr, {}, {}));
}

// Without the 16-byte row rule the element alignment still holds: a bf16 view one byte past an
// aligned address is an error (found by fuzzing: k, v and out had no dtype-size check of their
// own).
TEST(DenseAttention, MisalignedBasePointersAreErrors) {
  const Problem p = make_problem({4, 2}, {30, 20}, 4, 2, 16, 95);
  HostTensor bytes(DType::u8, {50 * 2 * 16 * 2 + 2});
  const Tensor k_odd(bytes.data<uint8_t>() + 1, DType::bf16, {50, 2, 16});
  Outputs o(DType::bf16, p.total_q(), 4, 16);
  AttentionArgs a = make_args(p, p.flat_kv(), o, nullptr, {});
  a.kv.k = k_odd;
  expect_error([&] { attention_forward(a); }, "k: base pointer must be 2-byte aligned");
  a = make_args(p, p.flat_kv(), o, nullptr, {});
  a.out = Tensor(bytes.data<uint8_t>() + 1, DType::bf16, {6, 4, 16});
  expect_error([&] { attention_forward(a); }, "out: base pointer must be 2-byte aligned");
}

// ---------------------------------- paged, sparse, empty ----------------------------------

// Offsets and masks index logical keys: a paged cache (any layout, page size, padded rows) gives
// the flat result bit for bit, dense and sparse.
TEST(DenseAttention, PagedEqualsFlatWithOffsetsMasksAndSoftCap) {
  const Problem p = make_problem({33, 1, 50}, {301, 16, 50}, 4, 2, 64, 100);
  const std::vector<int32_t> ids = random_q2k(p, 3, 64, 101);
  const HostTensor q2k = q2k_tensor(ids, 2, p.total_q(), 3);
  AttentionParams prm;
  prm.kv_block_size = 64;
  prm.soft_cap = 5.f;
  VisArgs v;
  v.set_offsets({290, 0, 10});
  v.set_random_mask(p.total_q(), 301, true, DType::u8, 0.7, 102);
  const Outputs flat_dense = run_dense(p, p.flat_kv(), nullptr, prm, v);
  const Outputs flat_sparse = run_dense(p, p.flat_kv(), &q2k, prm, v);
  expect_matches(flat_dense, reference_attention(p, nullptr, 0, prm, v.vis));
  expect_matches(flat_sparse, reference_attention(p, &ids, 3, prm, v.vis));
  unsigned seed = 103;
  for (KVLayout layout : {KVLayout::paged_nhd, KVLayout::paged_hnd})
    for (int64_t page_size : {16, 128}) {
      SCOPED_TRACE(std::string(kv_layout_name(layout)) + " page " + std::to_string(page_size));
      const PagedKV paged = make_paged(p, layout, page_size, seed++, page_size == 16 ? 8 : 0);
      expect_same_bits(run_dense(p, paged.cache(), nullptr, prm, v), flat_dense);
      expect_same_bits(run_dense(p, paged.cache(), &q2k, prm, v), flat_sparse);
    }
}

// The mask ANDs with block and token selections; the temperature LSE follows the same keys.
TEST(DenseAttention, SparseSelectionsWithMasks) {
  const Problem p = make_problem({12, 7}, {500, 90}, 8, 2, 32, 110);
  unsigned seed = 111;
  for (int blk : {128, 64, 1}) {
    SCOPED_TRACE("kv_block_size " + std::to_string(blk));
    const int64_t topk = blk == 1 ? 40 : 3;
    AttentionParams prm;
    prm.kv_block_size = blk;
    prm.temperature = 1.5f;
    const std::vector<int32_t> ids = random_q2k(p, topk, blk, seed++);
    const HostTensor q2k = q2k_tensor(ids, 2, p.total_q(), topk);
    VisArgs v;
    v.set_offsets({495, 100});
    v.set_random_mask(p.batch(), 500, false, DType::boolean, 0.5, seed++);
    expect_matches(run_dense(p, p.flat_kv(), &q2k, prm, v),
                   reference_attention(p, &ids, topk, prm, v.vis), true);
  }
}

TEST(DenseAttention, EmptyBatches) {
  const Problem p = make_problem({0, 5, 4, 0}, {100, 0, 40, 0}, 2, 1, 16, 120);
  AttentionParams prm;
  prm.soft_cap = 2.f;
  VisArgs v;
  v.set_offsets({-5, 7, 36, 0});
  v.set_random_mask(p.batch(), 100, false, DType::u8, 0.8, 121);
  expect_reference(p, prm, v);
  VisArgs none_long;  // Lk_max 0 when no batch has a key
  const Problem q = make_problem({3, 2}, {0, 0}, 2, 2, 16, 122);
  none_long.set_random_mask(q.total_q(), 0, true, DType::boolean, 0.5, 123);
  expect_reference(q, prm, none_long);
}

// ---------------------------------- rules ----------------------------------

struct RuleFixture {
  Problem p = make_problem({4, 3}, {20, 9}, 4, 2, 32, 130);
  Outputs o{DType::bf16, 7, 4, 32};
  HostTensor offset = i32_tensor({16, 6});
  HostTensor mask{DType::boolean, {7, 20}};
  AttentionArgs args() const {
    AttentionArgs a = make_args(p, p.flat_kv(), o, nullptr, {});
    a.causal_offset = offset.t;
    a.key_mask = mask.t;
    return a;
  }
};

void forward(const AttentionArgs& a) { attention_forward(a); }

TEST(DenseAttentionRules, SoftCap) {
  RuleFixture f;
  const AttentionArgs valid = f.args();
  forward(valid);
  for (float bad : {-1.f, NAN, INFINITY})
    expect_arg_error(forward, valid, [&](AttentionArgs& a) { a.params.soft_cap = bad; },
                     "params.soft_cap: must be finite and >= 0 (0 means no soft-cap), got ");
}

TEST(DenseAttentionRules, CausalOffset) {
  RuleFixture f;
  const AttentionArgs valid = f.args();
  expect_arg_error(forward, valid, [](AttentionArgs& a) { a.params.causal = false; },
                   "causal_offset: given, so params.causal must be true");
  const HostTensor three = i32_tensor({1, 2, 3});
  expect_arg_error(forward, valid, [&](AttentionArgs& a) { a.causal_offset = three.t; },
                   "causal_offset: shape must be [2], got i32[3] on cpu");
  const HostTensor f32(DType::f32, {2});
  expect_arg_error(forward, valid, [&](AttentionArgs& a) { a.causal_offset = f32.t; },
                   "causal_offset: dtype must be i32, got f32");
  const HostTensor strided(DType::i32, {2}, {2});
  expect_arg_error(forward, valid, [&](AttentionArgs& a) { a.causal_offset = strided.t; },
                   "causal_offset: must be contiguous");
  expect_arg_error(forward, valid, [](AttentionArgs& a) { a.causal_offset.device = {DeviceType::cuda, 0}; },
                   "causal_offset: must be on cpu, got cuda:0");
}

TEST(DenseAttentionRules, KeyMask) {
  RuleFixture f;
  const AttentionArgs valid = f.args();
  const HostTensor f32(DType::f32, {7, 20});
  expect_arg_error(forward, valid, [&](AttentionArgs& a) { a.key_mask = f32.t; },
                   "key_mask: dtype must be bool or u8, got f32");
  const HostTensor flat(DType::boolean, {140});
  expect_arg_error(forward, valid, [&](AttentionArgs& a) { a.key_mask = flat.t; },
                   "key_mask: must have 2 dims, got bool[140] on cpu");
  const HostTensor rows5(DType::boolean, {5, 20});
  expect_arg_error(forward, valid, [&](AttentionArgs& a) { a.key_mask = rows5.t; },
                   "key_mask: shape must be [B = 2, Lk_max] (per batch) or [total_q = 7, Lk_max] "
                   "(per query), got bool[5, 20] on cpu");
  expect_arg_error(forward, valid, [](AttentionArgs& a) { a.key_mask_rows = KeyMaskRows::per_batch; },
                   "key_mask: shape must be [2, *], got bool[7, 20] on cpu");
  const HostTensor per_batch(DType::boolean, {2, 20});
  expect_arg_error(forward, valid, [&](AttentionArgs& a) {
    a.key_mask = per_batch.t;
    a.key_mask_rows = KeyMaskRows::per_query;
  }, "key_mask: shape must be [7, *], got bool[2, 20] on cpu");
  const HostTensor short_mask(DType::u8, {2, 19});
  expect_arg_error(forward, valid, [&](AttentionArgs& a) { a.key_mask = short_mask.t; },
                   "key_mask: Lk_max = 19 (its last dim) is less than the 20 keys of batch 0");
  const HostTensor col_major(DType::boolean, {7, 20}, {1, 7});
  expect_arg_error(forward, valid, [&](AttentionArgs& a) { a.key_mask = col_major.t; },
                   "key_mask: last dim must be contiguous (stride 1), got stride 7");
  expect_arg_error(forward, valid, [](AttentionArgs& a) { a.key_mask.device = {DeviceType::cuda, 0}; },
                   "key_mask: must be on cpu, got cuda:0");
}

// One query per batch and B = total_q: the mask's rows could be either kind, so the call must
// say which; both kinds then give the same result (each batch's one query).
TEST(DenseAttentionRules, AmbiguousMaskRowsNeedTheKind) {
  const Problem p = make_problem({1, 1, 1}, {10, 30, 4}, 2, 1, 16, 140);
  VisArgs v;
  v.set_random_mask(3, 30, false, DType::boolean, 0.6, 141);
  expect_error([&] { run_dense(p, p.flat_kv(), nullptr, {}, v); },
               "key_mask: bool[3, 30] on cpu has B = total_q = 3 rows, so it may be per batch or "
               "per query: set key_mask_rows to per_batch or per_query");
  const Outputs batch_rows = run_dense(p, p.flat_kv(), nullptr, {}, v, KeyMaskRows::per_batch);
  expect_same_bits(batch_rows, run_dense(p, p.flat_kv(), nullptr, {}, v, KeyMaskRows::per_query));
  expect_matches(batch_rows, reference_attention(p, nullptr, 0, {}, v.vis));
}

// CUDA does not run these yet (causal offsets, the soft-cap and key masks it does:
// tests/cuda/test_sparse_fwd.cpp): each is refused by name before anything reaches the device
// (views of host memory marked as CUDA are never read; a CPU-only build refuses them the same
// way, before its no-CUDA error).
TEST(DenseAttentionRules, CudaRefusesWhatOnlyTheCpuRuns) {
  RuleFixture f;
  HostTensor q2k = q2k_tensor(std::vector<int32_t>(2 * 7, 0), 2, 7, 1);
  AttentionArgs cuda = make_args(f.p, f.p.flat_kv(), f.o, &q2k, {});
  const Device dev{DeviceType::cuda, 0};
  for (Tensor* t : {&cuda.q, &cuda.kv.k.values, &cuda.kv.v.values, &cuda.kv.cu_seqlens_k,
                    &cuda.cu_seqlens_q, &cuda.q2k, &cuda.out, &cuda.lse})
    t->device = dev;
  const auto refused = [&](auto change, const std::string& needle) {
    expect_arg_error(forward, cuda, change, needle);
    expect_arg_error([](const AttentionArgs& a) { (void)attention_workspace_bytes(a); }, cuda,
                     change, needle);
  };
  HostTensor q_odd(DType::bf16, {7, 4, 32}, {4 * 36, 36, 1});
  refused([&](AttentionArgs& a) {
    a.q = q_odd.t;
    a.q.device = dev;
  }, "q: stride of dim 1 (36 elements = 72 bytes) must be a multiple of 16 bytes");
}

}  // namespace
}  // namespace msa::test
