// The indexer's internal entry for the pipeline (api/pipeline.cpp).
#pragma once

#include "msa/indexer.h"

namespace msa::api {

// The selection when top-K covers every visible block of every request (the pipeline's dense
// case): block_topk's checks (q2k's rows are the attention's kv heads, which may differ from the
// index key heads), then each row of a.q2k lists every visible block ascending, -1 padded: the
// ids block_topk would choose, without scoring.
void select_every_visible(const BlockTopKArgs& a, cudaStream_t stream);

// The public block_scores / block_topk with the paged cache's check left to a later op
// (cuda::block_scores, check_pages = false): the pipeline, whose attention_forward checks the
// same page table and lengths against an equal pool, so the first offence is reported once.
void block_scores(const BlockScoresArgs& a, cudaStream_t stream, bool check_pages);
void block_topk(const BlockTopKArgs& a, cudaStream_t stream, bool check_pages);

}  // namespace msa::api
