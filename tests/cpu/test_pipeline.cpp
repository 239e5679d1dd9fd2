// The one-call pipeline (msa/pipeline.h) on the CPU: it equals block_topk followed by
// attention_forward bit for bit, leaves its selection readable at the start of the workspace,
// uses the optional indexer inputs, and names the workspace rule it needs.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "support/attention_problem.h"
#include "support/expect_error.h"

namespace msa::test {
namespace {

struct Manual {
  Outputs o;
  HostTensor q2k;
};

// The two calls the pipeline stands for, written out.
Manual by_hand(const Problem& p, const KVCache& kv, const QTensor& index_q, const QTensor& index_k,
            int topk, const AttentionParams& prm) {
  Manual r{Outputs(p.q.t.dtype, p.total_q(), p.hq, p.dim), HostTensor(DType::i32, {p.hkv, p.total_q(), topk})};
  BlockTopKArgs s;
  s.q = index_q;
  s.kv = kv;
  s.kv.k = index_k;
  s.kv.v = QTensor();
  s.cu_seqlens_q = p.cu_q.t;
  s.causal = prm.causal;
  s.kv_block_size = prm.kv_block_size;
  s.topk = topk;
  s.q2k = r.q2k.t;
  block_topk(s);
  attention_forward(make_args(p, kv, r.o, &r.q2k, prm));
  return r;
}

PipelineArgs pipeline_args(const Problem& p, const KVCache& kv, const Outputs& o, int topk,
                           const AttentionParams& prm) {
  PipelineArgs a;
  a.q = p.q.t;
  a.kv = kv;
  a.cu_seqlens_q = p.cu_q.t;
  a.topk = topk;
  a.params = prm;
  a.out = o.out.t;
  a.lse = o.lse.t;
  if (prm.temperature > 0) a.tlse = o.tlse.t;
  return a;
}

void expect_same(const HostTensor& a, const HostTensor& b, const char* what) {
  ASSERT_EQ(a.bytes(), b.bytes()) << what;
  EXPECT_EQ(0, std::memcmp(a.data<uint8_t>(), b.data<uint8_t>(), a.bytes())) << what << " differ";
}

// The selection of the serving geometry written out: block_scores on the index inputs (`index`'s
// q and k, 64-key blocks, nblk of them), then select_topk (top-4) over p's kv heads.
HostTensor selection_by_scores(const Problem& p, const Problem& index, const KVCache& kv, int64_t nblk) {
  HostTensor scores(DType::f32, {index.hq, nblk, p.total_q()}), q2k(DType::i32, {p.hkv, p.total_q(), 4});
  BlockScoresArgs sa;
  sa.q = index.q.t;
  sa.kv = kv;
  sa.kv.k = index.k.t;
  sa.kv.v = QTensor();
  sa.cu_seqlens_q = p.cu_q.t;
  sa.scores = scores.t;
  sa.kv_block_size = 64;
  block_scores(sa);
  TopKArgs ta;
  ta.scores = scores.t;
  ta.cu_seqlens_q = p.cu_q.t;
  ta.kv = kv;
  ta.num_kv_heads = int(p.hkv);
  ta.topk = 4;
  ta.kv_block_size = 64;
  ta.q2k = q2k.t;
  select_topk(ta);
  return q2k;
}

TEST(Pipeline, EqualsBlockTopKThenAttention) {
  struct Case {
    std::vector<int32_t> lq, lk;
    int64_t hq, hkv;
    int blk, topk;
    bool causal;
  };
  const Case cases[] = {
      {{200, 0, 77}, {450, 30, 77}, 8, 2, 64, 4, true},
      {{130}, {700}, 16, 1, 128, 3, false},
      {{40, 300}, {40, 250}, 4, 4, 128, 8, true},  // Lq > Lk: early queries see nothing
  };
  unsigned seed = 40;
  for (const Case& c : cases) {
    SCOPED_TRACE("case seed " + std::to_string(seed));
    const Problem p = make_problem(c.lq, c.lk, c.hq, c.hkv, 64, seed++);
    AttentionParams prm;
    prm.kv_block_size = c.blk;
    prm.causal = c.causal;
    prm.temperature = 0.7f;
    const KVCache kv = p.flat_kv();
    const Manual want = by_hand(p, kv, p.q.t, p.k.t, c.topk, prm);

    Outputs o(p.q.t.dtype, p.total_q(), p.hq, p.dim);
    PipelineArgs a = pipeline_args(p, kv, o, c.topk, prm);
    const size_t bytes = pipeline_workspace_bytes(a);
    EXPECT_GE(bytes, size_t(p.hkv * p.total_q() * c.topk * 4));
    HostTensor ws(DType::u8, {int64_t(bytes)});
    a.workspace = ws.t;
    sparse_attention_pipeline(a);
    expect_same(o.out, want.o.out, "out");
    expect_same(o.lse, want.o.lse, "lse");
    expect_same(o.tlse, want.o.tlse, "tlse");
    EXPECT_EQ(0, std::memcmp(ws.data<uint8_t>(), want.q2k.data<uint8_t>(), want.q2k.bytes()))
        << "q2k at the start of the workspace";
  }
}

// topK x kv_block_size >= total_k: every visible block is selected, so the pipeline attends
// densely (no q2k): the same bits as dense attention_forward and as the two calls, and the
// selection is still at the start of the workspace. One key short of that bound it stays sparse.
TEST(Pipeline, ShortRequestsRunDense) {
  for (const bool covered : {true, false}) {
    SCOPED_TRACE(covered ? "topK covers every block" : "one key past the bound");
    const Problem p = make_problem({100, 37}, {covered ? 219 : 220, 37}, 8, 2, 64, 91);  // 256 + 1
    AttentionParams prm;
    prm.kv_block_size = 64;
    const KVCache kv = p.flat_kv();
    const Manual want = by_hand(p, kv, p.q.t, p.k.t, 4, prm);
    Outputs dense(p.q.t.dtype, p.total_q(), p.hq, p.dim);
    attention_forward(make_args(p, kv, dense, nullptr, prm));
    Outputs o(p.q.t.dtype, p.total_q(), p.hq, p.dim);
    PipelineArgs a = pipeline_args(p, kv, o, 4, prm);
    HostTensor ws(DType::u8, {int64_t(pipeline_workspace_bytes(a))});
    a.workspace = ws.t;
    sparse_attention_pipeline(a);
    expect_same(o.out, want.o.out, "out against the two calls");
    expect_same(o.lse, want.o.lse, "lse against the two calls");
    if (covered) {
      expect_same(o.out, dense.out, "out against dense attention");
      expect_same(o.lse, dense.lse, "lse against dense attention");
    }
    EXPECT_EQ(0, std::memcmp(ws.data<uint8_t>(), want.q2k.data<uint8_t>(), want.q2k.bytes()))
        << "q2k at the start of the workspace";
  }
}

TEST(Pipeline, SeparateIndexerInputs) {
  const Problem p = make_problem({90, 60}, {1000, 900}, 8, 2, 64, 77);
  const Problem other = make_problem({90, 60}, {1000, 900}, 8, 2, 64, 78);  // other q, k values
  AttentionParams prm;
  prm.kv_block_size = 64;  // 16 blocks: 2 forced, 2 chosen by score
  const KVCache kv = p.flat_kv();
  const Manual want = by_hand(p, kv, other.q.t, other.k.t, 4, prm);
  const Manual plain = by_hand(p, kv, p.q.t, p.k.t, 4, prm);
  ASSERT_NE(0, std::memcmp(want.q2k.data<uint8_t>(), plain.q2k.data<uint8_t>(), want.q2k.bytes()))
      << "the test needs indexer inputs that change the selection";
  Outputs o(p.q.t.dtype, p.total_q(), p.hq, p.dim);
  PipelineArgs a = pipeline_args(p, kv, o, 4, prm);
  a.index_q = other.q.t;
  a.index_k = other.k.t;
  HostTensor ws(DType::u8, {int64_t(pipeline_workspace_bytes(a))});
  a.workspace = ws.t;
  sparse_attention_pipeline(a);
  expect_same(o.out, want.o.out, "out");
  EXPECT_EQ(0, std::memcmp(ws.data<uint8_t>(), want.q2k.data<uint8_t>(), want.q2k.bytes()));
}

// DESIGN section 13's serving geometry: 4 index heads on 1 index key head for 2 kv heads (kv head
// h selects by index heads 2h and 2h + 1): the pipeline equals block_scores on the index inputs,
// select_topk over the kv heads and attention, bit for bit, and its selection stays readable.
// Index heads that are not a multiple of the kv heads are an error naming the rule.
TEST(Pipeline, IndexHeadsOfTheServingGeometry) {
  const Problem p = make_problem({90, 60}, {1000, 900}, 8, 2, 64, 81);
  const Problem index = make_problem({90, 60}, {1000, 900}, 4, 1, 64, 82);  // Hi 4 on Hik 1
  AttentionParams prm;
  prm.kv_block_size = 64;
  const KVCache kv = p.flat_kv();
  const HostTensor q2k = selection_by_scores(p, index, kv, 16);
  Outputs want(p.q.t.dtype, p.total_q(), p.hq, p.dim);
  attention_forward(make_args(p, kv, want, &q2k, prm));

  Outputs o(p.q.t.dtype, p.total_q(), p.hq, p.dim);
  PipelineArgs a = pipeline_args(p, kv, o, 4, prm);
  a.index_q = index.q.t;
  a.index_k = index.k.t;
  HostTensor ws(DType::u8, {int64_t(pipeline_workspace_bytes(a))});
  a.workspace = ws.t;
  sparse_attention_pipeline(a);
  expect_same(o.out, want.out, "out");
  expect_same(o.lse, want.lse, "lse");
  EXPECT_EQ(0, std::memcmp(ws.data<uint8_t>(), q2k.data<uint8_t>(), q2k.bytes())) << "q2k";

  const Problem odd = make_problem({90, 60}, {1000, 900}, 3, 1, 64, 83);  // Hi 3 for Hkv 2
  a.index_q = odd.q.t;
  expect_error([&] { sparse_attention_pipeline(a); }, "Hi must be a multiple of Hkv");
}

// Short requests in the serving geometry (4 index heads on 1 index key head, 2 kv heads): top-K
// covers every block, so the pipeline writes that selection without scoring and attends densely;
// the q2k equals block_scores + select_topk's. The index inputs are still checked (an index_q of
// another head dim is the indexer's error), and Hi must still be a multiple of Hkv.
TEST(Pipeline, DenseSelectionInTheServingGeometry) {
  const Problem p = make_problem({90, 0, 60}, {250, 10, 60}, 8, 2, 64, 84);  // <= 4 blocks of 64
  const Problem index = make_problem({90, 0, 60}, {250, 10, 60}, 4, 1, 64, 85);
  AttentionParams prm;
  prm.kv_block_size = 64;
  const KVCache kv = p.flat_kv();
  const HostTensor q2k = selection_by_scores(p, index, kv, 4);
  Outputs dense(p.q.t.dtype, p.total_q(), p.hq, p.dim);
  attention_forward(make_args(p, kv, dense, nullptr, prm));

  Outputs o(p.q.t.dtype, p.total_q(), p.hq, p.dim);
  PipelineArgs a = pipeline_args(p, kv, o, 4, prm);
  a.index_q = index.q.t;
  a.index_k = index.k.t;
  HostTensor ws(DType::u8, {int64_t(pipeline_workspace_bytes(a))});
  std::memset(ws.data<uint8_t>(), 0x5a, ws.bytes());  // every q2k entry must be written
  a.workspace = ws.t;
  sparse_attention_pipeline(a);
  expect_same(o.out, dense.out, "out against dense attention");
  expect_same(o.lse, dense.lse, "lse against dense attention");
  EXPECT_EQ(0, std::memcmp(ws.data<uint8_t>(), q2k.data<uint8_t>(), q2k.bytes())) << "q2k";

  const Problem other_dim = make_problem({90, 0, 60}, {250, 10, 60}, 4, 1, 32, 86);
  a.index_q = other_dim.q.t;
  expect_error([&] { sparse_attention_pipeline(a); }, "k: head dim must equal q's (32)");
  const Problem odd = make_problem({90, 0, 60}, {250, 10, 60}, 3, 1, 64, 87);  // Hi 3 for Hkv 2
  a.index_q = odd.q.t;
  expect_error([&] { sparse_attention_pipeline(a); }, "Hi must be a multiple of Hkv");
}

TEST(Pipeline, WorkspaceRules) {
  const Problem p = make_problem({20}, {200}, 4, 1, 64, 5);
  Outputs o(p.q.t.dtype, p.total_q(), p.hq, p.dim);
  PipelineArgs a = pipeline_args(p, p.flat_kv(), o, 2, AttentionParams{});
  const int64_t need = int64_t(pipeline_workspace_bytes(a));
  HostTensor small(DType::u8, {need - 1});
  a.workspace = small.t;
  try {
    sparse_attention_pipeline(a);
    ADD_FAILURE() << "expected msa::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("workspace: needs pipeline_workspace_bytes(args) = " +
                                         std::to_string(need)),
              std::string::npos)
        << e.what();
  }
  HostTensor big(DType::u8, {need + 64});
  a.workspace = Tensor(big.data<uint8_t>() + 4, DType::u8, {need});
  EXPECT_THROW(sparse_attention_pipeline(a), Error);  // misaligned
  a.workspace = big.t;
  a.topk = 0;
  EXPECT_THROW(sparse_attention_pipeline(a), Error);
}

}  // namespace
}  // namespace msa::test
