// The indexer: block scores (docs/semantics.md, Block scores).
#pragma once

#include "msa/common.h"

namespace msa {

struct BlockScoresArgs {
  QTensor q;               // [total_q, Hq, D]: bf16 | f16 | fp8_e4m3 | fp4x2 (see QTensor; FP4
                           // scales public or preordered, quant.h reorder_fp4_scales)
  KVCache kv;              // keys only (kv.v ignored); same value dtype as q; flat or paged
                           // (CUDA too: page ids and seqused_k are checked on the device; FP4
                           // keys run on the CPU, preordered pool scales need page size 128)
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

// The indexer fused with top-K selection (docs/semantics.md: Block scores, Top-K selection): writes
// the q2k ids that select_topk would produce from block_scores' output, without materializing the
// scores ([Hq, nblk, total_q] f32 is 2.1 GB at 32K tokens and 64 heads).
struct BlockTopKArgs {
  QTensor q;               // as BlockScoresArgs
  KVCache kv;              // keys only
  Tensor cu_seqlens_q;     // [B+1] int32
  bool causal = true;
  int kv_block_size = 128;
  int topk = 16;           // 1..64 on CUDA
  int sink_blocks = 1;     // as TopKArgs
  int local_blocks = 1;
  Tensor q2k;              // out: [Hsel, total_q, topk] int32, ascending, -1 padded. Hsel = Hkv
                           // (k's heads: each selects by its G query heads), or any count dividing
                           // Hq in groups of 1-16: Hq / Hsel consecutive query heads select together
                           // (the serving geometry: 4 index heads on 1 key head, Hsel = 4, each
                           // head its own selection). CUDA: Hsel a multiple of Hkv (each of k's
                           // heads split into Hsel / Hkv lists), and a list holds at most
                           // min(64, 4096 / lists) picks besides the forced blocks, lists = 256 /
                           // (Hq / Hsel) for G >= 4 (16 for the serving geometry; G 2: 128 / ..,
                           // G 1: 64); otherwise block_scores + select_topk
  Tensor status;           // int32[4], required on CUDA
};
void block_topk(const BlockTopKArgs& args, cudaStream_t stream = nullptr);

}  // namespace msa
