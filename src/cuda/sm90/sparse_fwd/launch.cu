// Host entry of the sm_90a sparse attention forward (cuda::attention_forward): the plan
// (plan.h), the prep chain (prep.h), then the main kernels (launch_kernels.h: KV-major chunks and
// uniform units, one CTA per SM each) and the combine of the KV-major partials.

#include <cmath>
#include <string>

#include "backend.h"
#include "cuda/common/combine.cuh"
#include "cuda/common/dequant_kv.cuh"
#include "cuda/device/tma_map.h"
#include "cuda/sm90/sparse_fwd/key_mask.h"
#include "cuda/sm90/sparse_fwd/launch_kernels.h"
#include "cuda/sm90/sparse_fwd/plan.h"
#include "cuda/sm90/sparse_fwd/prep.h"
#include "cuda/sm90/sparse_fwd/token_launch.h"
#include "cuda/sm90/sparse_fwd/traits.h"

namespace msa::cuda {
namespace sparse_fwd {

// The page pool as the kernels address it.
static PagedKV paged_kv_of(const AttentionArgs& a, const ProblemShape& s) {
  return make_paged_kv(a.kv.page_table.ptr<int32_t>(), a.kv.page_table.strides[0], s.num_pages,
                       s.page_size, a.kv.layout == KVLayout::paged_hnd);
}

// FP8 or FP4 K/V into the plan's flat bf16 copy: flat caches row for row, a pool's batches at the
// key offsets (out_offsets: the paged check's clamped lengths).
void launch_dequant(const AttentionArgs& a, const ProblemShape& s, const AttnPlan& w, uint8_t* ws,
                    const int32_t* out_offsets, cudaStream_t stream) {
  DequantKVParams d;
  d.k = a.kv.k.values.ptr<uint8_t>();
  d.v = a.kv.v.values.ptr<uint8_t>();
  d.head_dim = int32_t(s.head_dim);
  for (int i = 0; i < 3; ++i) {
    d.k_stride[i] = i + 1 < a.kv.k.values.ndim ? a.kv.k.values.strides[i] : 0;
    d.v_stride[i] = i + 1 < a.kv.v.values.ndim ? a.kv.v.values.strides[i] : 0;
  }
  d.k_scale = a.kv.k.scale.defined() ? a.kv.k.scale.data : nullptr;
  d.v_scale = a.kv.v.scale.defined() ? a.kv.v.scale.data : nullptr;
  if (a.kv.k.values.dtype == DType::fp4x2) {  // scales laid out like the values, checked by the api
    d.format = a.kv.k.scale.dtype == DType::fp8_e4m3 ? KVFormat::nvfp4 : KVFormat::mxfp4;
    for (int i = 0; i + 1 < a.kv.k.scale.ndim; ++i) {  // [T, Hkv, G] or a pool of 4 dims
      d.k_scale_stride[i] = a.kv.k.scale.strides[i];
      d.v_scale_stride[i] = a.kv.v.scale.strides[i];
    }
    d.k_global = a.kv.k.global_scale;
    d.v_global = a.kv.v.global_scale;
  } else {
    d.k_scale_kind = fp8_scale_kind(a.kv.k.scale);
    d.v_scale_kind = fp8_scale_kind(a.kv.v.scale);
  }
  d.batch = int32_t(s.batch);
  d.num_kv_heads = int32_t(s.num_kv_heads);
  d.out_offsets = out_offsets;
  d.out_rows = w.kv_rows;
  if (a.kv.layout == KVLayout::flat) {
    d.cu_seqlens_k = a.kv.cu_seqlens_k.ptr<int32_t>();
    d.total_k = a.kv.k.values.shape[0];
    d.max_keys = d.total_k;
  } else {
    d.paged = a.kv.layout == KVLayout::paged_nhd ? 1 : 2;
    d.pool = paged_kv_of(a, s);
    d.max_keys = s.max_pages * s.page_size;
  }
  d.k_out = ws + w.k_bf16;
  d.v_out = ws + w.v_bf16;
  if (w.fp8_qk) {
    d.k_raw = 1;
    d.k_scale_out = reinterpret_cast<float*>(ws + w.k_scale);
    d.k_scale_out_stride = w.kscale_stride;
  }
  launch_dequant_kv(d, stream);
}

}  // namespace sparse_fwd

namespace {

using namespace sparse_fwd;



// The problem as both main kernels see it.
AttnProblem attn_problem(const AttentionArgs& a, const ProblemShape& s, const AttnPlan& w) {
  const float scale = a.params.softmax_scale > 0.f ? a.params.softmax_scale
                                                   : 1.f / std::sqrt(float(s.head_dim));
  AttnProblem pr;
  pr.total_q = s.total_q;
  pr.group = query_group(s, w);
  pr.kv_split = w.kv_split;
  pr.topk = int32_t(s.topk);
  pr.tokens_per_tile = tokens_per_tile(pr.group);
  pr.causal = a.params.causal ? 1 : 0;
  pr.scale_log2 = scale * 1.4426950408889634f;
  pr.inv_temperature = a.params.temperature > 0.f ? 1.f / a.params.temperature : 0.f;
  pr.soft_cap_log2 = a.params.soft_cap > 0.f ? a.params.soft_cap * 1.4426950408889634f : 0.f;
  if (a.kv.layout != KVLayout::flat && !w.dequant_kv) pr.paged = paged_kv_of(a, s);
  if (a.q.dtype == DType::fp8_e4m3 && a.q_scale.defined()) {
    pr.q_scale = a.q_scale.ptr<float>();
    pr.q_scale_kind = fp8_scale_kind(a.q_scale);
    pr.num_q_heads = int32_t(s.num_q_heads);
  }
  return pr;
}


// Both main kernels over the prep chain's tables: KV-major chunks write partials, uniform units
// write out / lse directly. Dense attention runs the uniform kernel alone.
void launch_main_kernels(const AttentionArgs& a, const ProblemShape& s, const AttnPlan& w,
                         uint8_t* ws, const PrepParams& pp, cudaStream_t stream) {
  AttnProblem pr = attn_problem(a, s, w);
  const bool paged = pr.paged.page_table != nullptr;
  if (w.key_mask) {  // packed by launch_key_mask
    pr.mask_bits = reinterpret_cast<const uint32_t*>(ws + w.mask_bits);
    pr.mask_token_row = a.key_mask_rows == KeyMaskRows::per_batch
                            ? reinterpret_cast<const int32_t*>(ws + w.mask_token_row)
                            : nullptr;
    pr.mask_words = w.mask_words;
  }
  // Keys per located block: 64 at head dim 256 and over 64-key blocks (traits.h block_keys_of), so
  // pool boxes of at most 64 slots (kv_load.cuh locate_kv_block<64>).
  const uint32_t block_keys = uint32_t(block_keys_of(s.head_dim, w.blk));
  while ((1u << pr.paged.box_shift) > block_keys) --pr.paged.box_shift;
  const bool f16 = a.q.dtype == DType::f16;
  const Tensor q = w.dequant_q ? Tensor(ws + w.q_bf16, DType::bf16,
                                        {s.total_q, s.num_q_heads, s.head_dim}, a.q.device)
                               : a.q;
  // A box row is 128 bytes: 64 columns of 16-bit q, all 128 of e4m3 q (FP8 QK).
  const uint32_t q_cols = w.fp8_qk ? kHeadDim : kHalfCols;
  const CUtensorMap tq = make_tma_3d(q, q_cols, uint32_t(query_group(s, w)), 1, "attention_forward");
  const uint32_t box_keys = 1u << pr.paged.box_shift;
  const bool slots_outer = a.kv.layout == KVLayout::paged_nhd;
  auto kv_map = [&](const Tensor& t, const char* name) {
    return paged ? make_tma_paged(t, slots_outer, kHalfCols, box_keys, name, "attention_forward")
                 : make_tma_3d(t, kHalfCols, 1, block_keys, "attention_forward");
  };
  // FP8: the flat bf16 copy dequant_kv wrote.
  auto bf16_copy = [&](size_t offset) {
    return Tensor(ws + offset, DType::bf16, {w.kv_rows, s.num_kv_heads, s.head_dim}, a.q.device);
  };
  CUtensorMap tk;
  if (w.fp8_qk) {  // the copy's e4m3 K in 128-byte rows and its key scales
    tk = make_tma_3d(Tensor(ws + w.k_bf16, DType::fp8_e4m3, {w.kv_rows, s.num_kv_heads, kHeadDim},
                            a.q.device),
                     kHeadDim, 1, block_keys, "attention_forward");
    pr.kscale = reinterpret_cast<const float*>(ws + w.k_scale);
    pr.kscale_stride = w.kscale_stride;
    pr.kscale_rows = int32_t(w.kv_rows);
    pr.kscale_uniform = fp8_scale_kind(a.kv.k.scale) <= 1 ? 1 : 0;
  } else {
    tk = kv_map(w.dequant_kv ? bf16_copy(w.k_bf16) : a.kv.k.values, "k");
  }
  const CUtensorMap tv = kv_map(w.dequant_kv ? bf16_copy(w.v_bf16) : a.kv.v.values, "v");
  if (!w.dense) {
    MainParams mp;
    static_cast<AttnProblem&>(mp) = pr;
    mp.chunks = pp.chunks;
    mp.num_chunks = pp.num_chunks;
    mp.work_local = pp.work_local;
    mp.work_slot = pp.work_slot;
    mp.q_idx_stride = s.total_q * s.topk;
    mp.part_o = ws + w.part_o;
    mp.part_bf16 = a.params.partial_dtype == DType::bf16 ? 1 : 0;
    // [entries, G, D] bf16: each token's G partial rows are one box per half (staged partials:
    // not at D = 256, traits.h KVMajorTraits)
    if (mp.part_bf16 && s.head_dim != 256)
      mp.tm_part = make_tma_3d(Tensor(mp.part_o, DType::bf16,
                                      {s.num_kv_heads * s.total_q * s.topk, s.group, s.head_dim},
                                      a.q.device),
                               kHalfCols, uint32_t(s.group), 1, "attention_forward");
    mp.part_lse = reinterpret_cast<float*>(ws + w.part_lse);
    mp.part_rl = reinterpret_cast<float*>(ws + w.part_rl);
    mp.part_tlse = a.params.temperature > 0.f ? reinterpret_cast<float*>(ws + w.part_tlse) : nullptr;
    const bool d64 = s.head_dim == 64, d256 = s.head_dim == 256;  // 16-bit (check_supported)
    if (w.merge) {  // the combine inside the KV-major kernel (merge.cuh)
      mp.merge_count = reinterpret_cast<uint32_t*>(ws + w.merge_count);
      mp.merge_list = reinterpret_cast<unsigned long long*>(ws + w.merge_list);
      mp.merge_ctr = reinterpret_cast<uint32_t*>(ws + w.merge_ctr);
      mp.merge_list_cap = uint32_t(s.num_kv_heads * s.total_q);
      mp.out = a.out.data;
      mp.out_stride_t = a.out.strides[0];
      mp.out_stride_h = a.out.strides[1];
      mp.lse = a.lse.defined() ? a.lse.ptr<float>() : nullptr;
      launch_main_merge(tq, tk, tv, mp, stream);
    } else if (d256 && w.blk == 64 && f16) launch_main<true, false, 64, 256>(tq, tk, tv, mp, stream);
    else if (d256 && w.blk == 64) launch_main<false, false, 64, 256>(tq, tk, tv, mp, stream);
    else if (d256 && f16) launch_main<true, false, 128, 256>(tq, tk, tv, mp, stream);
    else if (d256) launch_main<false, false, 128, 256>(tq, tk, tv, mp, stream);
    else if (w.fp8_qk && w.blk == 64) launch_main<false, true, 64, 128>(tq, tk, tv, mp, stream);
    else if (w.fp8_qk) launch_main<false, true, 128, 128>(tq, tk, tv, mp, stream);
    else if (d64 && w.blk == 64 && f16) launch_main<true, false, 64, 64>(tq, tk, tv, mp, stream);
    else if (d64 && w.blk == 64) launch_main<false, false, 64, 64>(tq, tk, tv, mp, stream);
    else if (d64 && f16) launch_main<true, false, 128, 64>(tq, tk, tv, mp, stream);
    else if (d64) launch_main<false, false, 128, 64>(tq, tk, tv, mp, stream);
    else if (w.blk == 64 && f16) launch_main<true, false, 64, 128>(tq, tk, tv, mp, stream);
    else if (w.blk == 64) launch_main<false, false, 64, 128>(tq, tk, tv, mp, stream);
    else if (f16) launch_main<true, false, 128, 128>(tq, tk, tv, mp, stream);
    else launch_main<false, false, 128, 128>(tq, tk, tv, mp, stream);
  }
  UniformParams up;
  static_cast<AttnProblem&>(up) = pr;
  up.units = pp.units;
  up.num_units = pp.num_units;
  up.unit_cursor = pp.num_units + 1;
  up.q2k = w.dense ? nullptr : pp.q2k;
  up.dense = w.dense ? 1 : 0;
  up.out = a.out.data;
  up.out_stride_t = a.out.strides[0];
  up.out_stride_h = a.out.strides[1];
  up.lse = a.lse.defined() ? a.lse.ptr<float>() : nullptr;
  up.tlse = a.tlse.defined() ? a.tlse.ptr<float>() : nullptr;
  // Dense calls over a flat cache at D = 128 run the kernel with a Q warp (uniform_load.cuh). Over
  // a paged cache it measured slower (H100: DENSE-CHUNK 15.0-15.6 against 14.1-14.7 ms, LAT-CHUNK
  // dense +3%), also with its Q warp's waits made non-polling; its consumers waited on K 2.6x as
  // long (ncu, LAT-CHUNK), the cause not found.
  const bool dense_q = w.dense && a.kv.layout == KVLayout::flat;
  if (s.head_dim == 32) {  // dense, 16-bit q / k / v (check_supported)
    if (f16) launch_uniform<true, false, 32, 128>(tq, tk, tv, up, stream);
    else launch_uniform<false, false, 32, 128>(tq, tk, tv, up, stream);
  } else if (s.head_dim == 64) {  // 16-bit q / k / v (check_supported); dense runs 128-key blocks
    if (w.blk == 64 && f16) launch_uniform<true, false, 64, 64>(tq, tk, tv, up, stream);
    else if (w.blk == 64) launch_uniform<false, false, 64, 64>(tq, tk, tv, up, stream);
    else if (f16) launch_uniform<true, false, 64, 128>(tq, tk, tv, up, stream);
    else launch_uniform<false, false, 64, 128>(tq, tk, tv, up, stream);
  } else if (s.head_dim == 256) {  // 16-bit; dense runs 128-key blocks
    if (w.blk == 64 && f16) launch_uniform<true, false, 256, 64>(tq, tk, tv, up, stream);
    else if (w.blk == 64) launch_uniform<false, false, 256, 64>(tq, tk, tv, up, stream);
    else if (f16 && !w.dense) launch_uniform<true, false, 256, 128, true>(tq, tk, tv, up, stream);
    else if (!w.dense) launch_uniform<false, false, 256, 128, true>(tq, tk, tv, up, stream);
    else if (f16) launch_uniform<true, false, 256, 128>(tq, tk, tv, up, stream);
    else launch_uniform<false, false, 256, 128>(tq, tk, tv, up, stream);
  } else if (w.fp8_qk && w.blk == 64) {
    launch_uniform<false, true, 128, 64>(tq, tk, tv, up, stream);
  } else if (w.fp8_qk) {
    launch_uniform<false, true, 128, 128>(tq, tk, tv, up, stream);
  } else if (w.blk == 64) {  // sparse over 64-key blocks
    if (f16) launch_uniform<true, false, 128, 64>(tq, tk, tv, up, stream);
    else launch_uniform<false, false, 128, 64>(tq, tk, tv, up, stream);
  } else if (f16) {
    if (dense_q) launch_uniform<true, false, 128, 128, false, true>(tq, tk, tv, up, stream);
    else launch_uniform<true, false, 128, 128>(tq, tk, tv, up, stream);
  } else if (dense_q) {
    launch_uniform<false, false, 128, 128, false, true>(tq, tk, tv, up, stream);
  } else {
    launch_uniform<false, false, 128, 128>(tq, tk, tv, up, stream);
  }
}

// Merges the KV-major partials into out / lse / tlse (rows of uniform query blocks are skipped:
// the uniform kernel wrote them).
void launch_combine(const AttentionArgs& a, const ProblemShape& s, const AttnPlan& w,
                    uint8_t* ws, const PrepParams& pp, cudaStream_t stream) {
  CombineParams cp;
  cp.q2k = pp.q2k;
  cp.cu_seqlens_q = pp.cu_seqlens_q;
  cp.cu_seqlens_k = pp.cu_seqlens_k;
  cp.part_o = ws + w.part_o;
  cp.part_bf16 = a.params.partial_dtype == DType::bf16 ? 1 : 0;
  cp.part_lse = reinterpret_cast<const float*>(ws + w.part_lse);
  cp.part_rl = reinterpret_cast<const float*>(ws + w.part_rl);
  cp.part_tlse = a.tlse.defined() ? reinterpret_cast<const float*>(ws + w.part_tlse) : nullptr;
  cp.out = a.out.data;
  cp.out_stride_t = a.out.strides[0];
  cp.out_stride_h = a.out.strides[1];
  cp.head_dim = int32_t(s.head_dim);
  cp.lse = a.lse.defined() ? a.lse.ptr<float>() : nullptr;
  cp.tlse = a.tlse.defined() ? a.tlse.ptr<float>() : nullptr;
  cp.batch = s.batch;
  cp.total_q = s.total_q;
  cp.num_kv_heads = int32_t(query_kv_heads(s, w));
  cp.group = query_group(s, w);
  cp.topk = int32_t(s.topk);
  cp.kv_block_size = int32_t(w.blk);
  cp.uniform = pp.uniform;
  cp.qblock_start = pp.qblock_start;
  cp.qblock_cap = w.qblock_cap;
  cp.qblock_shift = w.qblock_shift;
  launch_sparse_combine(cp, a.q.dtype == DType::f16, stream);
}

}  // namespace

void attention_forward(const AttentionArgs& a, const ProblemShape& s, cudaStream_t stream,
                       const WorkspaceSource& src) {
  if (is_token_call(a, s)) return token_attention_forward(a, s, stream, src);
  check_supported(a, s);
  if (s.total_q == 0) return;
  const AttnPlan w = make_plan(a, s);
  uint8_t* ws = checked_workspace(a, w, src);
  if (w.dequant_q) {
    DequantQParams d;
    d.q = a.q.ptr<uint8_t>();
    d.stride_t = a.q.strides[0];
    d.stride_h = a.q.strides[1];
    d.heads = int32_t(s.num_q_heads);
    d.head_dim = int32_t(s.head_dim);
    d.total_q = s.total_q;
    d.out = ws + w.q_bf16;
    launch_dequant_q(d, stream);
  }
  const PrepParams pp = launch_prep(a, s, w, ws, stream);
  if (w.dequant_kv && pp.uniform_enabled) launch_dequant(a, s, w, ws, pp.cu_seqlens_k, stream);
  if (w.key_mask && pp.uniform_enabled) {  // after the prep: it reads the checked key lengths
    KeyMaskParams m;
    m.mask = a.key_mask.ptr<uint8_t>();
    m.row_stride = a.key_mask.strides[0];
    m.rows = a.key_mask.shape[0];
    m.cols = a.key_mask.shape[1];
    m.words = w.mask_words;
    m.bits = reinterpret_cast<uint32_t*>(ws + w.mask_bits);
    m.per_query = a.key_mask_rows == KeyMaskRows::per_query ? 1 : 0;
    m.token_row = m.per_query ? nullptr : reinterpret_cast<int32_t*>(ws + w.mask_token_row);
    m.cu_seqlens_q = pp.cu_seqlens_q;
    m.cu_seqlens_k = pp.cu_seqlens_k;
    m.batch = s.batch;
    m.total_q = s.total_q;
    m.status = a.status.ptr<int32_t>();
    launch_key_mask(m, stream);
  }
  if (pp.uniform_enabled) launch_main_kernels(a, s, w, ws, pp, stream);
  // Dense with keys: the uniform kernel wrote every row. Without keys (no TMA map over an empty
  // extent) the combine writes the zero rows: topk 0, every pair flagged 0 (dense_units_kernel).
  // The merging kernel combined the partials itself (plan.h AttnPlan::merge).
  if (!pp.uniform_enabled || !(w.dense || w.merge)) launch_combine(a, s, w, ws, pp, stream);
}

}  // namespace msa::cuda
