// CPU reference of the indexer (docs/semantics.md, Block scores): scores[hq, kb, t] = max over the
// keys of block kb visible to t of dot(q[t, hq], k[j, hq / G]) in fp64, -inf where no key is
// visible or kb >= nblk_b. Called by msa::block_scores (src/api/indexer.cpp) after validation.
#include <limits>
#include <vector>

#include "cpu/access.h"

namespace msa::cpu {
namespace {

// The keys of one batch, dequantized once: [Lk_b, Hkv, D] doubles.
std::vector<double> load_keys(const KeyReader& keys, int64_t b, const ProblemShape& s) {
  const int64_t lk = keys.length(b), hkv = s.num_kv_heads, D = s.head_dim;
  std::vector<double> out(lk * hkv * D);
#pragma omp parallel for collapse(2)
  for (int64_t j = 0; j < lk; ++j)
    for (int64_t h = 0; h < hkv; ++h) keys.row(b, j, h, &out[(j * hkv + h) * D]);
  return out;
}

double dot(const double* a, const double* b, int64_t n) {
  double acc = 0.0;
  for (int64_t d = 0; d < n; ++d) acc += a[d] * b[d];
  return acc;
}

// The max over keys [begin, end) of one block; NaN in any visible product propagates.
double block_max(const double* q, const std::vector<double>& keys, int64_t begin, int64_t end,
                 int64_t h, const ProblemShape& s) {
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t j = begin; j < end; ++j) {
    const double v = dot(q, &keys[(j * s.num_kv_heads + h) * s.head_dim], s.head_dim);
    if (v > m || std::isnan(v)) m = v;
    if (std::isnan(m)) break;
  }
  return m;
}

}  // namespace

void block_scores(const BlockScoresArgs& a, const ProblemShape& s) {
  const Tensor& out = a.scores;
  const int64_t nblk_max = out.shape[1], blk = s.kv_block_size, D = s.head_dim;
  const auto score_at = [&](int64_t hq, int64_t kb, int64_t t) -> float& {
    return out.ptr<float>()[hq * out.strides[0] + kb * out.strides[1] + t * out.strides[2]];
  };
  // Every entry starts at -inf: blocks past nblk_b and blocks with no visible key stay there.
  // Scores without entries write nothing (an empty view's nblk_max may be any size: looping
  // over it took up to 2^63 steps).
  if (out.numel() == 0) return;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
#pragma omp parallel for collapse(2)
  for (int64_t hq = 0; hq < s.num_q_heads; ++hq)
    for (int64_t kb = 0; kb < nblk_max; ++kb)
      for (int64_t t = 0; t < s.total_q; ++t) score_at(hq, kb, t) = kNegInf;

  const QReader queries(a.q, D);
  const KeyReader keys(a.kv, s, KVPart::k);
  const std::vector<int64_t> q_start = host_offsets(a.cu_seqlens_q);
  for (int64_t b = 0; b < s.batch; ++b) {
    const int64_t lq = q_start[b + 1] - q_start[b], lk = keys.length(b);
    if (lq == 0 || lk == 0) continue;
    const std::vector<double> k = load_keys(keys, b, s);
#pragma omp parallel
    {
      std::vector<double> q(D);
#pragma omp for collapse(2)
      for (int64_t i = 0; i < lq; ++i)
        for (int64_t hq = 0; hq < s.num_q_heads; ++hq) {
          const int64_t t = q_start[b] + i;
          queries.row(t, hq, q.data());
          const int64_t end = visible_key_end(i, lq, lk, a.causal);  // keys [0, end) visible
          for (int64_t kb = 0; kb * blk < end; ++kb)
            score_at(hq, kb, t) = float(block_max(q.data(), k, kb * blk, std::min(end, (kb + 1) * blk),
                                                  hq / s.group, s));
        }
    }
  }
  keys.check_table_unchanged("block_scores");
}

}  // namespace msa::cpu
