// The key-block -> queries (k2q) CSR index and work schedule (docs/semantics.md, k2q CSR).
#pragma once

#include "msa/common.h"

namespace msa {

// Rows are (batch, kv block) pairs flattened: r = rowoff_b + kb, rowoff_b = sum_{b'<b} nblk_b'.
struct K2QIndex {
  Tensor row_ptr;   // [Hkv, total_rows + 1] int32
  Tensor q_idx;     // [Hkv, total_q * topk] int32, batch-local query ids, ascending per row
  Tensor schedule;  // int32 opaque work list (see k2q_schedule_size); absent if not requested
};

struct CsrBuildArgs {
  Tensor q2k;            // [Hkv, total_q, topk] int32, entries in [-1, nblk_b)
  Tensor cu_seqlens_q;   // [B+1] int32
  KVCache kv;            // only the lengths are used
  int kv_block_size = 128;
  K2QIndex out;          // outputs, preallocated by the caller
  Tensor workspace;      // u8 scratch of at least csr_workspace_bytes(...) (CUDA only)
  Tensor status;         // int32[4] on CUDA
};

// Elements of the int32 schedule buffer needed for this shape: an upper bound,
// 2 + 4 * num_kv_heads * total_rows. Format (src/common/schedule.h is the one definition):
// header {0x4d534131 ("MSA1"), n_items}, then one item of 4 int32 {kv head, row, q_begin, q_end}
// per non-empty (kv head, row), [q_begin, q_end) being the row's slice of q_idx. Attention
// checks that a given schedule covers every non-empty row exactly once (else msa::Error).
int64_t k2q_schedule_size(int64_t num_kv_heads, int64_t total_rows, int64_t total_q, int64_t topk);
// Scratch bytes build_k2q_csr needs on CUDA (0 on CPU).
size_t csr_workspace_bytes(int64_t num_kv_heads, int64_t total_rows, int64_t total_q, int64_t topk);

// Validates q2k (an id outside [-1, nblk_b) or repeated within a row is an error naming the
// first offending (head, token, slot)), then writes row_ptr, q_idx and, if out.schedule is
// given, the schedule.
void build_k2q_csr(const CsrBuildArgs& args, cudaStream_t stream = nullptr);

// CPU reference converters for tests (host tensors). k2q_to_q2k writes each query's blocks in
// ascending order, -1 padded to q2k's last dim.
void q2k_to_k2q_cpu(const Tensor& q2k, const Tensor& cu_seqlens_q, const KVCache& kv,
                    int kv_block_size, const Tensor& row_ptr, const Tensor& q_idx);
void k2q_to_q2k_cpu(const Tensor& row_ptr, const Tensor& q_idx, const Tensor& cu_seqlens_q,
                    const KVCache& kv, int kv_block_size, const Tensor& q2k);

}  // namespace msa
