// The indexer's internal entry for the pipeline (api/pipeline.cpp).
#pragma once

#include "msa/indexer.h"

namespace msa::api {

// The selection when top-K covers every visible block of every request (the pipeline's dense
// case): block_topk's checks of the index inputs, then each row of a.q2k ([num_kv_heads, total_q,
// topk]; num_kv_heads the attention's, which may differ from the index key heads) lists every
// visible block ascending, -1 padded: the ids block_topk (or block_scores + select_topk) would
// choose, without scoring.
void select_every_visible(const BlockTopKArgs& a, int64_t num_kv_heads, cudaStream_t stream);

}  // namespace msa::api
