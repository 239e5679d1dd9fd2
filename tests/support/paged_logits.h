// The host tensors of a paged_mqa_logits problem (seed 001's fused pool) and the arguments that
// view them; shared by the CPU and GPU logits tests, which fill them each their own way; the
// logits + top-K ops' arguments over the two steps' (logits_topk_args).
#pragma once

#include "msa/msa.h"
#include "support/host_tensor.h"

namespace msa::test {

struct PagedLogits {
  HostTensor q, kv, w, tables, lens, out;
  int64_t max_seq_len = 0;
  PagedMqaLogitsArgs args() const {
    PagedMqaLogitsArgs a;
    a.q = q.t;
    a.kv_fused = kv.t;
    a.weights = w.t;
    a.block_tables = tables.t;
    a.seq_lens = lens.t;
    a.max_seq_len = max_seq_len;
    a.logits = out.t;
    return a;
  }
};

// The logits + top-K ops' arguments over a two-step call's inputs.
inline MqaLogitsTopKArgs logits_topk_args(const MqaLogitsArgs& la, int topk, const Tensor& ids,
                                          const Tensor& workspace) {
  MqaLogitsTopKArgs a;
  a.q = la.q;
  a.k = la.k;
  a.weights = la.weights;
  a.ks = la.ks;
  a.ke = la.ke;
  a.topk = topk;
  a.ids = ids;
  a.workspace = workspace;
  a.status = la.status;
  return a;
}
inline PagedMqaLogitsTopKArgs logits_topk_args(const PagedMqaLogitsArgs& la, int topk,
                                               const Tensor& ids, const Tensor& workspace) {
  PagedMqaLogitsTopKArgs a;
  a.q = la.q;
  a.q_sf = la.q_sf;
  a.kv_fused = la.kv_fused;
  a.weights = la.weights;
  a.block_tables = la.block_tables;
  a.seq_lens = la.seq_lens;
  a.max_seq_len = la.max_seq_len;
  a.topk = topk;
  a.ids = ids;
  a.workspace = workspace;
  a.status = la.status;
  return a;
}

}  // namespace msa::test
