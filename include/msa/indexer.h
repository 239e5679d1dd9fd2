// The indexer: block scores (DESIGN.md section 2).
#pragma once

#include "msa/common.h"

namespace msa {

struct BlockScoresArgs {
  QTensor q;               // [total_q, Hq, D]: bf16 | f16 | fp8_e4m3 | fp4x2 (see QTensor)
  KVCache kv;              // keys only (kv.v ignored); same value dtype as q
  Tensor cu_seqlens_q;     // [B+1] int32
  Tensor scores;           // out: [Hq, nblk_max, total_q] f32, nblk_max >= max_b nblk_b
  bool causal = true;
  int kv_block_size = 128;  // 64 or 128
  Tensor status;           // int32[4], required on CUDA (page ids, cu_seqlens), ignored on CPU
};

// scores[hq, kb, t] = max over keys j of block kb visible to t of dot(q[t,hq], k[j,hq/G])
// (dequantized inputs, no softmax scale); -inf where no key of the block is visible or
// kb >= nblk_b.
void block_scores(const BlockScoresArgs& args, cudaStream_t stream = nullptr);

}  // namespace msa
