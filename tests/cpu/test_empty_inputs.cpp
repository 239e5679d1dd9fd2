// Legal empty inputs (docs/semantics.md, Conventions) with the strides producers give views of no
// elements: numpy 2 gives them all zero strides, so every op must accept a zero-stride view with
// no elements wherever it takes a contiguous or last-dim-contiguous one (B = 0, total_q = 0, as
// in an idle decode batch, total_k = 0, an empty tensor to quantize).
#include <gtest/gtest.h>

#include "support/attention_problem.h"
#include "support/expect_error.h"

namespace msa::test {
namespace {

// A view as numpy 2 exports it: all strides 0 when it has no elements (unchanged otherwise).
Tensor numpy_strides(Tensor t) {
  if (t.numel() == 0)
    for (int d = 0; d < t.ndim; ++d) t.strides[d] = 0;
  return t;
}

void numpy_strides(KVCache& kv) {
  for (QTensor* x : {&kv.k, &kv.v}) {
    x->values = numpy_strides(x->values);
    x->scale = numpy_strides(x->scale);
  }
  kv.cu_seqlens_k = numpy_strides(kv.cu_seqlens_k);
  kv.page_table = numpy_strides(kv.page_table);
  kv.seqused_k = numpy_strides(kv.seqused_k);
}

// attention_forward's arguments with every empty view zero-strided.
AttentionArgs numpy_args(const Problem& p, KVCache kv, const Outputs& o, const HostTensor* q2k,
                         const AttentionParams& prm = {}) {
  AttentionArgs a = make_args(p, kv, o, q2k, prm);
  a.q = numpy_strides(a.q);
  numpy_strides(a.kv);
  a.q2k = numpy_strides(a.q2k);
  a.out = numpy_strides(a.out);
  a.lse = numpy_strides(a.lse);
  a.tlse = numpy_strides(a.tlse);
  return a;
}

TEST(EmptyInputs, AttentionWithoutQueries) {
  // total_q = 0: one request of 40 keys and no query; dense and sparse.
  const Problem p = make_problem({0}, {40}, 4, 2, 16, 1);
  const HostTensor q2k(DType::i32, {2, 0, 4});
  for (const HostTensor* sel : {static_cast<const HostTensor*>(nullptr), &q2k}) {
    Outputs o(DType::bf16, 0, 4, 16);
    EXPECT_NO_THROW(attention_forward(numpy_args(p, p.flat_kv(), o, sel)));
  }
}

TEST(EmptyInputs, AttentionWithoutKeys) {
  // total_k = 0: every query sees no key, so out = 0 and lse = -inf (docs/semantics.md).
  const Problem p = make_problem({3, 2}, {0, 0}, 4, 2, 16, 2);
  Outputs o(DType::bf16, 5, 4, 16);
  attention_forward(numpy_args(p, p.flat_kv(), o, nullptr));
  expect_matches(o, reference_attention(p, nullptr, 0, {}));
  for (int64_t i = 0; i < 4 * 5; ++i) EXPECT_EQ(o.lse.data<float>()[i], -INFINITY);
}

TEST(EmptyInputs, AttentionWithoutRequests) {
  // B = 0: cu_seqlens [0], every other tensor empty.
  const Problem p = make_problem({}, {}, 4, 2, 16, 3);
  Outputs o(DType::bf16, 0, 4, 16);
  AttentionParams prm;
  prm.temperature = 0.5f;
  EXPECT_NO_THROW(attention_forward(numpy_args(p, p.flat_kv(), o, nullptr, prm)));
}

TEST(EmptyInputs, DecodeIdleBatch) {
  // Requests with no queries this step (total_q = 0) and a batch of no requests.
  const Problem idle = make_problem({0, 0}, {70, 20}, 4, 2, 32, 4);
  const Problem none = make_problem({}, {}, 4, 2, 32, 5);
  for (const Problem* p : {&idle, &none}) {
    const PagedKV paged = make_paged(*p, KVLayout::paged_nhd, 16, 6);
    DecodeShape s;
    s.batch = int(p->batch());
    s.num_q_heads = 4;
    s.num_kv_heads = 2;
    s.head_dim = 32;
    s.page_size = 16;
    s.max_pages = int(paged.page_table.t.shape[1]);
    DecodePlan plan;
    plan.plan(s, nullptr, Tensor());
    Outputs o(DType::bf16, 0, 4, 32);
    EXPECT_NO_THROW(plan.run(numpy_args(*p, paged.cache(), o, nullptr)));
  }
}

TEST(EmptyInputs, IndexerAndSelectionWithoutQueries) {
  // block_scores, select_topk and block_topk over one request of 300 keys and no query.
  const Problem p = make_problem({0}, {300}, 4, 2, 16, 7);
  KVCache kv = p.flat_kv();
  numpy_strides(kv);
  const Tensor cu_q = numpy_strides(p.cu_q.t);
  const HostTensor scores(DType::f32, {4, 3, 0}), q2k(DType::i32, {2, 0, 4});

  BlockScoresArgs bs;
  bs.q = QTensor(numpy_strides(p.q.t));
  bs.kv = kv;
  bs.cu_seqlens_q = cu_q;
  bs.scores = numpy_strides(scores.t);
  EXPECT_NO_THROW(block_scores(bs));

  TopKArgs tk;
  tk.scores = numpy_strides(scores.t);
  tk.cu_seqlens_q = cu_q;
  tk.kv = kv;
  tk.num_kv_heads = 2;
  tk.topk = 4;
  tk.q2k = numpy_strides(q2k.t);
  EXPECT_NO_THROW(select_topk(tk));

  BlockTopKArgs bt;
  bt.q = QTensor(numpy_strides(p.q.t));
  bt.kv = kv;
  bt.cu_seqlens_q = cu_q;
  bt.topk = 4;
  bt.q2k = numpy_strides(q2k.t);
  EXPECT_NO_THROW(block_topk(bt));
}

// An empty view may have any other sizes. Found by fuzzing: block_scores looped over an empty
// scores' nblk_max (2^62 steps), quantize and dequantize over T * H (which overflowed int64).
TEST(EmptyInputs, HugeSizesBesideAZeroOne) {
  const int64_t huge = int64_t(1) << 62;
  const Problem p = make_problem({0}, {300}, 4, 2, 16, 8);
  KVCache kv = p.flat_kv();
  BlockScoresArgs bs;
  bs.q = QTensor(p.q.t);
  bs.kv = kv;
  bs.cu_seqlens_q = p.cu_q.t;
  bs.scores = Tensor(nullptr, DType::f32, {4, huge, 0});
  EXPECT_NO_THROW(block_scores(bs));

  const int64_t big = int64_t(1) << 40;  // T * H = 2^80
  const Tensor x(nullptr, DType::f32, {big, big, 0});
  HostTensor scale(DType::f32, {1});
  const QTensor fp8(Tensor(nullptr, DType::fp8_e4m3, {big, big, 0}), scale.t);
  EXPECT_NO_THROW(quantize(x, QuantFormat::fp8_per_tensor, fp8));
  EXPECT_EQ(scale.data<float>()[0], 1.f);  // amax 0
  EXPECT_NO_THROW(dequantize(fp8, x));
  const QTensor nvfp4(Tensor(nullptr, DType::fp4x2, {big, big, 0}),
                      Tensor(nullptr, DType::fp8_e4m3, {big, big, 0}));
  EXPECT_NO_THROW(quantize(x, QuantFormat::nvfp4, nvfp4));
  EXPECT_NO_THROW(dequantize(nvfp4, x));

  // Sizes no request can use are errors, not overflows: a page table of 2^60 columns
  // (max_pages * page_size overflowed int64) and FP4 queries of 2^62 bytes a row (2^63 values).
  const HostTensor pool(DType::bf16, {1, 16, 2, 16}), no_lengths(DType::i32, {0});
  const HostTensor cu0 = i32_tensor({0});
  TopKArgs tk;
  tk.scores = Tensor(nullptr, DType::f32, {4, 1, 0});
  tk.cu_seqlens_q = cu0.t;
  tk.kv.layout = KVLayout::paged_nhd;
  tk.kv.k = QTensor(pool.t);
  tk.kv.page_table = Tensor(nullptr, DType::i32, {0, int64_t(1) << 60});
  tk.kv.seqused_k = no_lengths.t;
  tk.num_kv_heads = 2;
  tk.topk = 4;
  tk.q2k = Tensor(nullptr, DType::i32, {2, 0, 4});
  expect_error([&] { select_topk(tk); },
               "page_table: 1152921504606846976 columns of 16 keys are more than the 2^31 - 1 keys");
  BlockScoresArgs fp4 = bs;
  fp4.q = QTensor(Tensor(nullptr, DType::fp4x2, {0, 4, huge}),
                  Tensor(nullptr, DType::e8m0, {0, 4, 1}));
  expect_error([&] { block_scores(fp4); },
               "q: last dim of 4611686018427387904 bytes holds more FP4 values than int64 counts");
}

TEST(EmptyInputs, QuantizeNoTokens) {
  // x [0, 2, 32] in every format, and back.
  const HostTensor x(DType::f32, {0, 2, 32}), back(DType::f32, {0, 2, 32});
  struct Case {
    QuantFormat format;
    DType values, scale;
    std::vector<int64_t> values_shape, scale_shape;
  };
  for (const Case& c : {Case{QuantFormat::fp8_per_token, DType::fp8_e4m3, DType::f32, {0, 2, 32}, {0}},
                        Case{QuantFormat::fp8_per_token_head, DType::fp8_e4m3, DType::f32, {0, 2, 32}, {0, 2}},
                        Case{QuantFormat::nvfp4, DType::fp4x2, DType::fp8_e4m3, {0, 2, 16}, {0, 2, 2}},
                        Case{QuantFormat::mxfp4, DType::fp4x2, DType::e8m0, {0, 2, 16}, {0, 2, 1}}}) {
    SCOPED_TRACE(quant_format_name(c.format));
    const HostTensor values(c.values, c.values_shape), scale(c.scale, c.scale_shape);
    const QTensor q(numpy_strides(values.t), numpy_strides(scale.t));
    EXPECT_NO_THROW(quantize(numpy_strides(x.t), c.format, q));
    EXPECT_NO_THROW(dequantize(q, numpy_strides(back.t)));
  }
}

}  // namespace
}  // namespace msa::test
