// select_topk's arguments as the CPU and GPU top-K tests build them: a test problem's selection
// rule over given scores, lengths and output.
#pragma once

#include "msa/msa.h"

namespace msa::test {

// P: a top-K test problem with hkv, topk, sink, local, causal and blk.
template <typename P>
TopKArgs topk_args(const P& p, const Tensor& scores, const Tensor& cu_q, const Tensor& cu_k,
                   const Tensor& q2k) {
  TopKArgs a;
  a.scores = scores;
  a.cu_seqlens_q = cu_q;
  a.kv.cu_seqlens_k = cu_k;
  a.num_kv_heads = int(p.hkv);
  a.topk = p.topk;
  a.sink_blocks = p.sink;
  a.local_blocks = p.local;
  a.causal = p.causal;
  a.kv_block_size = p.blk;
  a.q2k = q2k;
  return a;
}

}  // namespace msa::test
