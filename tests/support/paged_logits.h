// The host tensors of a paged_mqa_logits problem (seed 001's fused pool) and the arguments that
// view them; shared by the CPU and GPU logits tests, which fill them each their own way.
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

}  // namespace msa::test
