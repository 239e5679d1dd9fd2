// Host entry of the token-sparse forward (token_launch.h): what it runs, its workspace (the paged
// checks' key offsets and the q2k check's scratch), then the paged checks, the q2k check (ids in
// [-1, Lk_b), none repeated in a row) and the token kernel, in that order on the caller's stream.

#include <cmath>
#include <type_traits>
#include <string>

#include "cuda/common/index_checks.cuh"
#include "cuda/sm90/sparse_fwd/key_mask.h"
#include "cuda/sm90/sparse_fwd/plan.h"
#include "cuda/sm90/sparse_fwd/prep.h"
#include "cuda/sm90/sparse_fwd/token_launch.h"
#include "cuda/sm90/sparse_fwd/traits.h"

namespace msa::cuda::sparse_fwd {
namespace {

size_t align256(size_t x) { return (x + 255) & ~size_t(255); }

// The regions of the workspace (AttnPlan's fields for the paged checks and the q2k check).
AttnPlan token_plan(const AttentionArgs& a, const ProblemShape& s) {
  AttnPlan w;
  size_t off = 0;
  auto take = [&off](size_t bytes) { const size_t at = off; off += align256(bytes); return at; };
  if (a.kv.layout != KVLayout::flat) {
    w.paged_offence = take(sizeof(unsigned long long));
    w.key_offsets = take(size_t(s.batch + 1) * 4);
  }
  w.check = take(kQ2KCheckWorkspaceBytes);
  w.key_mask = a.key_mask.defined();  // packed bits (key_mask.h), as the block path's
  if (w.key_mask) {
    w.mask_words = int32_t(key_mask_words(a.key_mask.shape[1]));
    w.mask_bits = take(size_t(a.key_mask.shape[0]) * size_t(w.mask_words) * 4);
    if (a.key_mask_rows == KeyMaskRows::per_batch) w.mask_token_row = take(size_t(s.total_q) * 4);
  }
  // FP8 / FP4 K/V: the flat bf16 copy the sparse path reads too (launch_dequant), one row per key
  // of a flat cache or per pool slot of the requests' pages.
  w.dequant_kv = a.kv.k.values.dtype != a.q.dtype;
  if (w.dequant_kv) {
    w.kv_rows = a.kv.layout != KVLayout::flat ? s.batch * s.max_pages * s.page_size
                                              : a.kv.k.values.shape[0];
    w.k_bf16 = take(size_t(w.kv_rows) * size_t(s.num_kv_heads) * size_t(s.head_dim) * 2);
    w.v_bf16 = take(size_t(w.kv_rows) * size_t(s.num_kv_heads) * size_t(s.head_dim) * 2);
  }
  w.total = off;
  return w;
}

}  // namespace

void check_token_supported(const AttentionArgs& a, const ProblemShape& s) {
  MSA_CHECK(s.head_dim == 64 || s.head_dim == 128 || s.head_dim == 256,
            "q: token-sparse attention (kv_block_size 1) runs head dims 64, 128 and 256 on CUDA, "
            "got ", s.head_dim);
  const DType qt = a.q.dtype;
  MSA_CHECK(qt == DType::bf16 || qt == DType::f16, "q: token-sparse attention (kv_block_size 1) "
            "takes bf16 or f16 q on CUDA, got ", dtype_name(qt));
  check_kv_dtypes(a, qt, "bf16");  // FP8 / FP4 K/V: the flat bf16 copy (launch_dequant)
  MSA_CHECK(!a.key_mask.defined() || key_mask_words(a.key_mask.shape[1]) < INT32_MAX / 2,
            "key_mask: Lk_max = ", a.key_mask.shape[1], " is too large for CUDA");
  MSA_CHECK(s.group <= 128, "q: token-sparse attention takes a GQA group of at most 128, got ",
            s.group);
  MSA_CHECK(s.total_q < INT32_MAX && s.topk < INT32_MAX / 2,
            "q, q2k: token-sparse attention on CUDA needs total_q and topk below 2^31");
  MSA_CHECK(s.num_kv_heads * ((s.group + 63) / 64) <= 65535,
            "k: token-sparse attention on CUDA takes at most 65535 kv heads x row tiles, got ",
            s.num_kv_heads, " kv heads of group ", s.group);
  if (a.kv.layout == KVLayout::flat)
    MSA_CHECK(a.kv.k.values.shape[0] < INT32_MAX, "k: token counts must be below 2^31 on CUDA");
  else
    MSA_CHECK(s.batch * s.max_pages * s.page_size < INT32_MAX,
              "page_table: B * max_pages * page_size (", s.batch, " * ", s.max_pages, " * ",
              s.page_size, ") must be below 2^31 on CUDA (paged key offsets are int32)");
}

namespace {

// Element strides of a K or V key row: (page, slot, head) paged, (-, token, head) flat.
void kv_strides(const Tensor& t, KVLayout layout, int64_t& page, int64_t& row, int64_t& head) {
  if (layout == KVLayout::flat) {
    page = 0;
    row = t.strides[0];
    head = t.strides[1];
  } else {
    page = t.strides[0];
    const bool hnd = layout == KVLayout::paged_hnd;  // [pages, Hkv, page_size, D]
    row = t.strides[hnd ? 2 : 1];
    head = t.strides[hnd ? 1 : 2];
  }
}

}  // namespace

size_t token_workspace_bytes(const AttentionArgs& a, const ProblemShape& s) {
  check_token_supported(a, s);
  return token_plan(a, s).total;
}

void token_attention_forward(const AttentionArgs& a, const ProblemShape& s, cudaStream_t stream,
                             const WorkspaceSource& src) {
  check_token_supported(a, s);
  if (s.total_q == 0) return;
  const AttnPlan w = token_plan(a, s);
  uint8_t* ws = checked_workspace(a, w, src);
  int32_t* status = a.status.ptr<int32_t>();
  const bool paged = a.kv.layout != KVLayout::flat;
  const int32_t* cu_k = paged ? launch_paged_checks(a, s, w, ws, status, stream)
                              : a.kv.cu_seqlens_k.ptr<int32_t>();
  Q2KCheckParams c;
  c.q2k = a.q2k.ptr<int32_t>();
  c.cu_seqlens_q = a.cu_seqlens_q.ptr<int32_t>();
  c.keys.cu_seqlens_k = cu_k;
  c.keys.total_k = paged ? -1 : a.kv.k.values.shape[0];
  c.batch = s.batch;
  c.num_kv_heads = s.num_kv_heads;
  c.total_q = s.total_q;
  c.topk = s.topk;
  c.kv_block_size = 1;
  launch_q2k_check(c, ws + w.check, status, stream);
  if (w.dequant_kv) launch_dequant(a, s, w, ws, cu_k, stream);
  if (w.key_mask) {
    KeyMaskParams m;
    m.mask = a.key_mask.ptr<uint8_t>();
    m.row_stride = a.key_mask.strides[0];
    m.rows = a.key_mask.shape[0];
    m.cols = a.key_mask.shape[1];
    m.words = w.mask_words;
    m.bits = reinterpret_cast<uint32_t*>(ws + w.mask_bits);
    m.per_query = a.key_mask_rows == KeyMaskRows::per_query ? 1 : 0;
    m.token_row = m.per_query ? nullptr : reinterpret_cast<int32_t*>(ws + w.mask_token_row);
    m.cu_seqlens_q = a.cu_seqlens_q.ptr<int32_t>();
    m.cu_seqlens_k = cu_k;
    m.batch = s.batch;
    m.total_q = s.total_q;
    m.status = status;
    launch_key_mask(m, stream);
  }

  TokenParams p;
  p.q = a.q.data;
  p.q_stride_t = a.q.strides[0];
  p.q_stride_h = a.q.strides[1];
  p.k = a.kv.k.values.data;
  p.v = a.kv.v.values.data;
  kv_strides(a.kv.k.values, a.kv.layout, p.k_stride_page, p.k_stride_row, p.k_stride_head);
  kv_strides(a.kv.v.values, a.kv.layout, p.v_stride_page, p.v_stride_row, p.v_stride_head);
  if (w.dequant_kv) {  // the flat bf16 copy [kv_rows, Hkv, D], batch b from row cu_k[b]
    p.k = ws + w.k_bf16;
    p.v = ws + w.v_bf16;
    p.k_stride_page = p.v_stride_page = 0;
    p.k_stride_row = p.v_stride_row = s.num_kv_heads * s.head_dim;
    p.k_stride_head = p.v_stride_head = s.head_dim;
    p.total_k = w.kv_rows;
  } else if (paged) {
    p.paged = make_paged_kv(a.kv.page_table.ptr<int32_t>(), a.kv.page_table.strides[0],
                            s.num_pages, s.page_size, a.kv.layout == KVLayout::paged_hnd);
  } else {
    p.total_k = a.kv.k.values.shape[0];
  }
  p.q2k = c.q2k;
  p.topk = int32_t(s.topk);
  p.cu_seqlens_q = c.cu_seqlens_q;
  p.cu_k = cu_k;
  p.causal_offset = a.causal_offset.defined() ? a.causal_offset.ptr<int32_t>() : nullptr;
  p.batch = int32_t(s.batch);
  p.total_q = s.total_q;
  p.num_q_heads = int32_t(s.num_q_heads);
  p.group = int32_t(s.group);
  p.row_tiles = int32_t((s.group + 63) / 64);
  p.causal = a.params.causal ? 1 : 0;
  const float scale = a.params.softmax_scale > 0.f ? a.params.softmax_scale
                                                   : 1.f / std::sqrt(float(s.head_dim));
  p.scale_log2 = scale * 1.4426950408889634f;
  p.inv_temperature = a.params.temperature > 0.f ? 1.f / a.params.temperature : 0.f;
  p.soft_cap_log2 = a.params.soft_cap > 0.f ? a.params.soft_cap * 1.4426950408889634f : 0.f;
  p.out = a.out.data;
  p.out_stride_t = a.out.strides[0];
  p.out_stride_h = a.out.strides[1];
  p.lse = a.lse.defined() ? a.lse.ptr<float>() : nullptr;
  p.tlse = a.tlse.defined() ? a.tlse.ptr<float>() : nullptr;
  if (w.key_mask) {
    p.mask_bits = reinterpret_cast<const uint32_t*>(ws + w.mask_bits);
    p.mask_token_row = a.key_mask_rows == KeyMaskRows::per_batch
                           ? reinterpret_cast<const int32_t*>(ws + w.mask_token_row)
                           : nullptr;
    p.mask_words = w.mask_words;
  }
  const dim3 grid(uint32_t(s.total_q), uint32_t(s.num_kv_heads * p.row_tiles));
  const bool f16 = a.q.dtype == DType::f16, temp = p.inv_temperature > 0.f;
  auto launch = [&](auto d) {
    constexpr int kD = decltype(d)::value;
    if (f16 && temp) launch_token_kernel<true, true, kD>(p, grid, stream);
    else if (f16) launch_token_kernel<true, false, kD>(p, grid, stream);
    else if (temp) launch_token_kernel<false, true, kD>(p, grid, stream);
    else launch_token_kernel<false, false, kD>(p, grid, stream);
  };
  if (s.head_dim == 64) launch(std::integral_constant<int, 64>{});
  else if (s.head_dim == 256) launch(std::integral_constant<int, 256>{});
  else launch(std::integral_constant<int, 128>{});
}

}  // namespace msa::cuda::sparse_fwd
