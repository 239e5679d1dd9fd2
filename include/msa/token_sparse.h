// Token-sparse input builders (seed 002's token_sparse_kv_indices and group_union_masks;
// docs/python.md, Token-sparse inputs): from each query row's selected key positions (a
// DeepSeek-style indexer's token_topk output, -1 padded, any order, none repeated in a row), the
// paged K/V cache slots of those keys, or a group of consecutive query rows' union of keys with
// each row's mask over it (the inputs of masked dense attention over the gathered union).
//
// Both run on the CPU (value errors throw msa::Error) and on CUDA (value errors go to `status`;
// nothing is allocated, nothing waits, the calls can be captured in a CUDA graph). On CUDA the
// first offence is reported in the fixed order below (the CPU's order), never the first to
// arrive, and no bad value is used to read memory.
#pragma once

#include "msa/common.h"

namespace msa {

// Slots of a paged cache: for position p of a row of request b,
//   slots[.., t, k] = block_table[b, p / page_size] * page_size + p % page_size
// (the key's row in a pool of num_pages * page_size slots; either paged layout's page is one
// page id), -1 where p = -1. Offences, in the order reported (each the first in row-major order
// of its argument): a position outside [-1, W * page_size) (position_out_of_range), a position
// repeated in a row (position_repeated), a request outside [0, B) (request_out_of_range), a
// seq_lens entry outside [0, W * page_size] (seq_len_out_of_range), a position at or past its
// request's seq_lens (position_past_seq_len), a negative page id under a used position, then a
// page id whose slots do not fit int32 (both page_id_invalid). CUDA takes K <= 16384.
struct TokenSparseKvIndicesArgs {
  Tensor positions;    // [rows, K] or [Hkv, rows, K] int32, contiguous
  Tensor requests;     // [rows] int32, contiguous: each row's request
  Tensor block_table;  // [B, W] int32, last dim contiguous: each request's pages
  int64_t page_size = 0;  // >= 1
  Tensor seq_lens;     // optional [B] int32, contiguous: positions must be below their
                       // request's length (else below W * page_size)
  Tensor slots;        // out: int32 of positions' shape, contiguous
  Tensor status;       // int32[4], required on CUDA
};
void token_sparse_kv_indices(const TokenSparseKvIndicesArgs& args, cudaStream_t stream = nullptr);

// Group unions and masks. A request's rows (cu_seqlens_q) form groups of group_size from its first
// row (its last group may be shorter; a group never spans requests); G, the groups the outputs
// hold, is a capacity at least the groups there are: group_rows [G + 1] gives group g the rows
// [group_rows[g], group_rows[g + 1]), and the groups past the last hold no row (group_rows =
// rows, union_lens 0). union_keys holds each group's distinct positions ascending, -1 padded to
// U, the caller's max_union (at most group_size * K); mask row t marks the union entries row t
// selected: bool [.., rows, U], or u8 [.., rows, ceil(U / 8)] with entry i in bit i % 8 of byte
// i / 8 (padding bits 0). Offences, in the order reported: a position outside [-1, 2^31 - 1)
// (position_out_of_range), a position repeated in a row (position_repeated), cu_seqlens_q not
// starting at 0, decreasing, or not ending at rows (bad_cu_seqlens), more groups than G
// (groups_past_capacity), a union of more than U keys (union_past_capacity: the first group, by
// kv head then group; on CUDA its outputs are written empty, never truncated). CUDA takes
// K <= 16384 and U <= 16384.
struct GroupUnionMasksArgs {
  Tensor positions;     // [rows, K] or [Hkv, rows, K] int32, contiguous
  Tensor cu_seqlens_q;  // [B + 1] int32, contiguous, B >= 0
  int64_t group_size = 1;  // >= 1
  Tensor union_keys;    // out: [G, U] or [Hkv, G, U] int32, contiguous
  Tensor union_lens;    // out: [G] or [Hkv, G] int32, contiguous
  Tensor group_rows;    // out: [G + 1] int32, contiguous
  Tensor mask;          // out: [.., rows, U] bool or [.., rows, ceil(U / 8)] u8, contiguous
  Tensor status;        // int32[4], required on CUDA
};
void group_union_masks(const GroupUnionMasksArgs& args, cudaStream_t stream = nullptr);

// CUDA's limits (host-checked: an msa::Error names them): K, the entries of a row, and U.
constexpr int64_t kTokenSparseMaxK = 16384;
constexpr int64_t kGroupUnionMaxU = 16384;

}  // namespace msa
