// DeepSeek-style indexer logits (docs/semantics.md, Indexer logits): for a query row and a key,
// the weighted sum over the row's query heads of relu(q . k), times the key's scale.
#pragma once

#include "msa/common.h"

namespace msa {

// Ragged prefill logits (DeepGEMM's fp8_mqa_logits contract): query row t sees the keys
// [ks[t], ke[t]) of one flat key tensor shared by every head (MQA).
struct MqaLogitsArgs {
  QTensor q;               // [T, H, D] fp8_e4m3 (no scale: fold it into weights) or bf16
  QTensor k;               // [S, D] q's dtype; fp8: optional f32 scale [S] (absent: 1)
  Tensor weights;          // [T, H] f32, may be negative
  Tensor ks, ke;           // [T] int32, 0 <= ks[t] <= ke[t] <= S
  Tensor logits;           // out: [T, S] f32, rows may be strided (last dim contiguous)
  bool clean_logits = true;  // columns outside [ks[t], ke[t]) -inf; false: left unwritten
  Tensor status;           // int32[4], required on CUDA (bad ranges are reported there)
};

// logits[t, s] = scale[s] * sum_h weights[t, h] * relu(q[t, h] . k[s]) for ks[t] <= s < ke[t],
// relu keeps NaN (a NaN input gives a NaN logit). The CPU accumulates exactly and rounds once
// to f32; CUDA (sm_90a: fp8_e4m3 q and k, D = 128, H <= 128, 16-byte aligned rows) sums each
// head's dot product in fp32 (wgmma), then the heads in fp32. On CUDA the ranges are checked on
// the device: a bad row is reported through `status` and written as if it saw no key.
void mqa_logits(const MqaLogitsArgs& args, cudaStream_t stream = nullptr);

// Paged logits (seed 001's fp8_paged_mqa_logits and fp4_paged_mqa_logits contracts) over a fused
// page pool: each block holds its block_size tokens' values (token-major) and then their scales.
// FP8: e4m3 values, one f32 scale per token, applied after the ReLU. FP4 (MXFP4): packed e2m1
// values, one UE8M0 scale per 32 values (token-major), folded into the values, as q_sf is into
// q's. Row b * next_n + t sees positions p <= seq_lens[b] - next_n + t (the newest slot the
// whole sequence). Every size the seed leaves to the caller is checked: on the CPU before the
// run, on CUDA (FP8 or MXFP4, D = 128, H <= 128, block_size 32, 64 or 128) on
// the device, through `status`: a length past max_seq_len (its rows then see no key), a table too
// narrow for a length or a block id outside the pool (those keys are not read: their columns hold
// unspecified values).
struct PagedMqaLogitsArgs {
  Tensor q;              // [B, next_n, H, D] fp8_e4m3, or fp4x2 [B, next_n, H, D / 2]
  Tensor q_sf;           // FP4 only: [B, next_n, H, D / 32] e8m0 (u8 accepted): the seed's
                         // int32 [B, next_n, H] packing viewed as bytes
  Tensor kv_fused;       // [num_blocks, block_size, 1, D + 4] (FP8) or [.., D / 2 + D / 32]
                         // (FP4) u8, each block's bytes contiguous
  Tensor weights;        // [B * next_n, H] f32
  Tensor block_tables;   // [B, W] int32, W >= ceil(max(seq_lens) / block_size), ids < num_blocks
  Tensor seq_lens;       // [B] int32, any stride, each <= max_seq_len
  int64_t max_seq_len = 0;
  Tensor logits;         // out: [B * next_n, >= max_seq_len] f32; columns from max_seq_len on
                         // are not written
  bool clean_logits = true;  // columns [limit, max_seq_len) -inf; false: left unwritten
  Tensor status;         // int32[4], required on CUDA
};
void paged_mqa_logits(const PagedMqaLogitsArgs& args, cudaStream_t stream = nullptr);

// Token top-K over logits rows (docs/semantics.md, Indexer logits): per row, the topk highest
// positions among its candidates (ks[r] <= s < ke[r], or the whole row without ranges), written
// ascending and -1 padded; -inf never selected, ties toward the lower position, NaN below every
// finite value. CPU and CUDA give the same ids. On CUDA the ranges are checked on the device: a
// bad row is reported through `status` and written as if it had no candidate (all -1).
struct TokenTopKArgs {
  Tensor logits;  // [R, S] f32, rows may be strided (last dim contiguous)
  Tensor ks, ke;  // optional, both or neither: [R] int32, 0 <= ks[r] <= ke[r] <= S
  int topk = 2048;
  Tensor ids;     // out: [R, topk] int32
  Tensor status;  // int32[4], required on CUDA
};
void token_topk(const TokenTopKArgs& args, cudaStream_t stream = nullptr);

// Logits and their token top-K in one call, without the [rows, S] logits: the rows run in chunks
// whose logits live in `workspace` (required on CUDA; the CPU without one holds chunks of 16 MB
// of its own), each chunk's
// logits written without the clean-up, then its top-K read from them. The ids equal token_topk's
// over the op's logits (ragged: with the rows' ranges; paged: over the clean logits, every
// position a row does not see -inf). Device reports (bad ranges, lengths, tables) name the
// call's rows and batches, as the two-step form's do. The workspace bounds the memory: a chunk
// is as many rows as it holds (at least one row: 16-byte aligned rows of the logits' width);
// *_workspace_bytes gives the size that keeps the GPU busy (about 2048 rows: 256 MB at 32K
// keys, where the logits of MQAL-PREFILL-32K are 4 GB).
struct MqaLogitsTopKArgs {
  QTensor q;               // as MqaLogitsArgs
  QTensor k;
  Tensor weights;
  Tensor ks, ke;           // [T] int32, required
  int topk = 2048;
  Tensor ids;              // out: [T, topk] int32
  Tensor workspace;        // u8 on the call's device, at least one row of logits (optional on the CPU)
  Tensor status;           // int32[4], required on CUDA
};
int64_t mqa_logits_topk_workspace_bytes(int64_t rows, int64_t keys);
void mqa_logits_topk(const MqaLogitsTopKArgs& args, cudaStream_t stream = nullptr);

struct PagedMqaLogitsTopKArgs {
  Tensor q, q_sf, kv_fused, weights, block_tables, seq_lens;  // as PagedMqaLogitsArgs
  int64_t max_seq_len = 0;
  int topk = 2048;
  Tensor ids;              // out: [B * next_n, topk] int32
  Tensor workspace;        // u8, at least next_n rows of max_seq_len (a chunk is whole batches);
                           // optional on the CPU
  Tensor status;           // int32[4], required on CUDA
};
int64_t paged_mqa_logits_topk_workspace_bytes(int64_t batch, int64_t next_n, int64_t max_seq_len);
void paged_mqa_logits_topk(const PagedMqaLogitsTopKArgs& args, cudaStream_t stream = nullptr);

}  // namespace msa
