// FLOP and byte counts of the timed prefill ops (bench/CASES.md, Counting), shared by the
// benchmark programs and `msa bench` so that a rate means the same wherever it is printed.
// FLOP is the arithmetic the op must do; bytes are what it must move at least: every input it
// needs read once, every output written once (the x axis of a roofline is flop / bytes).
#pragma once

#include <cstdint>

#include "workloads/patterns.h"

namespace msa::bench {

enum class Op { block_scores, select_topk, block_topk, build_k2q_csr, attention_forward, pipeline };
const char* op_name(Op op);  // the record's "op": "block_scores", ...

// What the counts depend on, for one varlen prefill problem.
struct OpShape {
  int64_t total_q = 0, total_k = 0;  // tokens over the batch
  int hq = 0, hkv = 0, d = 128, topk = 0;
  int64_t score_blocks = 0;        // key blocks of the longest request: block-score rows per query
  int64_t key_blocks = 0;          // key blocks over the batch: k2q CSR rows per kv head
  double q_elem = 2, kv_elem = 2;  // bytes per element of q and of k, v (bf16 2, FP8 1)
};
// The shape of a selection problem with hq query heads of dimension d, bf16 inputs.
OpShape op_shape(const SelectionShape& s, int hq, int d);

struct OpCount {
  double flop = 0, bytes = 0;  // 0: not counted (top-K and CSR have no FLOP figure)
};
// p: the pair counts of the selection the op works on (block scores need only p.visible).
OpCount count_op(Op op, const OpShape& s, const PairCounts& p);

}  // namespace msa::bench
