// The counting rules of counts.h. Quantization scales are left out of the bytes: at most one
// float per token and head, under 4% of an FP8 row of 128.
#include "workloads/counts.h"

#include <algorithm>

namespace msa::bench {

const char* op_name(Op op) {
  switch (op) {
    case Op::block_scores: return "block_scores";
    case Op::select_topk: return "select_topk";
    case Op::block_topk: return "block_topk";
    case Op::build_k2q_csr: return "build_k2q_csr";
    case Op::attention_forward: return "attention_forward";
    case Op::pipeline: return "pipeline";
  }
  return "?";
}

OpShape op_shape(const SelectionShape& s, int hq, int d) {
  OpShape o;
  const size_t batch = s.cu_seqlens_q.empty() ? 0 : s.cu_seqlens_q.size() - 1;
  o.total_q = batch ? s.cu_seqlens_q[batch] : 0;
  o.total_k = batch ? s.cu_seqlens_k[batch] : 0;
  o.hq = hq;
  o.hkv = s.num_kv_heads;
  o.d = d;
  o.topk = s.topk;
  for (size_t b = 0; b < batch; ++b) {
    const int64_t blocks = (s.cu_seqlens_k[b + 1] - s.cu_seqlens_k[b] + s.kv_block_size - 1) / s.kv_block_size;
    o.score_blocks = std::max(o.score_blocks, blocks);
    o.key_blocks += blocks;
  }
  return o;
}

OpCount count_op(Op op, const OpShape& s, const PairCounts& p) {
  const double q = double(s.total_q) * s.hq * s.d * s.q_elem;
  const double k_all = double(s.total_k) * s.hkv * s.d * s.kv_elem;
  const double kv_row = double(s.d) * s.kv_elem;  // one key's K (or V) row of one kv head
  const double out = double(s.total_q) * s.hq * s.d * 2, lse = double(s.hq) * s.total_q * 4;
  const double q2k = double(s.hkv) * s.total_q * s.topk * 4;
  const double scores = double(s.hq) * s.score_blocks * s.total_q * 4;  // f32 [Hq, nblk, total_q]
  const double index_flop = 2.0 * s.d * double(p.visible);
  const double attention_flop = 4.0 * s.d * double(p.attended);
  switch (op) {
    case Op::block_scores: return {index_flop, q + k_all + scores};
    case Op::select_topk: return {0, scores + q2k};
    case Op::block_topk: return {index_flop, q + k_all + q2k};
    case Op::build_k2q_csr: return {0, 2 * q2k + double(s.hkv) * (s.key_blocks + 1) * 4};
    case Op::attention_forward:
      return {attention_flop, q + 2 * kv_row * double(p.selected_keys) + out + lse + q2k};
    case Op::pipeline:  // every K row for the indexer, the selected V rows for the attention
      return {index_flop + attention_flop, q + k_all + kv_row * double(p.selected_keys) + out + lse};
  }
  return {};
}

}  // namespace msa::bench
