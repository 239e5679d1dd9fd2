// CPU reference of top-K block selection (docs/semantics.md, Top-K selection). Called by
// msa::select_topk (src/api/topk.cpp) after validation. Ranking, which every backend reproduces
// exactly: a higher group score first; NaN below every number (a NaN block is taken only when
// nothing else is left); equal scores toward the lower block id. Eligibility is visibility, never
// the score.
#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/access.h"

namespace msa::cpu {
namespace {

// Group score of block kb for token t: the max over the G query heads of kv head h. NaN heads
// are skipped (fmax), so the group score is NaN only when every head's score is.
float group_score(const Tensor& scores, int64_t h, int64_t G, int64_t kb, int64_t t) {
  float m = NAN;
  for (int64_t hq = h * G; hq < (h + 1) * G; ++hq)
    m = std::fmax(m, scores.ptr<float>()[hq * scores.strides[0] + kb * scores.strides[1] + t * scores.strides[2]]);
  return m;
}

// The ascending block ids chosen for one (kv head, token) whose visible blocks are [0, nvis)
// (visibility is a prefix: a query sees keys [0, end)). `score[kb]` is the group score.
std::vector<int64_t> select_row(int64_t nvis, const std::vector<float>& score, const TopKArgs& a) {
  std::vector<bool> chosen(nvis, false);
  int64_t count = 0;
  const auto take = [&](int64_t kb) {
    if (chosen[kb]) return;
    chosen[kb] = true;
    ++count;
  };
  // Forced blocks: the sinks, then the local window ending at the block of the last visible key.
  for (int64_t kb = 0; kb < std::min<int64_t>(a.sink_blocks, nvis); ++kb) take(kb);
  for (int64_t kb = std::max<int64_t>(0, nvis - a.local_blocks); kb < nvis; ++kb) take(kb);

  std::vector<int64_t> rest;
  for (int64_t kb = 0; kb < nvis; ++kb)
    if (!chosen[kb]) rest.push_back(kb);
  std::sort(rest.begin(), rest.end(),
            [&](int64_t x, int64_t y) { return block_ranks_before(score[x], x, score[y], y); });
  for (size_t i = 0; i < rest.size() && count < a.topk; ++i) take(rest[i]);

  std::vector<int64_t> row;
  for (int64_t kb = 0; kb < nvis; ++kb)
    if (chosen[kb]) row.push_back(kb);
  return row;
}

}  // namespace

void select_topk(const TopKArgs& a, const ProblemShape& s) {
  const std::vector<int64_t> q_start = host_offsets(a.cu_seqlens_q);
  const std::vector<int64_t> key_len = host_key_lengths(a.kv, s);
  std::vector<int64_t> batch_of(s.total_q);
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t t = q_start[b]; t < q_start[b + 1]; ++t) batch_of[t] = b;

  const Tensor& q2k = a.q2k;
#pragma omp parallel for collapse(2)
  for (int64_t h = 0; h < s.num_kv_heads; ++h)
    for (int64_t t = 0; t < s.total_q; ++t) {
      const int64_t b = batch_of[t], lq = q_start[b + 1] - q_start[b];
      const int64_t end = visible_key_end(t - q_start[b], lq, key_len[b], a.causal);
      const int64_t nvis = num_blocks(end, s.kv_block_size);  // <= nblk_b <= nblk_max
      std::vector<float> score(nvis);
      for (int64_t kb = 0; kb < nvis; ++kb) score[kb] = group_score(a.scores, h, s.group, kb, t);
      const std::vector<int64_t> row = select_row(nvis, score, a);
      int32_t* out = q2k.ptr<int32_t>() + h * q2k.strides[0] + t * q2k.strides[1];
      for (int64_t k = 0; k < s.topk; ++k)
        out[k * q2k.strides[2]] = k < int64_t(row.size()) ? int32_t(row[k]) : -1;
    }
}

void select_every_visible(const BlockTopKArgs& a, const ProblemShape& s) {
  const std::vector<int64_t> q_start = host_offsets(a.cu_seqlens_q);
  const std::vector<int64_t> key_len = host_key_lengths(a.kv, s);
  const Tensor& q2k = a.q2k;
  for (int64_t b = 0; b < s.batch; ++b) {
    const int64_t lq = q_start[b + 1] - q_start[b];
    for (int64_t i = 0; i < lq; ++i) {
      const int64_t nvis = num_blocks(visible_key_end(i, lq, key_len[b], a.causal), s.kv_block_size);
      MSA_CHECK(nvis <= a.topk, "sparse_attention_pipeline: batch ", b, " sees ", nvis,
                " blocks, more than topk = ", a.topk, " (the selection of every visible block)");
      for (int64_t h = 0; h < q2k.shape[0]; ++h) {
        int32_t* out = q2k.ptr<int32_t>() + h * q2k.strides[0] + (q_start[b] + i) * q2k.strides[1];
        for (int64_t k = 0; k < a.topk; ++k) out[k * q2k.strides[2]] = k < nvis ? int32_t(k) : -1;
      }
    }
  }
}

}  // namespace msa::cpu
