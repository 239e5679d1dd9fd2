// CPU references of mqa_logits (every (row, key) in range from the decoded values in fp64,
// rounded once to f32) and token_topk (msa/logits.h).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backend.h"
#include "common/codecs.h"
#include "cpu/access.h"

namespace msa::cpu {

namespace {

// scale * sum_h w[h] * relu(q[h] . k), q [H, D] and k [D] decoded; relu keeps NaN.
double logit(const double* q, const double* k, const float* w, int64_t heads, int64_t dim,
             double scale) {
  double sum = 0;
  for (int64_t h = 0; h < heads; ++h) {
    double dot = 0;
    for (int64_t d = 0; d < dim; ++d) dot += q[h * dim + d] * k[d];
    const double relu = dot > 0 || dot != dot ? dot : 0.0;  // NaN stays NaN
    sum += double(w[h]) * relu;
  }
  return scale * sum;
}

}  // namespace

void mqa_logits(const MqaLogitsArgs& a) {
  const Tensor& q = a.q.values;
  const Tensor& k = a.k.values;
  const int64_t t_rows = q.shape[0], heads = q.shape[1], dim = q.shape[2], s_keys = k.shape[0];
  // k's scale multiplies after the relu (it may be negative): the keys are decoded without it.
  const RowDecoder qdec(a.q, dim), kdec(QTensor(a.k.values), dim);
  const float* k_scale = a.k.scale.defined() ? a.k.scale.ptr<float>() : nullptr;
  const int32_t* ks = a.ks.ptr<int32_t>();
  const int32_t* ke = a.ke.ptr<int32_t>();
  float* out = a.logits.ptr<float>();
  const float neg_inf = -std::numeric_limits<float>::infinity();
#pragma omp parallel for schedule(dynamic)
  for (int64_t t = 0; t < t_rows; ++t) {
    std::vector<double> qrow(static_cast<size_t>(heads * dim)), krow(static_cast<size_t>(dim));
    for (int64_t h = 0; h < heads; ++h)
      qdec.decode(t * q.strides[0] + h * q.strides[1], t, h, qrow.data() + h * dim);
    const float* w = a.weights.ptr<float>() + t * a.weights.strides[0];
    float* row = out + t * a.logits.strides[0];
    for (int64_t s = 0; s < s_keys; ++s) {
      if (s < ks[t] || s >= ke[t]) {
        if (a.clean_logits) row[s] = neg_inf;
        continue;
      }
      kdec.decode(s * k.strides[0], s, 0, krow.data());
      row[s] = float(logit(qrow.data(), krow.data(), w, heads, dim, k_scale ? double(k_scale[s]) : 1.0));
    }
  }
}

void paged_mqa_logits(const PagedMqaLogitsArgs& a) {
  const Tensor& q = a.q;
  const bool fp4 = q.dtype == DType::fp4x2;
  const int64_t batch = q.shape[0], next_n = q.shape[1], heads = q.shape[2];
  const int64_t dim = fp4 ? 2 * q.shape[3] : q.shape[3];
  const int64_t block_size = a.kv_fused.shape[1];
  const int64_t value_bytes = fp4 ? dim / 2 : dim;  // a token's values; its scales follow the block's
  const int64_t scale_bytes = fp4 ? dim / 32 : 4;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  // Lengths and block ids passed validation, but they are the caller's memory (the bindings
  // release the GIL): each is checked again where it is read. One out of range then is a table
  // written during the call: its row reads NaN instead of out of bounds, and the call fails after
  // the loop (an exception cannot leave an OpenMP region).
  std::atomic<bool> changed{false};
  const int64_t table_cols = a.block_tables.shape[1], num_blocks = a.kv_fused.shape[0];
#pragma omp parallel for schedule(dynamic)
  for (int64_t r = 0; r < batch * next_n; ++r) {
    const int64_t b = r / next_n, t = r % next_n;
    int64_t len = a.seq_lens.ptr<int32_t>()[b * a.seq_lens.strides[0]];
    if (len < 0 || len > a.max_seq_len || msa::num_blocks(len, block_size) > table_cols) {
      changed.store(true, std::memory_order_relaxed);
      len = 0;
    }
    const int64_t limit = len > 0 ? len - next_n + t + 1 : 0;  // positions [0, limit) are seen
    std::vector<double> qrow(static_cast<size_t>(heads * dim)), krow(static_cast<size_t>(dim));
    for (int64_t h = 0; h < heads; ++h) {
      const uint8_t* src = q.ptr<uint8_t>() + b * q.strides[0] + t * q.strides[1] + h * q.strides[2];
      const uint8_t* sf = fp4 ? a.q_sf.ptr<uint8_t>() + b * a.q_sf.strides[0] +
                                    t * a.q_sf.strides[1] + h * a.q_sf.strides[2]
                              : nullptr;
      for (int64_t d = 0; d < dim; ++d)
        qrow[h * dim + d] = fp4 ? double(codec::fp4x2_get(src, d)) * codec::e8m0_to_float(sf[d / 32])
                                : double(codec::e4m3_to_float(src[d]));
    }
    const float* w = a.weights.ptr<float>() + r * a.weights.strides[0];
    float* row = a.logits.ptr<float>() + r * a.logits.strides[0];
    for (int64_t p = 0; p < a.max_seq_len; ++p) {
      if (p >= limit) {
        if (a.clean_logits) row[p] = neg_inf;
        continue;
      }
      const int32_t blk = a.block_tables.ptr<int32_t>()[b * a.block_tables.strides[0] + p / block_size];
      if (blk < 0 || blk >= num_blocks) {
        changed.store(true, std::memory_order_relaxed);
        row[p] = std::numeric_limits<float>::quiet_NaN();
        continue;
      }
      const uint8_t* base = a.kv_fused.ptr<uint8_t>() + blk * a.kv_fused.strides[0];
      const int64_t i = p % block_size;
      const uint8_t* values = base + i * value_bytes;
      const uint8_t* scales = base + block_size * value_bytes + i * scale_bytes;
      double scale = 1.0;  // FP8: the token's scale, after the ReLU; FP4: folded into the values
      if (fp4) {
        for (int64_t d = 0; d < dim; ++d)
          krow[d] = double(codec::fp4x2_get(values, d)) * codec::e8m0_to_float(scales[d / 32]);
      } else {
        for (int64_t d = 0; d < dim; ++d) krow[d] = codec::e4m3_to_float(values[d]);
        float s;
        std::memcpy(&s, scales, 4);  // little-endian f32
        scale = s;
      }
      row[p] = float(logit(qrow.data(), krow.data(), w, heads, dim, scale));
    }
  }
  MSA_CHECK(!changed.load(), "paged_mqa_logits: seq_lens or block_tables changed during the call "
            "(a value out of range when read, after it passed validation); the logits are not "
            "valid");
}

// Ranking of token_topk: finite values first, higher first; then NaN; ties toward the lower
// position. -inf never enters.
void token_topk(const TokenTopKArgs& a) {
  const int64_t rows = a.logits.shape[0], s_keys = a.logits.shape[1], k = a.topk;
#pragma omp parallel for schedule(dynamic)
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = a.logits.ptr<float>() + r * a.logits.strides[0];
    const int64_t lo = a.ks.defined() ? a.ks.ptr<int32_t>()[r] : 0;
    const int64_t hi = a.ke.defined() ? a.ke.ptr<int32_t>()[r] : s_keys;
    std::vector<int32_t> cand;
    for (int64_t s = lo; s < hi; ++s)
      if (!(row[s] == -std::numeric_limits<float>::infinity())) cand.push_back(int32_t(s));
    const auto better = [row](int32_t x, int32_t y) {
      const bool xn = std::isnan(row[x]), yn = std::isnan(row[y]);
      if (xn != yn) return yn;  // the finite one ranks higher
      if (!xn && row[x] != row[y]) return row[x] > row[y];
      return x < y;
    };
    const size_t take = size_t(std::min<int64_t>(k, int64_t(cand.size())));
    std::partial_sort(cand.begin(), cand.begin() + take, cand.end(), better);
    cand.resize(take);
    std::sort(cand.begin(), cand.end());
    int32_t* out = a.ids.ptr<int32_t>() + r * k;
    for (int64_t i = 0; i < k; ++i) out[i] = i < int64_t(take) ? cand[i] : -1;
  }
}

}  // namespace msa::cpu
