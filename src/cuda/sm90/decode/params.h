// Plain parameter structs of the CUDA decode (docs/semantics.md, Decode): the work list plan()
// writes into the caller's workspace (items, combine jobs, per-request key capacity) and the kernel
// arguments. Shared by the host planner (plan.cpp), the launcher (launch.cu) and the kernels.
#pragma once

#include <cstdint>

namespace msa::cuda::decode {

// One unit of the main kernel, run once per kv head: keys of tiles [tile_begin, tile_end) of one
// (request, query chunk). A tile is 128 key slots: 128 consecutive keys (dense) or 128 / blk
// entries of the request's sorted union of selected blocks (sparse).
struct DecodeItem {
  int32_t batch = 0;       // request b
  int32_t chunk = 0;       // queries [chunk * queries_per_chunk, ...) of the request
  int32_t tile_begin = 0;  // first tile (dense: keys tile * 128; sparse: union entries)
  int32_t tile_end = 0;    // exclusive
  int32_t partial = -1;    // partial slot this split writes; -1: the only split, writes out
  int32_t job = -1;        // split items: the CombineJob whose last split merges them
  int32_t pad[2] = {};     // 32-byte records
};
static_assert(sizeof(DecodeItem) == 32, "DecodeItem: keep 32-byte records (plan copies them raw)");

// The splits of one (request, query chunk) that the last of them to finish merges, in split order.
struct CombineJob {
  int32_t batch = 0, chunk = 0;
  int32_t first_partial = 0;  // partial slots [first_partial, first_partial + num_splits)
  int32_t num_splits = 0;     // >= 2
};
static_assert(sizeof(CombineJob) == 16, "CombineJob: keep 16-byte records");

// Kernel arguments (both kernels). Element strides; pointers are device memory.
struct DecodeParams {
  const void* q = nullptr;                // [total_q, Hq, D] bf16 | f16 | e4m3, D contiguous
  int64_t q_stride_t = 0, q_stride_h = 0;
  const float* q_scale = nullptr;         // e4m3 q: null (1), [1], [total_q] or [total_q, Hq]
  const void* k = nullptr;                // page pool, bf16 | f16 | fp8 e4m3 | fp4x2, D contiguous
  const void* v = nullptr;                // same shape as k
  int64_t k_stride_page = 0, k_stride_slot = 0, k_stride_head = 0;  // nhd or hnd by strides
  int64_t v_stride_page = 0, v_stride_slot = 0, v_stride_head = 0;
  // FP8 scales: null (1), [1] per tensor, [num_pages * page_size] per pool slot or
  // [num_pages * page_size, Hkv] per slot and head (kinds below). With any per-slot kind
  // (slot_scales), both K's and V's scales are staged per slot (load.cuh) and applied per key.
  const float* k_scale = nullptr;
  const float* v_scale = nullptr;
  // NVFP4 (KV::nvfp4): k / v hold packed e2m1 rows of 64 bytes (strides above in bytes); k_sf /
  // v_sf the e4m3 scale of every 16 values, 8-byte rows of the values' layout (strides in bytes,
  // rows 8-byte aligned); k_global / v_global the per-tensor global scales.
  const uint8_t* k_sf = nullptr;
  const uint8_t* v_sf = nullptr;
  int64_t k_sf_stride_page = 0, k_sf_stride_slot = 0, k_sf_stride_head = 0;
  int64_t v_sf_stride_page = 0, v_sf_stride_slot = 0, v_sf_stride_head = 0;
  float k_global = 1.f, v_global = 1.f;
  const int32_t* page_table = nullptr;    // [B, max_pages], row stride page_table_stride
  int64_t page_table_stride = 0;
  const int32_t* seqused_k = nullptr;     // [B] or null (max_pages * page_size keys)
  const int32_t* cu_seqlens_q = nullptr;  // [B+1]
  const int32_t* q2k = nullptr;           // [Hkv, total_q, topk] contiguous; null: dense
  void* out = nullptr;                    // [total_q, Hq, D], q's dtype (bf16 for e4m3 q)
  int64_t out_stride_t = 0, out_stride_h = 0;
  float* lse = nullptr;                   // [Hq, total_q] contiguous, natural log; or null

  // Workspace (plan.h layout).
  const DecodeItem* items = nullptr;      // [num_items]
  const CombineJob* jobs = nullptr;       // [jobs of the plan]
  const int32_t* key_cap = nullptr;       // [B] keys of each request the plan covers
  float* part_o = nullptr;                // [partials, Hkv, rows_max, D] f32, normalised
  float* part_lse = nullptr;              // [partials, Hkv, rows_max] f32, log2 units
  unsigned long long* offence = nullptr;  // first device-side offence (status.cuh), ~0 = none
  unsigned int* done = nullptr;           // main-kernel CTAs finished this run (status.cuh)
  unsigned int* job_done = nullptr;       // [jobs, Hkv] splits finished this run (combine.cuh)
  int32_t* status = nullptr;              // int32[4] (common.h)

  int64_t num_items = 0;
  // Row r of a CTA is query r / G, head r % G of its kv head's group; group_shift = log2(G) when
  // G is a power of two (the shift then), -1 for the other groups dense decode takes.
  int32_t batch = 0, total_q = 0, num_kv_heads = 0, group = 1, group_shift = 0;
  int32_t topk = 0, kv_block_size = 128, block_shift = 7;
  int32_t page_size = 0, page_shift = 0, max_pages = 0, num_pages = 0;
  int32_t head_major = 0;                 // pool [pages, Hkv, page_size, D] (TMA coordinates)
  int32_t box_shift = 7;                  // log2 of the key slots of one TMA box (load.cuh)
  int32_t max_queries = 1, queries_per_chunk = 1, rows_max = 16;
  int32_t bitmap_words = 0;               // sparse: union bitmap capacity in 32-bit words
  int32_t warps = 8;                      // main-kernel CTA width (plan.h Geometry::warps)
  int32_t identity_tiles = 0;             // > 0: items[i] is implied by i (plan.h WorkList)
  int32_t chunks = 1;                     // query chunks per request (identity items)
  int32_t causal = 1;
  int32_t kv_evict_first = 0;             // K/V lines read by one CTA only: L2 evict_first
  float scale_log2 = 0.f;                 // softmax_scale * log2(e)
  int32_t k_scale_kind = 0, v_scale_kind = 0;  // 0 none, 1 per tensor, 2 per slot, 3 slot and head
  int32_t q_scale_kind = 0;               // 0 none, 1 per tensor, 2 per token, 3 token and head
  int32_t num_q_heads = 0;                // Hq (per-token-and-head q scales)
  int32_t slot_scales = 0;                // some kind >= 2: scales staged per slot
  // Chunks of a query's heads (plan.h Geometry; > 1 only at D = 256 with G > 64): chunk c is
  // query c / head_chunks, heads [(c % head_chunks) * heads_per_chunk, ...) of its group. Read by
  // the D = 256 kernels only (the others' CTAs hold whole queries).
  int32_t head_chunks = 1, heads_per_chunk = 1;
};

}  // namespace msa::cuda::decode
