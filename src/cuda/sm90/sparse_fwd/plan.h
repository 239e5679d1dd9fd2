// Host plan of the sm_90a sparse forward: what the kernels support (check_supported) and the one
// workspace layout of a call (AttnPlan), sized from host-known shapes only, so
// attention_workspace_bytes and attention_forward agree without reading device memory. Used by
// launch.cu and prep.cu; defined in plan.cpp.
#pragma once

#include <cstddef>
#include <cstdint>

#include "backend.h"
#include "common/problem.h"
#include "msa/attention.h"

namespace msa::cuda::sparse_fwd {

// Byte offsets into the attention workspace (each 256-byte aligned) and the capacities behind
// them.
struct AttnPlan {
  int64_t total_rows = 0;        // rows of the CSR in use (caller's, or an upper bound)
  int64_t schedule_capacity = 0; // items
  int64_t chunk_capacity = 0;
  int32_t chunk_tokens = 0;
  int32_t qblock_shift = 7;  // query blocks of the uniform path (traits.h qblock_shift_of)
  int64_t qblock_cap = 0, unit_cap = 0;
  int32_t unit_tiles = 2;        // 64-row tiles a uniform unit (traits.h unit_tiles_of)
  int32_t window_keys = 0;       // query windows (PrepParams::window_keys)
  bool build_csr = false, build_schedule = false;
  // The whole prep as one cooperative kernel (prep.cu launch_prep_fused), the CSR built in it
  // when the caller passes none: q2k rows of at most kQ2KStagedMaxTopk ids. Otherwise the chain of
  // kernels with CUB's sorts.
  bool fused_prep = false;
  // The fused CSR build: q2k rows in tiles of csr_tile_rows tokens of one kv head (csr_tiles_per_head
  // a head), each tile's (row, token) keys sorted in csr_tile_cap shared-memory slots
  // (kCsrTileKeys at most), u32 keys.
  int64_t csr_tile_rows = 0, csr_tiles_per_head = 0, csr_tile_cap = 0;
  // Dense attention (no q2k): only the paged check, dense_units_kernel and the uniform kernel
  // run; the CSR, chunk and partial regions are not laid out.
  bool dense = false;
  // Keys per kv block of the kernels (traits.h kBlk): the call's kv_block_size (128 or 64) for
  // sparse calls, 128 for dense attention (no block ids: the kernels' own unit).
  int64_t blk = 128;
  // Dense attention with G > 64: each kv head's G query heads run as kv_split virtual kv heads of
  // G / kv_split (<= 64) heads each (dense_kv_split). The query side (units, tiles, combine)
  // counts virtual heads (query_kv_heads, query_group), K and V the real ones. 1 otherwise.
  int32_t kv_split = 1;
  // FP8 or FP4 K/V: dequantized to a flat bf16 copy of kv_rows keys (common/dequant_kv.cuh) that the
  // kernels read as flat KV (a page pool's batches at the paged check's key_offsets).
  bool dequant_kv = false;
  // FP8 q over bf16 / f16 or FP4 K/V: q's values as a contiguous bf16 copy (common/dequant_kv.cuh
  // launch_dequant_q).
  bool dequant_q = false;
  // FP8 q over FP8 K/V: QK in FP8 (the kFp8 kernels, traits.h): q read as it is; the copy's K stays
  // e4m3 (k_bf16 then holds e4m3) with its scales as [Hkv, kscale_stride] f32 rows at k_scale.
  bool fp8_qk = false;
  size_t q_bf16 = 0;
  int64_t kv_rows = 0;
  size_t k_bf16 = 0, v_bf16 = 0;
  size_t k_scale = 0;
  int64_t kscale_stride = 0;  // kv_rows rounded up to 4 (16-byte rows for TMA)
  size_t paged_offence = 0, key_offsets = 0;  // paged KV only
  size_t check = 0, row_start = 0, chunk_start = 0, num_chunks = 0, chunks = 0;
  size_t valid_per_head = 0, k2q_first = 0;  // the caller's k2q check (build_csr false)
  size_t chunks_by_row = 0, chunk_keys = 0, chunk_keys_sorted = 0, chunk_ids = 0, chunk_order = 0;
  size_t sort_tmp = 0, sort_tmp_bytes = 0;
  // fused prep: [window_keys] chunks per query window, then each window's first place; the
  // chunks of each CTA's range per window [kFusedMaxBlocks, window_keys], then their first place
  size_t window_count = 0, window_hist = 0;
  size_t work_local = 0, work_slot = 0;
  size_t qblock_start = 0, uniform = 0, unit_start = 0, unit_order_start = 0, num_units = 0;
  size_t units = 0;
  size_t part_o = 0, part_lse = 0, part_rl = 0, part_tlse = 0;
  // The combine inside the KV-major kernel (merge.cuh): 16-bit q read as bf16 at D = 128 over
  // 128-key blocks, bf16 partials, no temperature LSE, top-K <= kMergeMaxTopk, G a power of 2 in
  // 2-16 and the fused prep (which sets the counts and empties the list); merge_count [Hkv,
  // total_q] u32, merge_list [Hkv, total_q] u64 (pairs in the order they were published) and
  // merge_ctr (3 u32: the list's next index to claim, its next free index, the store warps done).
  // Otherwise the combine kernel runs after the main kernels; both write the same bits. Only
  // while merge_enabled() (below).
  bool merge = false;
  size_t merge_count = 0, merge_list = 0, merge_ctr = 0;
  size_t row_ptr = 0, q_idx = 0, schedule = 0, csr_ws = 0;
  // fused CSR build: each tile's sorted keys [tiles, csr_tile_cap] u32; each row's count in each
  // tile of its head (then the earlier tiles' prefix) [Hkv, total_rows, csr_tiles_per_head], a
  // row's tiles contiguous for the prefix's warp; the rows' totals [Hkv, total_rows]
  size_t csr_tile_keys = 0, csr_tile_counts = 0, csr_row_totals = 0;
  // A key mask (key_mask.h): its packed bits and, per batch, token rows.
  bool key_mask = false;
  int32_t mask_words = 0;
  size_t mask_bits = 0, mask_token_row = 0;
  size_t total = 0;
};

AttnPlan make_plan(const AttentionArgs& a, const ProblemShape& s);
// Whether calls may run the merging kernel (AttnPlan::merge): off until it is measured on a GPU,
// initially on with MSA_SPARSE_FWD_MERGE=1; the tests switch it to compare its bits with the
// combine kernel's. A call's workspace size and its launch must be planned with one setting.
bool merge_enabled();
void set_merge_enabled(bool on);

// The kv heads and the group the query side works with (AttnPlan::kv_split).
inline int64_t query_kv_heads(const ProblemShape& s, const AttnPlan& w) {
  return s.num_kv_heads * w.kv_split;
}
inline int32_t query_group(const ProblemShape& s, const AttnPlan& w) {
  return int32_t(s.group / w.kv_split);
}

// k and v: one dtype, q's (qt: the type q is read as) or FP8 e4m3 / FP4, which are dequantized to
// bf16 and then need qt = bf16 (`quantized_q` names the q dtypes the caller takes over them).
void check_kv_dtypes(const AttentionArgs& a, DType qt, const char* quantized_q);

// The caller's workspace against the plan; `src` names the size function the caller used.
uint8_t* checked_workspace(const AttentionArgs& a, const AttnPlan& w, const WorkspaceSource& src);

// Rejects what these kernels do not cover, naming the missing feature (no silent fallback).
void check_supported(const AttentionArgs& a, const ProblemShape& s);

// Keys a fused CSR tile sorts in shared memory (prep.cu): tokens x topk of them, at most; the CSR
// is built in the fused prep for at most kCsrMaxRows rows (32-bit keys), else by the chain.
constexpr int64_t kCsrTileKeys = 2048;
constexpr int64_t kCsrMaxRows = int64_t(1) << 20;
// The fused prep's grid is at most kFusedMaxBlocks CTAs, and it sorts at most kFusedMaxWindows
// query windows (4M tokens at 1024-token windows) by per-CTA counts; more take the chain.
constexpr int64_t kFusedMaxBlocks = 1024;
constexpr int32_t kFusedMaxWindows = 4096;

// Bits of the chunk sort keys for `window_keys` query windows (prep.cu).
int window_key_bits(int32_t window_keys);

// Temporary bytes of the chunk sort of `n` pairs with keys of `bits` bits (prep.cu: CUB's query).
size_t chunk_sort_bytes(int64_t n, int bits);

}  // namespace msa::cuda::sparse_fwd
