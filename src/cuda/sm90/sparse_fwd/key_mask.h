// Key masks of dense attention on CUDA (docs/semantics.md, Key masks): the caller's bool / u8 mask
// [R, Lk_max] (R = B rows per batch, or total_q per query) packed into bits for the uniform
// kernel's consumers, which read a 128-key block's 4 words per row (uniform_mma.cuh); plus, per
// batch, each query token's mask row. key_mask.cu; called by launch.cu.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace msa::cuda::sparse_fwd {

struct KeyMaskParams {
  const uint8_t* mask = nullptr;  // [rows, cols], nonzero = visible; rows row_stride bytes apart
  int64_t row_stride = 0, rows = 0, cols = 0;
  int32_t words = 0;              // per row: 4 per 128 columns (kMaskWordsPerBlock)
  uint32_t* bits = nullptr;       // [rows, words]: bit c % 32 of word c / 32 is column c (0 past cols)
  int32_t per_query = 0;          // rows are query tokens; else batches, and token_row is written
  int32_t* token_row = nullptr;   // [total_q]: the batch of each token (per-batch masks)
  const int32_t* cu_seqlens_q = nullptr;  // [B+1]
  const int32_t* cu_seqlens_k = nullptr;  // [B+1] (paged: the checked, clamped offsets)
  int64_t batch = 0, total_q = 0;
  int32_t* status = nullptr;      // key_mask_short: a request with more keys than cols
};

constexpr int kMaskWordsPerBlock = 4;  // 128 keys

// Words of a packed row for `cols` mask columns.
constexpr int64_t key_mask_words(int64_t cols) { return (cols + 127) / 128 * kMaskWordsPerBlock; }

// Enqueues the packing kernel (launch_pdl, pdl.cuh) on `stream`.
void launch_key_mask(const KeyMaskParams& p, cudaStream_t stream);

}  // namespace msa::cuda::sparse_fwd
