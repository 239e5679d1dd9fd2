// Host plan of the sm_90a sparse forward (plan.h): capability checks and the workspace layout.
// Also defines cuda::attention_workspace_bytes.

#include "cuda/sm90/sparse_fwd/plan.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <string>

#include "backend.h"
#include "common/schedule.h"
#include "cuda/common/csr_build.cuh"
#include "cuda/common/index_checks.cuh"
#include "cuda/sm90/sparse_fwd/key_mask.h"
#include "cuda/sm90/sparse_fwd/params.h"
#include "cuda/sm90/sparse_fwd/token_launch.h"
#include "cuda/sm90/sparse_fwd/traits.h"

namespace msa::cuda {
namespace sparse_fwd {
namespace {

size_t align256(size_t x) { return (x + 255) & ~size_t(255); }

// The workspace regions both paths use (paged offsets, the unit table, the dequantized copies),
// from `off` on; returns the end. Dense attention needs nothing else.
size_t take_shared(AttnPlan& w, const AttentionArgs& a, const ProblemShape& s, size_t off) {
  auto take = [&off](size_t bytes) { const size_t at = off; off += align256(bytes); return at; };
  const int64_t hkv = s.num_kv_heads;  // K / V: the real heads; the pairs: query_kv_heads
  if (a.kv.layout != KVLayout::flat) {
    w.paged_offence = take(sizeof(unsigned long long));
    w.key_offsets = take(size_t(s.batch + 1) * 4);
  }
  w.qblock_start = take(size_t(s.batch + 1) * 4);
  w.uniform = take(size_t(query_kv_heads(s, w) * w.qblock_cap) * 4);
  w.num_units = take(8);  // the count and the uniform kernel's claim cursor
  w.units = take(size_t(w.unit_cap) * sizeof(UnitDesc));
  const size_t d = size_t(s.head_dim);
  if (w.dequant_q) w.q_bf16 = take(size_t(s.total_q) * size_t(s.num_q_heads) * d * 2);
  if (w.dequant_kv) {
    w.k_bf16 = take(size_t(w.kv_rows) * size_t(hkv) * d * (w.fp8_qk ? 1 : 2));
    w.v_bf16 = take(size_t(w.kv_rows) * size_t(hkv) * d * 2);
  }
  if (w.fp8_qk) w.k_scale = take(size_t(hkv) * size_t(w.kscale_stride) * 4);
  if (w.key_mask) {
    w.mask_bits = take(size_t(a.key_mask.shape[0]) * size_t(w.mask_words) * 4);
    if (a.key_mask_rows == KeyMaskRows::per_batch) w.mask_token_row = take(size_t(s.total_q) * 4);
  }
  return off;
}

}  // namespace

// Dense attention runs the uniform kernel alone, whose 64-row tiles take floor(64 / G) whole
// tokens of any G up to 64, and larger groups as virtual kv heads (dense_kv_split); the sparse
// path's KV-major kernel and prep need G | 16. Checked by make_plan, before its sizes divide by
// tokens_per_tile(G) (0 past 64), for attention_forward and attention_workspace_bytes alike.
static void check_group(const AttentionArgs& a, const ProblemShape& s) {
  if (a.q2k.defined())
    check_cuda_group(s.group, "attention_forward");
  else
    MSA_CHECK(s.group <= 128, "attention_forward: the CUDA kernels take a GQA group Hq/Hkv of at "
              "most 128, got ", s.group);
}

// Whether calls that can run the merging kernel do (plan.h set_merge_enabled): off until it is
// measured on a GPU, on with MSA_SPARSE_FWD_MERGE=1 (A/B measurement; both write the same bits).
static std::atomic<int>& merge_switch() {
  static std::atomic<int> on{[] {
    const char* v = std::getenv("MSA_SPARSE_FWD_MERGE");
    return v != nullptr && std::string(v) == "1" ? 1 : 0;
  }()};
  return on;
}

// The fewest virtual kv heads per kv head (a divisor of G) whose groups fit a 64-row tile:
// G = 96 or 128: 2 (48 or 64 heads each); a prime G > 64: G (one head each).
static int32_t dense_kv_split(int64_t group) {
  int32_t d = int32_t((group + 63) / 64);
  while (group % d != 0) ++d;
  return d;
}

AttnPlan make_plan(const AttentionArgs& a, const ProblemShape& s) {
  check_group(a, s);
  AttnPlan w;
  const int64_t hkv = s.num_kv_heads, nnz = s.total_q * s.topk;
  const bool paged = a.kv.layout != KVLayout::flat;
  w.dequant_kv = a.kv.k.values.dtype == DType::fp8_e4m3 || a.kv.k.values.dtype == DType::fp4x2;
  if (w.dequant_kv) w.kv_rows = paged ? s.batch * s.max_pages * s.page_size : a.kv.k.values.shape[0];
  w.fp8_qk = a.q.dtype == DType::fp8_e4m3 && a.kv.k.values.dtype == DType::fp8_e4m3;
  w.dequant_q = a.q.dtype == DType::fp8_e4m3 && !w.fp8_qk;
  if (w.fp8_qk) w.kscale_stride = std::max<int64_t>(4, (w.kv_rows + 3) / 4 * 4);
  w.dense = !a.q2k.defined();
  w.blk = w.dense ? kBlockN : s.kv_block_size;
  if (w.dense) w.kv_split = dense_kv_split(s.group);
  // Query blocks of Q tokens: sum_b ceil(Lq_b / Q) <= ceil(total_q / Q) + B; a pair has at most
  // units_per_qblock(G, Q, tiles) units.
  w.unit_tiles = unit_tiles_of(s.head_dim);
  w.qblock_shift = qblock_shift_of(w.dense, query_group(s, w), w.unit_tiles);
  const int64_t qbs = int64_t(1) << w.qblock_shift;
  w.qblock_cap = (s.total_q + qbs - 1) / qbs + s.batch;
  w.unit_cap = query_kv_heads(s, w) * w.qblock_cap *
               units_per_qblock(query_group(s, w), int(qbs), w.unit_tiles);
  w.key_mask = a.key_mask.defined();
  if (w.key_mask) w.mask_words = int32_t(key_mask_words(a.key_mask.shape[1]));
  if (w.dense) {  // no CSR, chunks or partials: only the uniform kernel runs
    w.total = take_shared(w, a, s, 0);
    return w;
  }
  w.build_csr = !a.k2q.row_ptr.defined();
  w.build_schedule = !w.build_csr && !a.k2q.schedule.defined();
  if (w.build_csr && paged) {
    // Lk_b <= max_pages * page_size (longer seqused_k are clamped and reported).
    w.total_rows = s.batch * ((s.max_pages * s.page_size + w.blk - 1) / w.blk);
  } else if (w.build_csr) {
    // sum_b ceil(Lk_b / blk) <= total_k / blk + B: rows past the real total stay empty.
    w.total_rows = (a.kv.k.values.shape[0] + w.blk - 1) / w.blk + s.batch;
  } else {
    w.total_rows = a.k2q.row_ptr.shape[1] - 1;
  }
  w.window_keys = int32_t(std::min<int64_t>(((w.qblock_cap - 1) >> kWindowShift) + 1,
                                            kMaxWindowKeys));
  w.fused_prep = s.topk <= kQ2KStagedMaxTopk && w.window_keys <= kFusedMaxWindows &&
                 (!w.build_csr || w.total_rows < kCsrMaxRows);
  if (w.fused_prep && w.build_csr) {
    w.csr_tile_rows = std::max<int64_t>(1, kCsrTileKeys / std::max<int64_t>(s.topk, 1));
    w.csr_tiles_per_head = (s.total_q + w.csr_tile_rows - 1) / w.csr_tile_rows;
    int64_t cap = 1;
    while (cap < w.csr_tile_rows * s.topk) cap <<= 1;
    w.csr_tile_cap = cap;
  }
  w.schedule_capacity = hkv * w.total_rows;
  w.chunk_tokens = kChunkTiles * tokens_per_tile(int(s.group));
  w.chunk_capacity = w.schedule_capacity + (hkv * nnz + w.chunk_tokens - 1) / w.chunk_tokens;
  const size_t part_elems = size_t(hkv) * size_t(nnz) * size_t(s.group);
  const size_t part_bytes = a.params.partial_dtype == DType::bf16 ? 2 : 4;
  size_t off = take_shared(w, a, s, 0);
  auto take = [&off](size_t bytes) { const size_t at = off; off += align256(bytes); return at; };
  w.check = take(kQ2KCheckWorkspaceBytes);
  w.valid_per_head = take(size_t(hkv) * 4);
  w.k2q_first = take(sizeof(unsigned long long));
  w.row_start = take(size_t(s.batch + 1) * 4);
  w.chunk_start = take(size_t(w.schedule_capacity + 1) * 4);
  w.num_chunks = take(4);
  w.chunks = take(size_t(w.chunk_capacity) * sizeof(ChunkDesc));
  w.chunks_by_row = take(size_t(w.chunk_capacity) * sizeof(ChunkDesc));
  w.chunk_keys = take(size_t(w.chunk_capacity) * 4);
  w.chunk_ids = take(size_t(w.chunk_capacity) * 4);
  if (w.fused_prep) {  // a counting sort by query window in the fused kernel
    w.window_count = take(size_t(w.window_keys) * 4);
    w.window_hist = take(size_t(kFusedMaxBlocks) * size_t(w.window_keys) * 4);
  } else {  // CUB's radix sort
    w.chunk_keys_sorted = take(size_t(w.chunk_capacity) * 4);
    w.chunk_order = take(size_t(w.chunk_capacity) * 4);
    w.sort_tmp_bytes = chunk_sort_bytes(w.chunk_capacity, window_key_bits(w.window_keys));
    w.sort_tmp = take(w.sort_tmp_bytes);
  }
  w.work_local = take(size_t(hkv * nnz) * 4);
  w.work_slot = take(size_t(hkv * nnz) * 4);
  w.unit_start = take(size_t(hkv * w.qblock_cap) * 4);
  w.unit_order_start = take(size_t(hkv * w.qblock_cap + 1) * 4);
  w.part_o = take(part_elems * size_t(s.head_dim) * part_bytes);
  w.part_lse = take(part_elems * 4);
  w.part_rl = take(part_elems * 4);
  w.part_tlse = take(a.params.temperature > 0.f ? part_elems * 4 : 0);
  const bool q_bf16 = a.q.dtype == DType::bf16 || (a.q.dtype == DType::fp8_e4m3 && !w.fp8_qk);
  w.merge = merge_enabled() && w.fused_prep && q_bf16 && s.head_dim == kHeadDim &&
            w.blk == kBlockN && a.params.partial_dtype == DType::bf16 &&
            !(a.params.temperature > 0.f) && merge_shape_fits(s.group, s.topk);
  if (w.merge) {
    w.merge_count = take(size_t(hkv) * size_t(s.total_q) * 4);
    w.merge_list = take(size_t(hkv) * size_t(s.total_q) * 8);
    w.merge_ctr = take(3 * 4);
  }
  if (w.build_csr) {
    w.row_ptr = take(size_t(hkv * (w.total_rows + 1)) * 4);
    w.q_idx = take(size_t(hkv * nnz) * 4);
  }
  if (w.build_csr || w.build_schedule)
    w.schedule = take(size_t(sched::max_schedule_ints(hkv, w.total_rows)) * 4);
  if (w.build_csr && w.fused_prep) {
    const int64_t tiles = hkv * w.csr_tiles_per_head;
    w.csr_tile_keys = take(size_t(tiles * w.csr_tile_cap) * 4);
    w.csr_tile_counts = take(size_t(tiles * w.total_rows) * 4);
    w.csr_row_totals = take(size_t(hkv * w.total_rows) * 4);
  } else if (w.build_csr) {
    w.csr_ws = take(csr_build_workspace_bytes(hkv, w.total_rows, s.total_q, s.topk));
  }
  w.total = off;
  return w;
}


bool merge_enabled() { return merge_switch().load(std::memory_order_relaxed) != 0; }
void set_merge_enabled(bool on) { merge_switch().store(on ? 1 : 0, std::memory_order_relaxed); }

void check_kv_dtypes(const AttentionArgs& a, DType qt, const char* quantized_q) {
  const DType kt = a.kv.k.values.dtype;
  MSA_CHECK(kt == a.kv.v.values.dtype, "k, v: must have one dtype on CUDA, got ", dtype_name(kt),
            " and ", dtype_name(a.kv.v.values.dtype));
  if (kt == DType::fp8_e4m3 || kt == DType::fp4x2) {  // dequantized to bf16 (dequant_kv.cuh)
    MSA_CHECK(qt == DType::bf16, "q: ", dtype_name(kt), " K/V take ", quantized_q,
              " q on CUDA, got ", dtype_name(a.q.dtype));
    MSA_CHECK(kt != DType::fp4x2 || a.kv.k.scale.dtype == a.kv.v.scale.dtype,
              "k, v: one FP4 format for both on CUDA (NVFP4 or MXFP4 scales), got ",
              dtype_name(a.kv.k.scale.dtype), " and ", dtype_name(a.kv.v.scale.dtype));
    for (const Tensor* t : {&a.kv.k.values, &a.kv.v.values}) {  // 16-byte row loads
      MSA_CHECK(reinterpret_cast<uintptr_t>(t->data) % 16 == 0, "k, v: ", dtype_name(kt),
                " values must be 16-byte aligned on CUDA");
      for (int d = 0; d + 1 < t->ndim; ++d)
        MSA_CHECK(t->strides[d] % 16 == 0, "k, v: ", dtype_name(kt), " strides must be multiples "
                  "of 16 elements on CUDA, got ", t->describe());
    }
  } else {
    MSA_CHECK(kt == qt, "k, v: must have q's dtype (", dtype_name(qt),
              ") or be fp8_e4m3 / fp4x2 on CUDA, got ", dtype_name(kt));
  }
}

uint8_t* checked_workspace(const AttentionArgs& a, const AttnPlan& w, const WorkspaceSource& src) {
  const size_t have = a.workspace.defined() ? size_t(a.workspace.numel()) : 0;
  MSA_CHECK(have >= w.total, "workspace: needs ", src.size_fn, " = ", src.offset + w.total,
            " bytes, got ", a.workspace.defined() ? std::to_string(src.offset + have) : "none");
  auto* ws = static_cast<uint8_t*>(a.workspace.data);
  MSA_CHECK((reinterpret_cast<uintptr_t>(ws) & 255) == 0,
            "workspace: must be 256-byte aligned on CUDA");
  return ws;
}

void check_supported(const AttentionArgs& a, const ProblemShape& s) {
  // D = 64 and 256: the kernels' tiles of that head dim (traits.h HeadDimTraits, KVMajorTraits)
  // over 16-bit q / k / v, sparse and dense; FP8 / FP4 K/V and FP8 q through their bf16 copies
  // (dequant_kv.cuh, D-generic). FP8 q over FP8 K/V forms Q K^T on e4m3 operands in 128-byte
  // rows (the kFp8 kernels): D = 128 only.
  MSA_CHECK(s.head_dim == kHeadDim || s.head_dim == 64 || s.head_dim == 256 || s.head_dim == 32,
            "q: head dim must be 32, 64, 128 or 256 on CUDA, got ", s.head_dim);
  // D = 32 runs D = 64's dense tiles over zero-filled columns (traits.h HeadDimTraits): dense
  // attention over 16-bit q / k / v only.
  if (s.head_dim == 32) {
    MSA_CHECK(!a.q2k.defined(), "q2k: head dim 32 runs dense attention only on CUDA (no q2k)");
    const DType kt = a.kv.k.values.dtype;
    MSA_CHECK(a.q.dtype != DType::fp8_e4m3 && kt != DType::fp8_e4m3 && kt != DType::fp4x2,
              "q, k: head dim 32 takes bf16 or f16 q, k and v on CUDA, got q ",
              dtype_name(a.q.dtype), " and k ", dtype_name(kt));
  }
  MSA_CHECK(s.head_dim == kHeadDim || a.q.dtype != DType::fp8_e4m3 ||
                a.kv.k.values.dtype != DType::fp8_e4m3,
            "q, k: head dim ", s.head_dim, " takes fp8_e4m3 q over bf16 or FP4 K/V on CUDA, not "
            "over fp8_e4m3 K/V (Q K^T on e4m3 operands runs head dim 128)");
  // FP8 q: QK in FP8 over FP8 K (the kFp8 kernels); over 16-bit or FP4 K/V its values as bf16
  // (exact, launch_dequant_q).
  const DType qt = a.q.dtype == DType::fp8_e4m3 ? DType::bf16 : a.q.dtype;
  check_kv_dtypes(a, qt, "bf16 or fp8_e4m3");
  // Dense attention has no block ids: the unit of its K/V loads is the kernels' own. Sparse
  // calls run kernels over blocks of 128 or 64 keys (traits.h kBlk), FP8 Q K^T included.
  MSA_CHECK(!a.q2k.defined() || s.kv_block_size == kBlockN || s.kv_block_size == 64,
            "params.kv_block_size: must be 64 or 128 on CUDA, got ", s.kv_block_size);
  MSA_CHECK(!a.key_mask.defined() || key_mask_words(a.key_mask.shape[1]) < INT32_MAX / 2,
            "key_mask: Lk_max = ", a.key_mask.shape[1], " is too large for CUDA");
  MSA_CHECK(s.total_q * s.topk * s.num_kv_heads < INT32_MAX,
            "q2k: Hkv * total_q * topk must be below 2^31 on CUDA");
  MSA_CHECK(a.kv.k.values.shape[0] < INT32_MAX && s.total_q < INT32_MAX,
            "q, k: token counts must be below 2^31 on CUDA (TMA coordinates are int32)");
  if (a.kv.layout != KVLayout::flat)
    MSA_CHECK(s.batch * s.max_pages * s.page_size < INT32_MAX,
              "page_table: B * max_pages * page_size (", s.batch, " * ", s.max_pages, " * ",
              s.page_size, ") must be below 2^31 on CUDA (paged key offsets are int32)");
}

}  // namespace sparse_fwd

void check_attention_supported(const AttentionArgs& a, const ProblemShape& s) {
  if (sparse_fwd::is_token_call(a, s)) sparse_fwd::check_token_supported(a, s);
  else sparse_fwd::check_supported(a, s);
}

size_t attention_workspace_bytes(const AttentionArgs& a, const ProblemShape& s) {
  if (sparse_fwd::is_token_call(a, s)) return sparse_fwd::token_workspace_bytes(a, s);
  sparse_fwd::check_supported(a, s);  // a size for a call the kernels refuse would mislead
  return sparse_fwd::make_plan(a, s).total;
}

}  // namespace msa::cuda
