// Top-K block selection (docs/semantics.md, Top-K selection).
#pragma once

#include "msa/common.h"

namespace msa {

struct TopKArgs {
  Tensor scores;           // [Hq, nblk_max, total_q] f32 (from block_scores)
  Tensor cu_seqlens_q;     // [B+1] int32
  KVCache kv;              // only the lengths are used (cu_seqlens_k or page_table/seqused_k)
  int num_kv_heads = 0;    // Hkv; G = Hq / Hkv
  int topk = 16;           // 1..64 on CUDA
  int sink_blocks = 1;
  int local_blocks = 1;
  bool causal = true;
  int kv_block_size = 128;
  Tensor q2k;              // out: [Hkv, total_q, topk] int32, ascending, -1 padded
  Tensor status;           // int32[4] on CUDA
};

// Forced blocks first (the first sink_blocks blocks, then the local_blocks blocks ending at the
// block holding the query's last visible key; each only if visible), then the visible blocks
// with the highest group score (max over the G heads), ties toward the lower block id.
void select_topk(const TopKArgs& args, cudaStream_t stream = nullptr);

}  // namespace msa
