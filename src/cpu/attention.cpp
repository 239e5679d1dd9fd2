// CPU reference attention forward (msa/attention.h; docs/semantics.md: Attention, Dense attention,
// Paged KV), called by api/attention.cpp after argument validation. It is the oracle for every GPU
// kernel: plain loops, fp64 accumulation, no tiling; K/V rows of keys that are not attended are
// never read.
#include <algorithm>
#include <cmath>
#include <limits>

#include "backend.h"
#include "cpu/access.h"
#include "cpu/k2q.h"

namespace msa::cpu {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// A run [begin, end) of batch-local key indices.
struct KeyRange {
  int64_t begin, end;
};

// Exclusive end of the keys visible to token t under the causal rule (docs/semantics.md,
// Visibility): bottom-right aligned, or j <= i + causal_offset[b] when per-batch offsets are
// given (64-bit: an offset near INT32_MAX must not wrap), clamped to the batch's keys.
int64_t key_end(const AttentionArgs& a, const BatchGeometry& g, int64_t t) {
  const int64_t b = g.token_batch[t], i = t - g.q_start[b];
  if (!a.causal_offset.defined()) return visible_key_end(i, g.q_len(b), g.key_len[b], a.params.causal);
  return std::clamp<int64_t>(i + int64_t(a.causal_offset.ptr<int32_t>()[b]) + 1, 0, g.key_len[b]);
}

// Token t's row of key_mask (bool or u8, nonzero = visible; the last dim is contiguous), or null
// without a mask.
const uint8_t* mask_row(const AttentionArgs& a, const BatchGeometry& g, int64_t t) {
  const Tensor& m = a.key_mask;
  if (!m.defined()) return nullptr;
  const int64_t row = a.key_mask_rows == KeyMaskRows::per_query ? t : g.token_batch[t];
  return m.ptr<uint8_t>() + row * m.strides[0];
}

// The key ranges that token t attends through kv head h before the mask: every visible key
// (dense), or the visible keys of the blocks selected in q2k[h, t, :] (sparse; -1 slots skipped).
// The ranges are disjoint because check_q2k_ids rejected repeated ids.
void attended_ranges(const AttentionArgs& a, const BatchGeometry& g, int64_t topk, int64_t h,
                     int64_t t, std::vector<KeyRange>& ranges) {
  const int64_t end = key_end(a, g, t);
  ranges.clear();
  if (!a.q2k.defined()) {
    if (end > 0) ranges.push_back({0, end});
    return;
  }
  const int32_t* ids = a.q2k.ptr<int32_t>() + (h * g.total_q() + t) * topk;
  for (int64_t slot = 0; slot < topk; ++slot) {
    if (ids[slot] < 0) continue;
    const int64_t begin = ids[slot] * g.kv_block_size;
    const int64_t stop = std::min(begin + g.kv_block_size, end);
    if (begin < stop) ranges.push_back({begin, stop});
  }
}

struct HeadResult {
  double lse, tlse;
};

// The score rule of docs/semantics.md, Attention: the softmax scale, then the soft-cap
// c * tanh(s / c) when c > 0.
struct ScoreRule {
  double scale, soft_cap, temperature;  // temperature 0: no tlse
};

// One query head over n gathered keys k, v ([n, dim] row-major): out = softmax(s) . v with the
// scores s_j of `rule` over dot(q, k_j), lse = log sum exp(s), tlse = log sum exp(s / T) when
// T > 0. n == 0 gives out = 0 and lse = tlse = -inf without forming (-inf) - (-inf).
HeadResult attend(const double* q, const double* k, const double* v, int64_t n, int64_t dim,
                  const ScoreRule& rule, std::vector<double>& logits, double* out) {
  const double temperature = rule.temperature;
  std::fill(out, out + dim, 0.0);
  if (n == 0) return {-kInf, -kInf};
  logits.resize(n);
  double m = -kInf;
  for (int64_t j = 0; j < n; ++j) {
    double dot = 0;
    for (int64_t d = 0; d < dim; ++d) dot += q[d] * k[j * dim + d];
    logits[j] = rule.scale * dot;
    if (rule.soft_cap > 0) logits[j] = rule.soft_cap * std::tanh(logits[j] / rule.soft_cap);
    m = std::max(m, logits[j]);
  }
  double sum = 0, tsum = 0;
  for (int64_t j = 0; j < n; ++j) {
    const double p = std::exp(logits[j] - m);
    sum += p;
    for (int64_t d = 0; d < dim; ++d) out[d] += p * v[j * dim + d];
    if (temperature > 0) tsum += std::exp((logits[j] - m) / temperature);
  }
  for (int64_t d = 0; d < dim; ++d) out[d] /= sum;
  return {m + std::log(sum), temperature > 0 ? m / temperature + std::log(tsum) : -kInf};
}

// A k2q CSR passed alongside q2k must be exactly the one build_k2q_csr makes from that q2k,
// and a schedule must be complete: both are checked here, never silently ignored.
void check_k2q_input(const AttentionArgs& a, const BatchGeometry& g, int64_t hkv, int64_t topk) {
  const int64_t rows = a.k2q.row_ptr.shape[1] - 1, slots = g.total_q() * topk;  // >= g.total_rows()
  std::vector<int32_t> rp(hkv * (rows + 1)), qi(hkv * slots);
  fill_k2q(a.q2k, g, rows, rp.data(), qi.data());
  const int32_t* in_rp = a.k2q.row_ptr.ptr<int32_t>();
  const int32_t* in_qi = a.k2q.q_idx.ptr<int32_t>();
  for (int64_t h = 0; h < hkv; ++h) {
    const int64_t ro = h * (rows + 1), qo = h * slots;
    for (int64_t r = 0; r < rows; ++r) {
      bool same = in_rp[ro + r] == rp[ro + r] && in_rp[ro + r + 1] == rp[ro + r + 1];
      for (int64_t i = rp[ro + r]; same && i < rp[ro + r + 1]; ++i) same = in_qi[qo + i] == qi[qo + i];
      MSA_CHECK(same, "k2q: does not match q2k at (head ", h, ", row ", r,
                "); build it with build_k2q_csr from the same q2k");
    }
  }
  if (a.k2q.schedule.defined()) check_schedule(a.k2q.schedule, in_rp, hkv, rows);
}

// The scale as callers pass it, a float: the default 1/sqrt(D) is rounded to float as well, so
// passing that value explicitly gives the same result.
double softmax_scale(const AttentionParams& p, int64_t dim) {
  return p.softmax_scale != 0.f ? double(p.softmax_scale) : double(float(1.0 / std::sqrt(double(dim))));
}

}  // namespace

void attention_forward(const AttentionArgs& a, const ProblemShape& s) {
  const BatchGeometry g =
      batch_geometry(a.cu_seqlens_q, host_key_lengths(a.kv, s), s.kv_block_size);
  if (a.q2k.defined()) {
    check_q2k_ids(a.q2k, g);
    if (a.k2q.row_ptr.defined()) check_k2q_input(a, g, s.num_kv_heads, s.topk);
  }
  const int64_t dim = s.head_dim, hkv = s.num_kv_heads, total_q = s.total_q;
  const ScoreRule rule{softmax_scale(a.params, dim), a.params.soft_cap,
                       a.tlse.defined() ? a.params.temperature : 0.0};
  const QReader q_rows(QTensor(a.q, a.q_scale), dim);
  const KeyReader k_rows(a.kv, s, KVPart::k), v_rows(a.kv, s, KVPart::v);
  const Tensor& out = a.out;

#pragma omp parallel
  {
    std::vector<KeyRange> ranges;
    std::vector<double> k, v, logits, q(dim), o(dim);
#pragma omp for schedule(dynamic, 1)
    for (int64_t th = 0; th < total_q * hkv; ++th) {
      const int64_t t = th / hkv, h = th % hkv, b = g.token_batch[t];
      // Gather the attended K and V rows once for the G query heads of kv head h; masked keys
      // are never read.
      attended_ranges(a, g, s.topk, h, t, ranges);
      const uint8_t* keep = mask_row(a, g, t);
      int64_t n = 0;
      for (const KeyRange& r : ranges) n += r.end - r.begin;
      k.resize(n * dim);
      v.resize(n * dim);
      n = 0;
      for (const KeyRange& r : ranges)
        for (int64_t j = r.begin; j < r.end; ++j) {
          if (keep && !keep[j]) continue;
          k_rows.row(b, j, h, &k[n * dim]);
          v_rows.row(b, j, h, &v[n * dim]);
          ++n;
        }
      for (int64_t hq = h * s.group; hq < (h + 1) * s.group; ++hq) {
        q_rows.row(t, hq, q.data());
        const HeadResult res = attend(q.data(), k.data(), v.data(), n, dim, rule, logits, o.data());
        const int64_t base = t * out.strides[0] + hq * out.strides[1];
        for (int64_t d = 0; d < dim; ++d) store_value(out, base + d, o[d]);
        if (a.lse.defined()) a.lse.ptr<float>()[hq * a.lse.strides[0] + t * a.lse.strides[1]] = float(res.lse);
        if (a.tlse.defined())
          a.tlse.ptr<float>()[hq * a.tlse.strides[0] + t * a.tlse.strides[1]] = float(res.tlse);
      }
    }
  }
  k_rows.check_table_unchanged("attention_forward");
  v_rows.check_table_unchanged("attention_forward");
}

}  // namespace msa::cpu
