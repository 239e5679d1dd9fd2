// Kernel arguments of the sm_90a MQA logits kernels (ragged and paged). Element strides; device
// pointers. Filled by launch.cu, read by kernel.cuh.
#pragma once

#include <cstdint>

namespace msa::cuda::mqa_logits_sm90 {

struct Params {
  const float* weights = nullptr;  // [rows, H] f32, row stride w_stride
  int64_t w_stride = 0;
  float* logits = nullptr;         // [rows, >= cols] f32, row stride out_stride
  int64_t out_stride = 0;
  int32_t rows = 0;                // T (ragged) or B * next_n (paged)
  int32_t heads = 0;               // H (the CTA rows a token takes are the kernel's kHp)
  int32_t tokens_per_cta = 1;
  int32_t groups_n = 2;            // groups of 128 query rows the tokens fill (1 or 2)
  int32_t lanes = 1;               // column lanes: 2 / groups_n warpgroup pairs per block set
  int32_t cols = 0;                // columns of a row: S (ragged) or max_seq_len (paged)
  int32_t clean = 1;               // columns a row does not see: -inf (else left unwritten)
  int32_t* status = nullptr;       // int32[4]
  int64_t report_base = 0;         // added to the row (ragged) or batch (paged) a status report
                                   // names: a chunk of mqa_logits_topk names the call's rows
  // Ragged: row t sees keys [ks[t], ke[t]) of k [S, 128] (TMA map); scale [S] or null (1).
  const int32_t* ks = nullptr;
  const int32_t* ke = nullptr;
  const float* k_scale = nullptr;
  // Paged: row b * next_n + t sees positions p < seq_lens[b] - next_n + t + 1, key p in block
  // block_tables[b, p / block_size] of the fused pool: block_size rows of 128 value bytes, then
  // block_size f32 scales (block_bytes per block).
  const uint8_t* pool = nullptr;
  int64_t block_bytes = 0;
  int32_t block_size = 0, block_shift = 0, num_blocks = 0;
  const int32_t* block_tables = nullptr;
  int64_t bt_stride = 0;
  int32_t bt_cols = 0;
  const int32_t* seq_lens = nullptr;
  int64_t sl_stride = 0;
  int32_t next_n = 1;
  int32_t groups = 1;              // CTAs of tokens per request: ceil(next_n / tokens_per_cta)
  int32_t splits = 1;              // column ranges per request
  int32_t cols_per_split = 0;      // a multiple of kBlockN
  // Paged MXFP4 (the kFp4 kernels, fp4_load.cuh): q as packed e2m1 rows of 64 bytes (row b *
  // next_n + t, head h at row * q4_stride_row + h * q4_stride_h bytes) with their four UE8M0
  // scale bytes (q_sf, the same indexing by sf_stride_*); pool tokens of 64 value bytes, then the
  // block's 4-byte scale words.
  const uint8_t* q4 = nullptr;
  int64_t q4_stride_row = 0, q4_stride_h = 0;
  const uint8_t* q_sf = nullptr;
  int64_t sf_stride_row = 0, sf_stride_h = 0;
};

}  // namespace msa::cuda::mqa_logits_sm90
