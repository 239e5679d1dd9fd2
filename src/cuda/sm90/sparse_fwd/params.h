// Plain parameter structs of the sparse forward kernels (prep, main, combine), filled by
// launch.cu and prep.cu. Every pointer is device memory; shapes in the comments, nullability noted.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "cuda/common/paged_kv.cuh"

namespace msa::cuda::sparse_fwd {

// Chunk walk order: a query window is 2^kWindowShift query blocks of 128 (scheduler.cuh); at
// most kMaxWindowKeys distinct sort keys (16-bit keys), later windows share the last.
constexpr int32_t kWindowShift = 3;
constexpr int32_t kMaxWindowKeys = (1 << 16) - 1;

// Inputs of the prep kernels that turn a (checked) schedule into the chunk table.
struct PrepParams {
  const int32_t* q2k = nullptr;       // [Hkv, total_q, topk]
  int32_t q2k_vec4 = 0;               // topk % 4 == 0 and q2k 16-byte aligned: int4 row loads
  const int32_t* row_ptr = nullptr;   // [Hkv, total_rows + 1]
  const int32_t* q_idx = nullptr;     // [Hkv, total_q * topk]
  const int32_t* schedule = nullptr;  // sched:: header + items {head, row, q_begin, q_end}
  const int32_t* cu_seqlens_q = nullptr;  // [B+1]
  const int32_t* cu_seqlens_k = nullptr;  // [B+1]; paged: PagedCheckParams::key_offsets
  int32_t paged = 0;  // 1: ChunkDesc / UnitDesc k_start holds the batch index (page-table row)
  int64_t batch = 0, num_kv_heads = 0, total_q = 0, topk = 0;
  int64_t total_rows = 0;
  int32_t kv_block_size = 128;  // keys per kv block of the q2k ids: 128 or 64 (one CSR row each)
  const int32_t* causal_offset = nullptr;  // [B] or null: the diagonal is Lk - Lq
  int32_t check_rows = 1;         // require row_start[B] <= total_rows (caller's k2q)
  int64_t schedule_capacity = 0;  // items the schedule buffer can hold
  int64_t chunk_capacity = 0;     // entries of `chunks`
  int32_t chunk_tokens = 0;       // tokens per chunk = kChunkTiles * tokens_per_tile(G)
  // workspace (written)
  int32_t* row_start = nullptr;    // [B+1] rowoff_b (first CSR row of batch b)
  int32_t* chunk_start = nullptr;  // [schedule_capacity + 1] first chunk of each item
  int32_t* num_chunks = nullptr;   // [1] total chunks (0 when the schedule is rejected)
  void* chunks = nullptr;          // [chunk_capacity] ChunkDesc in walk order (scheduler.cuh)
  void* chunks_by_row = nullptr;   // [chunk_capacity] ChunkDesc in schedule (head, row) order
  uint32_t* chunk_keys = nullptr;  // [chunk_capacity] query window of each chunk (sort keys)
  int32_t* chunk_ids = nullptr;    // [chunk_capacity] 0, 1, ... (sort values)
  int32_t window_keys = 1;         // sort keys 0 .. window_keys - 1 (windows past the last share
                                   // it); the unused capacity gets window_keys and sorts last
  int32_t* work_local = nullptr;   // [Hkv, total_q * topk] per chunk, compacted: local query id
  int32_t* work_slot = nullptr;    // [Hkv, total_q * topk] ... and its q2k slot
  // uniform path (query blocks whose q2k rows are all equal; see traits.h)
  int32_t group = 1;
  int32_t unit_tiles = 2;          // 64-row tiles a uniform unit (unit_tiles_of: 3 at D <= 64)
  int32_t uniform_enabled = 1;     // 0: no pair is uniform (e.g. no keys at all)
  int32_t qblock_shift = 7;        // query blocks of 2^qblock_shift tokens (traits.h)
  int64_t qblock_cap = 0;          // >= sum_b ceil(Lq_b / query block)
  int64_t unit_cap = 0;
  int32_t* qblock_start = nullptr; // [B+1] first global query block of batch b
  int32_t* uniform = nullptr;      // [Hkv, qblock_cap] 1: done by the uniform kernel
  int32_t* unit_start = nullptr;   // [Hkv * qblock_cap] unit count of each (h, g) pair
  int64_t unit_window = 1;         // query blocks a window of the walk order (walk.h)
  // [Hkv * qblock_cap + 1] exclusive prefix of the counts in walk order (walk.h pair_at)
  int32_t* unit_order_start = nullptr;
  // [2]: the unit count, then the uniform kernel's claim cursor (zeroed with the count)
  int32_t* num_units = nullptr;
  void* units = nullptr;           // [unit_cap] UnitDesc
  int32_t* status = nullptr;       // int32[4]
  // A caller's k2q is checked against q2k (the CPU backend's rule: exactly build_k2q_csr's
  // output) when valid_per_head is set: every entry's token selects the row's block, entries
  // strictly ascending within a row, and each head holds as many entries as q2k ids in range.
  const int32_t* valid_per_head = nullptr;  // [Hkv] from the q2k check, or null: no k2q check
  unsigned long long* k2q_first = nullptr;  // first mismatch: head * (total_rows + 1) + row
                                            // (row = total_rows: entry count); ~0: none
};

// The attention problem as both main kernels see it (MainParams, UniformParams).
struct AttnProblem {
  int64_t total_q = 0;
  int32_t group = 1;                   // G (dense G > 64: G / kv_split)
  // Dense G > 64 (plan.h AttnPlan::kv_split): the units' kv head is virtual, head / kv_split the
  // kv head K and V are read from; 1 otherwise.
  int32_t kv_split = 1;
  int32_t topk = 0;
  int32_t tokens_per_tile = 64;        // 64 / G
  int32_t causal = 1;
  float scale_log2 = 0.f;              // softmax_scale * log2(e)
  float inv_temperature = 0.f;         // 1/T, 0 = no temperature LSE
  float soft_cap_log2 = 0.f;           // params.soft_cap * log2(e), 0 = no soft-cap (soft_cap_row)
  PagedKV paged;                       // page_table null: flat KV
  // FP8 q: its f32 scales (null: none; kinds as common/problem.h fp8_scale_kind: 1 [1], 2
  // [total_q], 3 [total_q, Hq]) join each row's score scale; q itself is an exact bf16 copy.
  const float* q_scale = nullptr;
  int32_t q_scale_kind = 0;
  int32_t num_q_heads = 0;
  // FP8 QK kernels (traits.h, kFp8): the K copy's per-key scales, [Hkv, kscale_stride] f32,
  // kscale_rows keys per head; the producer copies a block's 128 into its stage (kv_load.cuh).
  const float* kscale = nullptr;
  int64_t kscale_stride = 0;
  int32_t kscale_rows = 0;
  // 1: K has one scale (per tensor, or none): the consumers fold a stage's first scale into their
  // rows' score scales (2 multiplies per block) instead of scaling S's 64 columns per thread.
  int32_t kscale_uniform = 0;
  // Key mask (key_mask.h), both kernels: bits [rows, mask_words], row = the token (per query) or
  // mask_token_row[token] (per batch); null: no mask (the kernels without kMask never read it).
  const uint32_t* mask_bits = nullptr;
  const int32_t* mask_token_row = nullptr;
  int32_t mask_words = 0;
};

// The diagonal of batch b with lq queries and lk keys (ChunkDesc / UnitDesc::diag).
__device__ __forceinline__ int32_t batch_diag(const PrepParams& p, int64_t b, int32_t lq, int32_t lk) {
  return p.causal_offset != nullptr ? p.causal_offset[b] : lk - lq;
}

// The last key batch-local query `local` sees: local + diag under the causal rule (64-bit: an
// offset may be any int32), clamped to [-1, k_len - 1]; every key without it.
__device__ __forceinline__ int32_t causal_last(int32_t causal, int32_t local, int32_t diag,
                                               int32_t k_len) {
  if (!causal) return k_len - 1;
  const int64_t last = int64_t(local) + diag;
  return int32_t(last < -1 ? -1 : last > k_len - 1 ? k_len - 1 : last);
}

// The log2-domain score scale of the row of query token `tok` (-1: a padding row) and query head
// hq: scale_log2, times the token's FP8 q scale. A zero q scale becomes 1e-30: the kernels scale
// a row's raw max (a row without a visible key has max -inf, and -inf * 0 is NaN), and raw
// scores times 1e-30 are 0 to f32 precision, as the zero queries' scores are (a normal float,
// unlike FLT_MIN * scale_log2, which flush-to-zero would make 0).
__device__ __forceinline__ float row_scale_log2(const AttnProblem& p, int32_t tok, int32_t hq) {
  if (p.q_scale == nullptr || tok < 0) return p.scale_log2;
  const float s = p.q_scale_kind == 1   ? p.q_scale[0]
                  : p.q_scale_kind == 2 ? p.q_scale[tok]
                                        : p.q_scale[int64_t(tok) * p.num_q_heads + hq];
  return p.scale_log2 * (s == 0.f ? 1e-30f : s);
}

// The KV-major kernel: chunks of (kv head, block, query tokens) writing partials.
struct MainParams : AttnProblem {
  // bf16 partials: 3-D map over part_o viewed as [entries, G, D] (box 64 x G x 1, 128-byte
  // swizzle), the consumers' TMA stores of each token's G rows (mma.cuh; D = 256 stores them
  // from registers instead: KVMajorTraits). 64-byte aligned.
  CUtensorMap tm_part;
  const void* chunks = nullptr;        // [num_chunks] ChunkDesc
  const int32_t* num_chunks = nullptr; // [1]
  const int32_t* work_local = nullptr; // [Hkv, total_q * topk] compacted per chunk (PrepParams)
  const int32_t* work_slot = nullptr;  // [Hkv, total_q * topk]
  int64_t q_idx_stride = 0;            // total_q * topk
  // partial outputs, indexed by ((h * total_q + t) * topk + slot) * G + g: each row's P V
  // unnormalised (sum_j p_j v_j, p_j = exp(s_j - max)), its LSE and 1 / sum_j p_j
  void* part_o = nullptr;              // [.., D] bf16 or f32
  int32_t part_bf16 = 0;
  float* part_lse = nullptr;           // natural log
  float* part_rl = nullptr;            // 0 for a row without a visible key
  float* part_tlse = nullptr;          // null unless inv_temperature > 0
  // The merging kernel (merge.cuh) only: per (kv head, token) at h * total_q + t, the slots with a
  // partial (bits 16-31) and how many have yet to arrive (bits 0-15), set by the prep; the merged
  // rows go to out / lse as the combine writes them.
  uint32_t* merge_count = nullptr;
  // The pairs whose last partial has arrived, in the order published ((mask << 32) | (pair + 1),
  // 0: not yet), merge_list_cap of them at most; merge_ctr[0] the next index to claim, [1] the
  // next free, [2] the store warps that are done.
  unsigned long long* merge_list = nullptr;
  uint32_t* merge_ctr = nullptr;
  uint32_t merge_list_cap = 0;
  void* out = nullptr;                  // [total_q, Hq, D] bf16
  int64_t out_stride_t = 0, out_stride_h = 0;  // elements
  float* lse = nullptr;                 // [Hq, total_q] or null
};

// The uniform (Q-major) kernel: units of query blocks sharing one selection, writing out / lse.
struct UniformParams : AttnProblem {
  const void* units = nullptr;          // [num_units] UnitDesc
  const int32_t* num_units = nullptr;   // [1]
  int32_t* unit_cursor = nullptr;       // [1] next unit to claim (PrepParams::num_units[1], 0)
  const int32_t* q2k = nullptr;         // [Hkv, total_q, topk]; null when dense
  // Dense attention (no q2k): a unit takes every block up to its last visible key, and the unit
  // table is its direct predecessor's output (dense_units_kernel), so the producer waits for it.
  int32_t dense = 0;
  void* out = nullptr;                  // [total_q, Hq, D] bf16 / f16
  int64_t out_stride_t = 0, out_stride_h = 0;  // elements
  float* lse = nullptr;                 // [Hq, total_q] or null
  float* tlse = nullptr;                // [Hq, total_q] or null (inv_temperature > 0)
};

}  // namespace msa::cuda::sparse_fwd
