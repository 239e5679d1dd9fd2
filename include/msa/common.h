// Types shared by every op family: quantized tensors, KV caches (flat or paged), varlen
// lengths, the device status buffer, and caller-owned workspace.
#pragma once

#include "msa/tensor.h"

namespace msa {

// A tensor plus its quantization scales (docs/semantics.md, Quantized formats). The format
// follows from dtypes:
// - values bf16/f16: no scale.
// - values fp8_e4m3: optional f32 scale, shape [1] (per tensor), [T] (per token) or
//   [T, H] (per token and head). For a page pool (KVCache paged layouts) the tokens are the
//   pool's slots: T = num_pages * page_size, slot s of page P is token P * page_size + s.
// - values fp4x2 [T, H, D/2]: scale fp8_e4m3 [T, H, D/16] -> NVFP4 (times global_scale);
//   scale e8m0 [T, H, D/32] -> MXFP4. Scales in the public layout; the indexer (block_scores,
//   block_topk) also takes them preordered, 6-D (quant.h, reorder_fp4_scales).
struct QTensor {
  Tensor values;
  Tensor scale;              // absent for bf16/f16
  float global_scale = 1.f;  // NVFP4 only
  QTensor() = default;
  QTensor(const Tensor& v) : values(v) {}  // NOLINT: implicit for unquantized tensors
  QTensor(const Tensor& v, const Tensor& s, float g = 1.f) : values(v), scale(s), global_scale(g) {}
};

enum class KVLayout : uint8_t {
  flat,       // [total_k, Hkv, D], batches by cu_seqlens_k
  paged_nhd,  // [num_pages, page_size, Hkv, D]
  paged_hnd,  // [num_pages, Hkv, page_size, D]
};
const char* kv_layout_name(KVLayout l);

// Keys and values of a varlen batch. Flat: Lk_b = cu_seqlens_k[b+1] - cu_seqlens_k[b].
// Paged: logical key j of batch b lives in page page_table[b, j / page_size], slot
// j % page_size; Lk_b = seqused_k[b] (or max_pages * page_size when seqused_k is absent).
struct KVCache {
  QTensor k, v;            // v may be absent for ops that only read keys (the indexer)
  KVLayout layout = KVLayout::flat;
  Tensor cu_seqlens_k;     // [B+1] int32, flat only
  Tensor page_table;       // [B, max_pages] int32, paged only
  Tensor seqused_k;        // [B] int32, paged only, optional
};

// Device-side index checks (docs/semantics.md, Errors) never read out of bounds: they skip the bad
// entry and record the first offence in a status buffer, int32[4] on the op's device:
// {code, a, b, c} with code 0 = ok. GPU entry points only write it; check_status() waits on the
// stream and throws msa::Error describing the offence. CPU entry points throw directly.
enum class StatusCode : int32_t {
  ok = 0,
  block_id_out_of_range = 1,  // a = kv head, b = token, c = slot
  block_id_repeated = 2,      // a = kv head, b = token, c = slot
  page_id_out_of_range = 3,   // a = batch, b = page-table column, c = page id
  bad_cu_seqlens = 4,         // a = which (0 = q, 1 = k), b = batch
  schedule_incomplete = 5,    // a = items expected, b = items present
  shape_mismatch = 6,         // a, b, c: op-specific
  negative_scale = 7,         // negative or not finite: a = which (0 q, 1 k), b = token, c = head
  k2q_mismatch = 8,           // a = kv head, b = CSR row (-1: the head's entry count)
  kv_length_past_plan = 9,    // decode: a = request, b = keys (seqused_k), c = planned capacity
  queries_past_plan = 10,     // decode: a = request, b = queries, c = max_queries_per_request
  csr_rows_short = 11,        // k2q build: a = rows the batches need, b = row_ptr's total_rows
  key_range_invalid = 12,     // mqa_logits, token_topk: a = row, b = ks, c = ke
  seq_len_invalid = 13,       // paged_mqa_logits: a = batch, b = seq_len, c = max_seq_len
  block_table_narrow = 14,    // paged_mqa_logits: a = batch, b = columns needed, c = columns
  kv_length_past_table = 15,  // paged KV: a = batch, b = seqused_k, c = max_pages * page_size
  row_request_invalid = 16,   // SDSA indexer: a = row, b = its request, c = B
  row_len_invalid = 17,       // SDSA indexer: a = row, b = row_lens[row], c = its request's seq_len
  row_past_scores = 18,       // indexer_scores: a = row, b = keys it sees, c = scores' columns
  sample_offset_invalid = 19, // gather_key_sample: a = request, b = offset, c = stride
  sample_past_capacity = 20,  // gather_key_sample: a = request, b = samples, c = S
  slot_out_of_range = 21,     // quantize_write_index_qk_nvfp4: a = entry, b = slot, c = pool slots
  key_mask_short = 22,        // attention key_mask: a = batch, b = its keys, c = the mask's Lk_max
  // The token-sparse builders (token_sparse.h). A row is a flat row of positions (kv head *
  // rows + row).
  offence_pending = 23,       // internal: an offence found, its last kernel not yet run
  position_out_of_range = 24, // a = row, b = entry, c = the position
  position_repeated = 25,     // a = row, b = the smallest repeated position, c = its 2nd entry
  request_out_of_range = 26,  // a = row, b = its request, c = B
  seq_len_out_of_range = 27,  // a = request, b = seq_lens entry, c = W * page_size
  position_past_seq_len = 28, // a = row, b = entry, c = the position
  page_id_invalid = 29,       // a = request, b = block-table column, c = page id
  groups_past_capacity = 30,  // a = groups the requests form, b = G (the outputs' groups)
  union_past_capacity = 31,   // a = kv head, b = group, c = U (the outputs' max_union)
  // The ICP indexer (icp.h).
  icp_nan_score = 32,         // icp_rank_lists: a = token, b = selection head, c = block
  icp_list_invalid = 33,      // icp_merge: a = rank, b = row (head * total_q + token), c = entry
};
std::string describe_status(const int32_t status[4]);
// Copies the status to the host on `stream` (synchronizes) and throws msa::Error if non-zero.
void check_status(const Tensor& status, cudaStream_t stream);
// Resets the status to ok (asynchronous on `stream` for CUDA).
void clear_status(const Tensor& status, cudaStream_t stream);

}  // namespace msa
