// The SDSA indexer (docs/semantics.md, SDSA indexer): one query head, no head weights. Scores are
// dot products of a query row with its request's paged index keys; the exact top-K of a row comes
// from one threshold pass that stores the keys above a per-row threshold (and those equal to it),
// the threshold from the scores of a strided sample of the keys.
//
// A pipeline step: quantize_write_index_qk_nvfp4 (new keys into the cache, queries into rows) ->
// gather_key_sample -> indexer_scores on the sample -> thresholds_from_sample (also zeroes the
// counters) -> indexer_threshold_select -> top_k_from_candidates.
#pragma once

#include "msa/common.h"

namespace msa {

// The paged index keys, one key head. Key j of request b lives in page block_table[b, j /
// page_size], slot j % page_size.
struct IndexKeyCache {
  QTensor key_cache;   // [num_pages, page_size, D] bf16 | f16, or NVFP4: values fp4x2
                       // [num_pages, page_size, D / 2], scale fp8_e4m3 [num_pages, page_size,
                       // D / 16], global_scale; the last dim contiguous
  Tensor block_table;  // [B, W] int32, ids < num_pages for the pages a length covers
  Tensor seq_lens;     // [B] int32, 0 <= seq_lens[b] <= W * page_size
};

// Query rows and the keys each one sees: row t reads keys [0, L_t) of request row_requests[t],
// L_t = row_lens[t] (a causal prefix, e.g. of draft tokens) or, without row_lens, the request's
// whole seq_lens.
struct IndexQueryRows {
  QTensor query;        // [T, D] bf16 | f16, or NVFP4: fp4x2 [T, D / 2], scale fp8_e4m3 [T, D / 16],
                        // global_scale; the last dim contiguous
  Tensor row_requests;  // [T] int32 in [0, B)
  Tensor row_lens;      // optional [T] int32, 0 <= row_lens[t] <= seq_lens[row_requests[t]]
};

// scores[t, j] = dot(query[t], key j of its request) for j < L_t, computed from the decoded values
// and rounded once to f32 (the CPU accumulates in fp64; an NVFP4 query over NVFP4 keys is summed
// exactly, docs/semantics.md); -inf for L_t <= j < max_len.
struct IndexerScoresArgs {
  IndexQueryRows rows;
  IndexKeyCache cache;
  Tensor scores;  // out: [T, max_len] f32, max_len >= every L_t; rows may be strided
  Tensor status;  // int32[4], required on CUDA
};
void indexer_scores(const IndexerScoresArgs& args, cudaStream_t stream = nullptr);

// The order every SDSA selection ranks scores by (the token top-K rule of docs/semantics.md):
// higher first, -0 equal to +0; NaN below every other value but -inf, which is never selected;
// ties toward the lower position. A threshold is compared in the same order (a NaN threshold
// ranks as NaN scores do).
//
// One pass over each row's keys: a key ranked above thresholds[t] is a candidate, stored as a
// (position, f32 score bits) pair in the next slot of candidates[t]; one ranked equal (and not
// -inf) is a tie, its position stored in ties[t]; counts[t] = (candidates, ties, keys ranked
// below but not -inf), counted past the capacities (a store that overflows is not written past
// its end). The scores are not written anywhere else. counts must be zero on entry
// (thresholds_from_sample zeroes them; the CPU checks it). The CPU stores in ascending position;
// the order of the slots is otherwise unspecified.
struct ThresholdSelectArgs {
  IndexQueryRows rows;
  IndexKeyCache cache;
  Tensor thresholds;  // [T] f32
  Tensor candidates;  // out: [T, C, 2] int32 (position, score bits), C >= 1
  Tensor ties;        // out: [T, Ct] int32 positions, Ct >= 0
  Tensor counts;      // in/out: [T, 3] int32, zero on entry
  Tensor status;      // int32[4], required on CUDA
};
void indexer_threshold_select(const ThresholdSelectArgs& args, cudaStream_t stream = nullptr);

// What top_k_from_candidates found for a row (row_status).
enum class CandidateStatus : int32_t {
  exact = 0,                // ids hold the row's exact top-K
  candidates_overflow = 1,  // more candidates than C: ids all -1
  ties_overflow = 2,        // fewer than topk candidates and more ties than Ct: ids all -1
  threshold_too_high = 3,   // fewer candidates and ties than topk while keys ranked below exist:
                            // ids hold those stored (the row's true best), -1 padded
  counts_invalid = 4,       // CUDA only (the CPU raises msa::Error): a count was negative, ids
                            // all -1
};

// Per row: the topk best stored keys (the candidates by their stored scores, then the lowest tie
// positions), written in ascending position and -1 padded. When the row's stores did not overflow
// and held at least min(topk, selectable keys), that is exactly the top-K a full sort of the row's
// scores gives; row_status says which rows it is for.
struct TopKFromCandidatesArgs {
  Tensor candidates;  // [T, C, 2] int32 (position, score bits), as indexer_threshold_select wrote
  Tensor ties;        // [T, Ct] int32 positions
  Tensor counts;      // [T, 3] int32, each >= 0
  int topk = 2048;
  Tensor ids;         // out: [T, topk] int32
  Tensor row_status;  // out: [T] int32, a CandidateStatus per row
};
void top_k_from_candidates(const TopKFromCandidatesArgs& args, cudaStream_t stream = nullptr);

// Copies every stride-th key of each request, from position offsets[b] on, into dense rows:
// sample[b, i] = key offsets[b] + i * stride of request b for i < sample_lens[b] =
// ceil((seq_lens[b] - offsets[b]) / stride) (0 when seq_lens[b] <= offsets[b]); slots past
// sample_lens[b] are not written. The sample is itself a page pool of S-key pages, one a request
// (block table [[0], [1], ...], lengths sample_lens), so indexer_scores scores it.
struct GatherKeySampleArgs {
  IndexKeyCache cache;
  int stride = 1;       // >= 1
  Tensor offsets;       // optional [B] int32 in [0, stride) (a caller's random draw); absent: 0
  QTensor sample;       // out: [B, S, D] the keys' dtype, or NVFP4 fp4x2 [B, S, D / 2] and scale
                        // fp8_e4m3 [B, S, D / 16] (the cache's bytes; score it with the cache's
                        // global scale); S >= every sample_lens[b]
  Tensor sample_lens;   // out: [B] int32
  Tensor status;        // int32[4], required on CUDA
};
void gather_key_sample(const GatherKeySampleArgs& args, cudaStream_t stream = nullptr);

// Per row: thresholds[t] = the r-th best of the row's sample scores that are not -inf (in the
// selection order above), r = max(1, ceil(oversample * topk / sample_stride)), so that about
// oversample * topk keys of a row sampled every sample_stride-th key rank above it; -inf when the
// row has fewer than r such scores. Zeroes counts for indexer_threshold_select.
struct ThresholdsFromSampleArgs {
  Tensor sample_scores;  // [T, S] f32 (indexer_scores on the sample; -inf marks no sample)
  int topk = 2048;       // >= 1
  int sample_stride = 1; // >= 1, the gather's stride
  double oversample = 2.0;  // >= 1: candidates expected per row, in multiples of topk
  Tensor thresholds;     // out: [T] f32
  Tensor counts;         // out: [T, 3] int32, zeroed
};
void thresholds_from_sample(const ThresholdsFromSampleArgs& args, cudaStream_t stream = nullptr);

// NVFP4 quantization (msa::quantize's rule: per 16 values an e4m3 scale amax / (6 * global_scale),
// values rounded to nearest even e2m1) of index keys into their cache slots and of queries into
// rows, in one call. Either side may be absent, not both.
struct QuantizeIndexQKArgs {
  Tensor key;         // [N, D] f32 | bf16 | f16, D % 16 == 0; with slots and key_cache
  Tensor slots;       // [N] int32: key n goes to page slots[n] / page_size, slot slots[n] %
                      // page_size; negative: skipped; each other slot < num_pages * page_size and
                      // given at most once
  QTensor key_cache;  // out: values fp4x2 [num_pages, page_size, D / 2], scale fp8_e4m3
                      // [num_pages, page_size, D / 16], global_scale finite and > 0
  Tensor query;       // [T, D] f32 | bf16 | f16; with query_out
  QTensor query_out;  // out: values fp4x2 [T, D / 2], scale fp8_e4m3 [T, D / 16], global_scale
  Tensor status;      // int32[4], required on CUDA
};
void quantize_write_index_qk_nvfp4(const QuantizeIndexQKArgs& args, cudaStream_t stream = nullptr);

}  // namespace msa
