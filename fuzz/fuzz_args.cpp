// Fuzz target over the host argument validation of the public entry points, on CPU tensors:
// attention_forward (flat and paged, dense, block- and token-sparse, with a k2q index), the
// pipeline, block_scores, block_topk, select_topk, build_k2q_csr, mqa_logits, paged_mqa_logits,
// token_topk, quantize / dequantize, the FP4 scale reorders and DecodePlan::plan / run. FP4 scales
// come in the public or the preordered layout. The input picks an op, a problem
// (sizes, dtypes, layout, flags), valid contents for its index tensors, and rarely a broken
// argument (fuzz_input.h). Every input must either run or throw msa::Error; any other exception,
// a crash, a sanitizer report or a hang is a finding.
#include <cmath>
#include <numeric>

#include "fuzz_input.h"

namespace msa::fuzz {
namespace {

// One varlen problem: batches, heads, head dim, dtypes and the KV cache geometry.
struct Problem {
  std::vector<int32_t> lq, lk;  // per batch
  int64_t total_q = 0, total_k = 0;
  int64_t hkv = 1, hq = 1, dim = 16;
  DType q_dtype = DType::bf16, kv_dtype = DType::bf16;
  DType fp4_scale = DType::e8m0;  // NVFP4 (fp8_e4m3) or MXFP4 (e8m0) for fp4x2 values
  KVLayout layout = KVLayout::flat;
  int64_t page_size = 16, max_pages = 0, num_pages = 0;
  int kv_block_size = 128;
  int64_t topk = 1;
  bool causal = true;

  int64_t batch() const { return int64_t(lq.size()); }
  bool paged() const { return layout != KVLayout::flat; }
  int64_t blocks(int64_t b) const { return (lk[size_t(b)] + kv_block_size - 1) / kv_block_size; }
  int64_t pool_tokens() const { return num_pages * page_size; }
};

// q takes one of `q_dtypes`; the KV values q's dtype or, with `quantized_kv`, rarely FP8 / FP4 /
// bf16; `paged_only` for decode.
Problem make_problem(Input& in, std::initializer_list<DType> q_dtypes, bool quantized_kv,
                     bool paged_only = false) {
  Problem p;
  const int64_t batch = in.below(4);
  p.layout =
      paged_only
          ? in.pick({KVLayout::paged_nhd, KVLayout::paged_hnd})
          : in.pick({KVLayout::flat, KVLayout::flat, KVLayout::paged_nhd, KVLayout::paged_hnd});
  p.page_size = in.pick<int64_t>({16, 32, 64, 16, 128, 256, 8});
  p.max_pages = in.range(0, 3);
  p.num_pages = in.range(p.max_pages > 0 ? 1 : 0, 4);
  for (int64_t b = 0; b < batch; ++b) {
    p.lq.push_back(int32_t(in.below(5)));
    p.lk.push_back(int32_t(p.paged()
                               ? in.range(0, p.max_pages * p.page_size)
                               : in.pick<int64_t>({0, 1, 5, 63, 64, 65, 128, 129, 200, 300})));
  }
  for (int32_t l : p.lq) p.total_q += l;
  for (int32_t l : p.lk) p.total_k += l;
  p.hkv = in.pick<int64_t>({1, 2, 1, 3});
  p.hq = p.hkv * in.pick<int64_t>({1, 2, 4, 1, 16, 3, 128});
  if (p.hq > 128) p.hq = p.hkv;
  p.dim = in.pick<int64_t>({16, 32, 64, 32, 128, 8, 2});
  p.q_dtype = in.pick(q_dtypes);
  p.kv_dtype = p.q_dtype;
  if (quantized_kv && in.flag()) p.kv_dtype = in.pick({DType::fp8_e4m3, DType::fp4x2, DType::bf16});
  p.fp4_scale = in.pick({DType::e8m0, DType::fp8_e4m3});
  p.kv_block_size = in.pick({128, 64, 1, 128, 32});
  p.topk = in.range(1, 5);
  p.causal = in.flag();
  return p;
}

// The stored last dim of values with `dim` logical elements.
int64_t stored_dim(DType values, int64_t dim) { return values == DType::fp4x2 ? dim / 2 : dim; }

// cu_seqlens_q [B+1].
Tensor cu_seqlens_q(Args& a, const Problem& p) { return a.i32(cumulative(p.lq)); }

// An FP4 scale of public shape `shape`, or (a flag) the preordered one of `matrices` matrices of
// `rows` rows: [matrices, ceil(rows / 128), ceil(G / 4), 32, 4, 4], which only the indexer reads.
Tensor fp4_scale(Args& a, DType dtype, const std::vector<int64_t>& shape, int64_t matrices,
                 int64_t rows) {
  if (!a.in().flag()) return a.tensor(dtype, shape);
  return a.tensor(dtype, {matrices, (rows + 127) / 128, (shape.back() + 3) / 4, 32, 4, 4});
}

// q [total_q, Hq, D] of p.q_dtype, with its scale for fp8 / fp4x2 values.
QTensor make_q(Args& a, const Problem& p) {
  QTensor q(a.tensor(p.q_dtype, {p.total_q, p.hq, stored_dim(p.q_dtype, p.dim)}));
  Input& in = a.in();
  if (p.q_dtype == DType::fp8_e4m3) {
    switch (in.below(4)) {
      case 1:
        q.scale = a.tensor(DType::f32, {1});
        break;
      case 2:
        q.scale = a.tensor(DType::f32, {p.total_q});
        break;
      case 3:
        q.scale = a.tensor(DType::f32, {p.total_q, p.hq});
        break;
      default:
        break;
    }
  } else if (p.q_dtype == DType::fp4x2) {
    const int64_t group = p.fp4_scale == DType::fp8_e4m3 ? 16 : 32;
    q.scale = fp4_scale(a, p.fp4_scale, {p.total_q, p.hq, p.dim / group}, p.hq, p.total_q);
    q.global_scale = in.rare() ? in.pick<float>({0.f, -1.f, NAN, INFINITY, 1e-30f}) : 1.f;
  }
  return q;
}

// One part (k or v) of the cache: values and scales in the layout of p.
QTensor make_kv_part(Args& a, const Problem& p) {
  const int64_t d = stored_dim(p.kv_dtype, p.dim);
  std::vector<int64_t> shape;
  if (p.layout == KVLayout::flat)
    shape = {p.total_k, p.hkv, d};
  else if (p.layout == KVLayout::paged_nhd)
    shape = {p.num_pages, p.page_size, p.hkv, d};
  else
    shape = {p.num_pages, p.hkv, p.page_size, d};
  QTensor x(a.tensor(p.kv_dtype, shape));
  Input& in = a.in();
  const int64_t tokens = p.paged() ? p.pool_tokens() : p.total_k;
  if (p.kv_dtype == DType::fp8_e4m3) {
    switch (in.below(4)) {
      case 1:
        x.scale = a.tensor(DType::f32, {1});
        break;
      case 2:
        x.scale = a.tensor(DType::f32, {tokens});
        break;
      case 3:
        x.scale = a.tensor(DType::f32, {tokens, p.hkv});
        break;
      default:
        break;
    }
  } else if (p.kv_dtype == DType::fp4x2) {
    const int64_t group = p.fp4_scale == DType::fp8_e4m3 ? 16 : 32;
    shape.back() = p.dim / group;
    if (!p.paged()) shape = {tokens, p.hkv, p.dim / group};
    x.scale = p.paged() ? fp4_scale(a, p.fp4_scale, shape, p.num_pages * p.hkv, 128)
                        : fp4_scale(a, p.fp4_scale, shape, p.hkv, tokens);
    x.global_scale = in.rare() ? in.pick<float>({0.f, -1.f, NAN, INFINITY}) : 1.f;
  }
  return x;
}

KVCache make_kv(Args& a, const Problem& p, bool with_v) {
  KVCache kv;
  kv.layout = p.layout;
  kv.k = make_kv_part(a, p);
  if (with_v) kv.v = make_kv_part(a, p);
  if (!p.paged()) {
    kv.cu_seqlens_k = a.i32(cumulative(p.lk));
    return kv;
  }
  Input& in = a.in();
  std::vector<int32_t> table(size_t(p.batch() * p.max_pages));
  for (int32_t& id : table) id = p.num_pages > 0 ? int32_t(in.below(p.num_pages)) : 0;
  kv.page_table = a.i32(table, {p.batch(), p.max_pages});
  if (in.u8() < 200) kv.seqused_k = a.i32(p.lk);
  return kv;
}

// q2k [Hkv, total_q, topk]: per row distinct ids of the token's batch ([-1, nblk_b)), in random
// slots, the rest -1.
Tensor make_q2k(Args& a, const Problem& p) {
  std::vector<int32_t> ids(size_t(p.hkv * p.total_q * p.topk), -1);
  Rng& rng = a.rng();
  std::vector<int32_t> pool;
  for (int64_t h = 0; h < p.hkv; ++h) {
    int64_t t = 0;
    for (int64_t b = 0; b < p.batch(); ++b)
      for (int32_t i = 0; i < p.lq[size_t(b)]; ++i, ++t) {
        pool.resize(size_t(p.blocks(b)));
        std::iota(pool.begin(), pool.end(), 0);
        int32_t* row = &ids[size_t((h * p.total_q + t) * p.topk)];
        for (int64_t s = 0; s < p.topk && !pool.empty(); ++s) {
          if (rng.next() % 4 == 0) continue;  // leave a -1 slot
          const size_t k = size_t(rng.next() % pool.size());
          row[s] = pool[k];
          pool[k] = pool.back();
          pool.pop_back();
        }
      }
  }
  return a.i32(ids, {p.hkv, p.total_q, p.topk});
}

// The k2q index of q2k as build_k2q_csr writes it (so attention may accept it), with
// total_rows sized exactly or with spare rows; a broken q2k leaves it unbuilt.
K2QIndex make_k2q(Args& a, const Problem& p, const Tensor& q2k, const Tensor& cu_q,
                  const KVCache& kv) {
  int64_t rows = 0;
  for (int64_t b = 0; b < p.batch(); ++b) rows += p.blocks(b);
  rows += a.in().below(3);
  K2QIndex k;
  k.row_ptr = a.tensor(DType::i32, {p.hkv, rows + 1});
  k.q_idx = a.tensor(DType::i32, {p.hkv, p.total_q * p.topk});
  if (a.in().flag())
    k.schedule = a.tensor(DType::i32, {k2q_schedule_size(p.hkv, rows, p.total_q, p.topk)});
  if (!a.ok()) return k;
  CsrBuildArgs c;
  c.q2k = q2k;
  c.cu_seqlens_q = cu_q;
  c.kv = kv;
  c.kv_block_size = p.kv_block_size;
  c.out = k;
  try {
    build_k2q_csr(c);
  } catch (const Error&) {
  }
  return k;
}

AttentionParams make_params(Input& in, const Problem& p) {
  AttentionParams prm;
  prm.causal = p.causal;
  prm.kv_block_size = p.kv_block_size;
  if (in.rare()) prm.softmax_scale = in.pick<float>({-1.f, NAN, INFINITY, 0.125f, 1e30f});
  if (in.rare()) prm.partial_dtype = in.pick({DType::f32, DType::bf16, DType::i32});
  if (in.u8() < 32) prm.soft_cap = in.pick<float>({30.f, 0.5f, 0.f, -1.f, NAN, INFINITY});
  return prm;
}

// The visibility arguments of dense attention (msa/attention.h): per-batch causal offsets
// (extreme values too) and a key mask per batch or per query, Lk_max the longest key count or
// rarely one more or less, with any row kind.
void add_visibility(Args& a, const Problem& p, AttentionArgs& x) {
  Input& in = a.in();
  if (in.u8() < 48) {
    std::vector<int32_t> off;
    for (int64_t b = 0; b < p.batch(); ++b)
      off.push_back(in.pick<int32_t>({0, -1, 3, -200, 100000, INT32_MAX, INT32_MIN}));
    x.causal_offset = a.i32(off);
  }
  if (in.u8() < 48) {
    int64_t lk_max = 0;
    for (int32_t l : p.lk) lk_max = std::max<int64_t>(lk_max, l);
    if (in.rare()) lk_max = std::max<int64_t>(0, lk_max + (in.flag() ? 1 : -1));
    x.key_mask_rows = in.pick({KeyMaskRows::from_shape, KeyMaskRows::per_batch,
                               KeyMaskRows::per_query});
    const bool per_query = x.key_mask_rows == KeyMaskRows::per_query ||
                           (x.key_mask_rows == KeyMaskRows::from_shape && in.flag());
    x.key_mask = a.tensor(in.pick({DType::boolean, DType::u8}),
                          {per_query ? p.total_q : p.batch(), lk_max});
  }
}

// Attention's arguments for p: q, the cache, q2k when sparse (and rarely a k2q index), out, lse,
// tlse with a temperature, causal offsets and a key mask.
AttentionArgs make_attention(Args& a, const Problem& p, bool sparse) {
  Input& in = a.in();
  AttentionArgs x;
  const QTensor q = make_q(a, p);
  x.q = q.values;
  x.q_scale = q.scale;
  x.kv = make_kv(a, p, /*with_v=*/true);
  x.cu_seqlens_q = cu_seqlens_q(a, p);
  x.params = make_params(in, p);
  if (sparse) {
    x.q2k = make_q2k(a, p);
    if (in.u8() < 48) x.k2q = make_k2q(a, p, x.q2k, x.cu_seqlens_q, x.kv);
  }
  const DType out_dtype = p.q_dtype == DType::fp8_e4m3 ? DType::bf16 : p.q_dtype;
  x.out = a.tensor(out_dtype, {p.total_q, p.hq, p.dim});
  if (in.flag()) x.lse = a.tensor(DType::f32, {p.hq, p.total_q});
  if (in.u8() < 64) {
    x.tlse = a.tensor(DType::f32, {p.hq, p.total_q});
    x.params.temperature = in.pick<float>({0.5f, 2.f, 0.f, -1.f, NAN});
  }
  add_visibility(a, p, x);
  return x;
}

// Scores [Hq, nblk_max, total_q] f32, nblk_max the largest block count (rarely one more or less).
Tensor make_scores(Args& a, const Problem& p) {
  int64_t nblk = 0;
  for (int64_t b = 0; b < p.batch(); ++b) nblk = std::max(nblk, p.blocks(b));
  if (p.paged() && p.batch() > 0)
    nblk = std::max(nblk, (p.max_pages * p.page_size + p.kv_block_size - 1) / p.kv_block_size);
  nblk += a.in().below(2);
  return a.tensor(DType::f32, {p.hq, nblk, p.total_q});
}

void run_attention(Args& a) {
  Problem p = make_problem(a.in(), {DType::bf16, DType::f16, DType::fp8_e4m3}, true);
  const AttentionArgs x = make_attention(a, p, a.in().u8() < 170);
  if (!a.ok()) return;
  (void)attention_workspace_bytes(x);
  attention_forward(x);
}

void run_pipeline(Args& a) {
  Input& in = a.in();
  Problem p = make_problem(in, {DType::bf16, DType::f16}, false);
  PipelineArgs x;
  x.q = a.tensor(p.q_dtype, {p.total_q, p.hq, p.dim});
  x.kv = make_kv(a, p, true);
  x.cu_seqlens_q = cu_seqlens_q(a, p);
  x.topk = int(p.topk);
  x.sink_blocks = int(in.below(2));
  x.local_blocks = int(in.below(2));
  x.params = make_params(in, p);
  x.out = a.tensor(p.q_dtype, {p.total_q, p.hq, p.dim});
  if (in.flag()) x.lse = a.tensor(DType::f32, {p.hq, p.total_q});
  if (!a.ok()) return;
  const size_t need = pipeline_workspace_bytes(x);
  const int64_t bytes = int64_t(need) - (in.rare() ? 4 : 0);
  if (bytes > Arena::kMaxBytes) return;
  x.workspace = a.tensor(DType::u8, {std::max<int64_t>(bytes, 0)});
  if (!a.ok()) return;
  sparse_attention_pipeline(x);
}

void run_block_scores(Args& a) {
  Input& in = a.in();
  Problem p = make_problem(in, {DType::bf16, DType::f16, DType::fp8_e4m3, DType::fp4x2}, false);
  p.kv_block_size = in.pick({128, 64, 1});
  BlockScoresArgs x;
  x.q = make_q(a, p);
  x.kv = make_kv(a, p, false);
  x.cu_seqlens_q = cu_seqlens_q(a, p);
  x.scores = make_scores(a, p);
  x.causal = p.causal;
  x.kv_block_size = p.kv_block_size;
  if (!a.ok()) return;
  block_scores(x);
}

void run_block_topk(Args& a) {
  Input& in = a.in();
  Problem p = make_problem(in, {DType::bf16, DType::f16, DType::fp8_e4m3, DType::fp4x2}, false);
  p.kv_block_size = in.pick({128, 64, 1});
  BlockTopKArgs x;
  x.q = make_q(a, p);
  x.kv = make_kv(a, p, false);
  x.cu_seqlens_q = cu_seqlens_q(a, p);
  x.causal = p.causal;
  x.kv_block_size = p.kv_block_size;
  x.topk = int(p.topk);
  x.sink_blocks = int(in.below(3));
  x.local_blocks = int(in.below(3));
  x.q2k = a.tensor(DType::i32, {p.hkv, p.total_q, p.topk});
  if (!a.ok()) return;
  block_topk(x);
}

void run_select_topk(Args& a) {
  Input& in = a.in();
  Problem p = make_problem(in, {DType::bf16}, false);
  p.kv_block_size = in.pick({128, 64, 1});
  TopKArgs x;
  x.scores = make_scores(a, p);
  x.cu_seqlens_q = cu_seqlens_q(a, p);
  x.kv = make_kv(a, p, false);
  if (!p.paged() && in.flag()) x.kv.k = QTensor();  // flat: only the lengths are needed
  x.num_kv_heads = int(in.rare() ? in.pick<int64_t>({0, -1, 3, 256}) : p.hkv);
  x.topk = int(p.topk);
  x.sink_blocks = int(in.below(3));
  x.local_blocks = int(in.below(3));
  x.causal = p.causal;
  x.kv_block_size = p.kv_block_size;
  x.q2k = a.tensor(DType::i32, {p.hkv, p.total_q, p.topk});
  if (!a.ok()) return;
  select_topk(x);
}

void run_build_k2q(Args& a) {
  Input& in = a.in();
  Problem p = make_problem(in, {DType::bf16}, false);
  p.kv_block_size = in.pick({128, 64, 1});
  CsrBuildArgs x;
  x.q2k = make_q2k(a, p);
  x.cu_seqlens_q = cu_seqlens_q(a, p);
  x.kv = make_kv(a, p, false);
  x.kv_block_size = p.kv_block_size;
  int64_t rows = 0;
  for (int64_t b = 0; b < p.batch(); ++b) rows += p.blocks(b);
  rows += in.below(3);
  x.out.row_ptr = a.tensor(DType::i32, {p.hkv, rows + 1});
  x.out.q_idx = a.tensor(DType::i32, {p.hkv, p.total_q * p.topk});
  if (in.flag()) x.out.schedule = a.tensor(DType::i32, {2 + 4 * p.hkv * rows - in.below(2)});
  if (!a.ok()) return;
  build_k2q_csr(x);
}

void run_decode(Args& a) {
  Input& in = a.in();
  Problem p =
      make_problem(in, {DType::bf16, DType::f16, DType::fp8_e4m3}, true, /*paged_only=*/true);
  const bool sparse = in.flag();
  DecodeShape s;
  s.batch = int(p.batch());
  s.max_queries_per_request = 1;
  for (int32_t l : p.lq) s.max_queries_per_request = std::max<int>(s.max_queries_per_request, l);
  s.num_q_heads = int(p.hq);
  s.num_kv_heads = int(p.hkv);
  s.head_dim = int(p.dim);
  s.page_size = int(p.page_size);
  s.max_pages = int(p.max_pages);
  s.layout = p.layout;
  s.kv_dtype = p.kv_dtype;
  s.topk = sparse ? int(p.topk) : 0;
  s.kv_block_size = p.kv_block_size;
  if (in.rare()) {  // a shape field out of its rule
    switch (in.below(6)) {
      case 0:
        s.batch = int(in.pick<int64_t>({-1, 0, 5}));
        break;
      case 1:
        s.max_queries_per_request = int(in.pick<int64_t>({0, -1, 1}));
        break;
      case 2:
        s.head_dim = int(in.pick<int64_t>({0, -8, 128}));
        break;
      case 3:
        s.page_size = int(in.pick<int64_t>({0, 24, 512}));
        break;
      case 4:
        s.topk = int(in.pick<int64_t>({-1, 0, 3}));
        break;
      default:
        s.device = Device{DeviceType::cuda, 0};
        break;
    }
  }
  // The host lengths plan() reads: one per batch of the shape, or none.
  std::vector<int32_t> lens(size_t(std::max(s.batch, 0)), 0);
  for (size_t b = 0; b < lens.size() && b < p.lk.size(); ++b) lens[b] = p.lk[b];
  if (in.rare() && !lens.empty()) lens[0] = in.pick<int32_t>({-1, INT32_MAX, 1 << 20});
  const int32_t* host_lens = in.u8() < 200 ? lens.data() : nullptr;
  DecodePlan plan;
  AttentionArgs x = make_attention(a, p, sparse);
  if (!a.ok()) return;
  if (in.rare()) plan.run(x);  // before plan(): an error
  const size_t ws = DecodePlan::workspace_bytes(s);
  if (int64_t(ws) > Arena::kMaxBytes) return;
  const Tensor workspace = ws > 0 ? a.tensor(DType::u8, {int64_t(ws)}) : Tensor();
  if (!a.ok()) return;
  plan.plan(s, host_lens, workspace);
  plan.run(x);
}

void run_mqa_logits(Args& a) {
  Input& in = a.in();
  const int64_t t = in.below(5), h = in.pick<int64_t>({1, 2, 4, 3}),
                d = in.pick<int64_t>({16, 32, 8, 128});
  const int64_t s = in.range(0, 40);
  const DType dt = in.pick({DType::fp8_e4m3, DType::bf16});
  MqaLogitsArgs x;
  x.q = QTensor(a.tensor(dt, {t, h, d}));
  x.k = QTensor(a.tensor(dt, {s, d}));
  if (dt == DType::fp8_e4m3 && in.flag()) x.k.scale = a.tensor(DType::f32, {s});
  if (in.rare()) x.q.scale = a.tensor(DType::f32, {t});
  x.weights = a.tensor(DType::f32, {t, h});
  std::vector<int32_t> ks(static_cast<size_t>(t)), ke(static_cast<size_t>(t));
  for (int64_t r = 0; r < t; ++r) {
    ks[size_t(r)] = int32_t(in.range(0, s));
    ke[size_t(r)] = int32_t(in.range(ks[size_t(r)], s));
  }
  x.ks = a.i32(ks);
  x.ke = a.i32(ke);
  x.logits = a.tensor(DType::f32, {t, s});
  x.clean_logits = in.flag();
  if (!a.ok()) return;
  mqa_logits(x);
}

void run_paged_mqa_logits(Args& a) {
  Input& in = a.in();
  const int64_t batch = in.below(4), next_n = in.range(1, 3),
                heads = in.pick<int64_t>({1, 2, 4, 3});
  const int64_t dim = in.pick<int64_t>({32, 64, 16, 128});
  const bool fp4 = in.flag();
  const int64_t block_size = in.pick<int64_t>({32, 64, 16, 128, 1});
  const int64_t num_blocks = in.range(0, 4), width = in.range(0, 3);
  PagedMqaLogitsArgs x;
  x.q = a.tensor(fp4 ? DType::fp4x2 : DType::fp8_e4m3, {batch, next_n, heads, fp4 ? dim / 2 : dim});
  if (fp4 || in.rare()) x.q_sf = a.tensor(DType::e8m0, {batch, next_n, heads, dim / 32});
  const int64_t token_bytes = fp4 ? dim / 2 + dim / 32 : dim + 4;
  x.kv_fused = a.tensor(DType::u8, {num_blocks, block_size, 1, token_bytes});
  x.weights = a.tensor(DType::f32, {batch * next_n, heads});
  std::vector<int32_t> table(static_cast<size_t>(batch * width)), lens(static_cast<size_t>(batch));
  for (int32_t& id : table) id = num_blocks > 0 ? int32_t(in.below(num_blocks)) : 0;
  int64_t longest = 0;
  for (int32_t& l : lens) {
    l = int32_t(in.range(0, width * block_size));
    longest = std::max<int64_t>(longest, l);
  }
  x.block_tables = a.i32(table, {batch, width});
  x.seq_lens = a.i32(lens);
  x.max_seq_len = in.rare() ? in.pick<int64_t>({-1, 0, int64_t(1) << 40}) : longest + in.below(3);
  x.logits =
      a.tensor(DType::f32, {batch * next_n, std::max<int64_t>(x.max_seq_len, 0) + in.below(2)});
  x.clean_logits = in.flag();
  if (!a.ok()) return;
  paged_mqa_logits(x);
}

void run_token_topk(Args& a) {
  Input& in = a.in();
  const int64_t rows = in.below(5), s = in.range(0, 40);
  TokenTopKArgs x;
  x.logits = a.tensor(DType::f32, {rows, s});
  if (in.flag()) {
    std::vector<int32_t> ks(static_cast<size_t>(rows)), ke(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) {
      ks[size_t(r)] = int32_t(in.range(0, s));
      ke[size_t(r)] = int32_t(in.range(ks[size_t(r)], s));
    }
    x.ks = a.i32(ks);
    x.ke = a.i32(ke);
  }
  x.topk = int(in.rare() ? in.pick<int64_t>({0, -1, 1 << 20}) : in.range(1, s + 2));
  x.ids = a.tensor(DType::i32, {rows, std::max(x.topk, 0)});
  if (!a.ok()) return;
  token_topk(x);
}

void run_quant(Args& a) {
  Input& in = a.in();
  const int64_t t = in.below(4), h = in.range(1, 3), d = in.pick<int64_t>({32, 64, 16, 128, 2, 3});
  const QuantFormat f =
      in.pick({QuantFormat::fp8_per_tensor, QuantFormat::fp8_per_token,
               QuantFormat::fp8_per_token_head, QuantFormat::nvfp4, QuantFormat::mxfp4});
  const DType plain = in.pick({DType::f32, DType::bf16, DType::f16});
  const bool fp4 = f == QuantFormat::nvfp4 || f == QuantFormat::mxfp4;
  QTensor q(a.tensor(fp4 ? DType::fp4x2 : DType::fp8_e4m3, {t, h, fp4 ? d / 2 : d}));
  switch (f) {
    case QuantFormat::fp8_per_tensor:
      q.scale = a.tensor(DType::f32, {1});
      break;
    case QuantFormat::fp8_per_token:
      q.scale = a.tensor(DType::f32, {t});
      break;
    case QuantFormat::fp8_per_token_head:
      q.scale = a.tensor(DType::f32, {t, h});
      break;
    case QuantFormat::nvfp4:
      q.scale = a.tensor(DType::fp8_e4m3, {t, h, d / 16});
      break;
    case QuantFormat::mxfp4:
      q.scale = a.tensor(DType::e8m0, {t, h, d / 32});
      break;
  }
  if (in.rare()) q.global_scale = in.pick<float>({0.f, -1.f, NAN, INFINITY});
  const Tensor x = a.tensor(plain, {t, h, d});
  if (!a.ok()) return;
  if (in.flag()) {
    quantize(x, in.rare() ? QuantFormat(in.u8()) : f, q);
  } else {
    dequantize(q, x);
  }
}

// reorder_fp4_scales or its inverse between a public scale of a layout and its preordered shape
// (pools of 128-slot pages, or rarely of 64).
void run_reorder(Args& a) {
  Input& in = a.in();
  const KVLayout layout = in.pick({KVLayout::flat, KVLayout::paged_nhd, KVLayout::paged_hnd});
  const bool flat = layout == KVLayout::flat;
  const DType dtype = in.pick({DType::e8m0, DType::fp8_e4m3});
  const int64_t rows = flat ? in.pick<int64_t>({129, 1, 0, 128, 300}) : (in.rare() ? 64 : 128);
  const int64_t pages = in.below(3), heads = in.range(1, 3);
  const int64_t groups = in.pick<int64_t>({6, 1, 4, 8, 2});
  const std::vector<int64_t> pub_shape =
      flat ? std::vector<int64_t>{rows, heads, groups}
           : layout == KVLayout::paged_nhd ? std::vector<int64_t>{pages, rows, heads, groups}
                                           : std::vector<int64_t>{pages, heads, rows, groups};
  const Tensor pub = a.tensor(dtype, pub_shape);
  const Tensor pre = a.tensor(dtype, {flat ? heads : pages * heads, flat ? (rows + 127) / 128 : 1,
                                      (groups + 3) / 4, 32, 4, 4});
  if (!a.ok()) return;
  if (in.flag()) {
    reorder_fp4_scales(pub, in.rare() ? KVLayout(in.u8()) : layout, pre);
  } else {
    reorder_fp4_scales_to_public(pre, layout, pub);
  }
}

}  // namespace
}  // namespace msa::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace msa::fuzz;
  Input in(data, size);
  Arena arena;
  Rng rng(in.u32());
  Args a(in, arena, rng);
  try {
    switch (in.below(12)) {
      case 0:
      case 1:
        run_attention(a);
        break;
      case 2:
        run_pipeline(a);
        break;
      case 3:
        run_block_scores(a);
        break;
      case 4:
        run_block_topk(a);
        break;
      case 5:
        run_select_topk(a);
        break;
      case 6:
        run_build_k2q(a);
        break;
      case 7:
        run_decode(a);
        break;
      case 8:
        run_mqa_logits(a);
        break;
      case 9:
        run_paged_mqa_logits(a);
        break;
      case 10:
        run_token_topk(a);
        break;
      default:
        in.flag() ? run_quant(a) : run_reorder(a);
        break;
    }
  } catch (const msa::Error&) {
  }
  return 0;
}
