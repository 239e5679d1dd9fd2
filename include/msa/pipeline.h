// The whole sparse-attention path in one call: the fused indexer + top-K selection, then sparse
// attention (which builds the k2q CSR and its schedule in its own workspace). One caller-owned
// workspace, sized once for the largest shape the caller will run; on CUDA nothing allocates or
// synchronizes, so the call can be captured in a CUDA graph and replayed with new inputs.
#pragma once

#include "msa/attention.h"
#include "msa/indexer.h"

namespace msa {

struct PipelineArgs {
  Tensor q;                // [total_q, Hq, D] bf16 | f16: the attention queries
  KVCache kv;              // k, v (flat or paged), as AttentionArgs
  Tensor cu_seqlens_q;     // [B+1] int32
  QTensor index_q;         // optional indexer queries [total_q, Hi, D] (e.g. FP8 with scales); absent: q
  QTensor index_k;         // optional indexer keys, laid out like kv.k with Hik heads; absent: kv.k.
                           // Hik != Hkv (DESIGN section 13, e.g. Hi 4 on Hik 1): kv head h selects
                           // by index heads [h Hi/Hkv, (h+1) Hi/Hkv) (Hi a multiple of Hkv)
  int topk = 16;           // as BlockTopKArgs
  int sink_blocks = 1;
  int local_blocks = 1;
  AttentionParams params;  // causal and kv_block_size apply to the selection too
  Tensor out;              // out: [total_q, Hq, D], dtype of q
  Tensor lse;              // out (optional): [Hq, total_q] f32
  Tensor tlse;             // out (optional, with params.temperature > 0)
  Tensor workspace;        // u8, at least pipeline_workspace_bytes(args), on q's device
  Tensor status;           // int32[4], required on CUDA
};

// Workspace bytes for these shapes: the q2k selection [Hkv, total_q, topk] int32, with index key
// heads other than the kv heads the block scores [Hi, nblk, total_q] f32 (nblk over the longest
// request the cache can hold), plus the attention's scratch. A workspace sized for the largest
// shape serves every smaller one.
size_t pipeline_workspace_bytes(const PipelineArgs& args);

// block_topk (index key heads other than the kv heads: block_scores then select_topk) then
// attention_forward; q2k lives at the start of the workspace, where the caller
// may read it after the call. When topk * kv_block_size covers the longest request the cache can
// hold (flat: total_k; paged: max_pages * page_size), the selection is every visible block,
// written without scoring (the index inputs are checked, not read), and the attention runs dense
// (no q2k: the same keys without the k2q CSR and the sparse prep).
void sparse_attention_pipeline(const PipelineArgs& args, cudaStream_t stream = nullptr);

}  // namespace msa
