// CPU reference of the fused indexer + top-K (msa::block_topk): by definition the ids that
// select_topk picks from block_scores' output, so it runs the two references back to back on a
// host scores buffer. Called by src/api/indexer.cpp after validation.
#include <algorithm>
#include <vector>

#include "cpu/access.h"

namespace msa::cpu {

void block_topk(const BlockTopKArgs& a, const ProblemShape& s) {
  int64_t nblk_max = 0;
  for (int64_t lk : host_key_lengths(a.kv, s))
    nblk_max = std::max(nblk_max, num_blocks(lk, s.kv_block_size));
  std::vector<float> buf(size_t(s.num_q_heads * nblk_max * s.total_q));
  const Tensor scores(buf.data(), DType::f32, {s.num_q_heads, nblk_max, s.total_q});

  BlockScoresArgs sa;
  sa.q = a.q;
  sa.kv = a.kv;
  sa.cu_seqlens_q = a.cu_seqlens_q;
  sa.scores = scores;
  sa.causal = a.causal;
  sa.kv_block_size = a.kv_block_size;
  block_scores(sa, s);

  TopKArgs ta;
  ta.scores = scores;
  ta.cu_seqlens_q = a.cu_seqlens_q;
  ta.kv = a.kv;
  ta.num_kv_heads = int(a.q2k.shape[0]);  // the selection heads (k's, or finer)
  ta.topk = a.topk;
  ta.sink_blocks = a.sink_blocks;
  ta.local_blocks = a.local_blocks;
  ta.causal = a.causal;
  ta.kv_block_size = a.kv_block_size;
  ta.q2k = a.q2k;
  ProblemShape ts = s;
  ts.topk = a.topk;
  ts.num_kv_heads = a.q2k.shape[0];
  ts.group = s.num_q_heads / ts.num_kv_heads;
  select_topk(ta, ts);
}

}  // namespace msa::cpu
