// CPU references of the SDSA indexer ops over rows and slots (msa/sdsa.h): top_k_from_candidates,
// thresholds_from_sample and quantize_write_index_qk_nvfp4.
#include <algorithm>
#include <limits>
#include <vector>

#include "common/sdsa.h"
#include "cpu/access.h"

namespace msa::cpu {
namespace {

CandidateStatus row_state(const int32_t* count, int64_t cap, int64_t tie_cap, int64_t topk) {
  if (count[0] > cap) return CandidateStatus::candidates_overflow;
  if (count[0] < topk && count[1] > tie_cap) return CandidateStatus::ties_overflow;
  if (count[0] + int64_t(count[1]) < topk && count[2] > 0) return CandidateStatus::threshold_too_high;
  return CandidateStatus::exact;
}

// Row `x` (f32 | bf16 | f16, D contiguous) of a plain [rows, D] tensor quantized to NVFP4 into
// `codes` (D / 2 bytes) and `scales` (D / 16 bytes).
void encode_row(const Tensor& x, int64_t row, float global, uint8_t* codes, uint8_t* scales) {
  const int64_t dim = x.shape[1];
  float group[16];
  for (int64_t g = 0; g < dim / 16; ++g) {
    for (int i = 0; i < 16; ++i) group[i] = float(load_value(x, row * x.strides[0] + g * 16 + i));
    scales[g] = sdsa::nvfp4_encode_group(group, global, codes + g * 8);
  }
}

}  // namespace

void top_k_from_candidates(const TopKFromCandidatesArgs& a) {
  const int64_t rows = a.candidates.shape[0], cap = a.candidates.shape[1];
  const int64_t tie_cap = a.ties.shape[1], k = a.topk;
#pragma omp parallel for schedule(dynamic)
  for (int64_t t = 0; t < rows; ++t) {
    const int32_t* count = a.counts.ptr<int32_t>() + 3 * t;
    const CandidateStatus state = row_state(count, cap, tie_cap, k);
    a.row_status.ptr<int32_t>()[t] = int32_t(state);
    int32_t* out = a.ids.ptr<int32_t>() + t * k;
    std::fill(out, out + k, -1);
    if (state == CandidateStatus::candidates_overflow || state == CandidateStatus::ties_overflow)
      continue;
    // Candidates rank above every tie: the best of them by (score desc, position asc) first, then
    // the lowest tie positions.
    const int32_t* cand = a.candidates.ptr<int32_t>() + t * cap * 2;
    std::vector<std::pair<uint32_t, int32_t>> best(static_cast<size_t>(count[0]));
    for (int64_t i = 0; i < count[0]; ++i)
      best[i] = {sdsa::rank_key(codec::bits_float(uint32_t(cand[2 * i + 1]))), cand[2 * i]};
    const size_t take = size_t(std::min<int64_t>(k, count[0]));
    std::partial_sort(best.begin(), best.begin() + take, best.end(), [](const auto& x, const auto& y) {
      return sdsa::ranks_before(x.first, x.second, y.first, y.second);
    });
    std::vector<int32_t> ids(take);
    for (size_t i = 0; i < take; ++i) ids[i] = best[i].second;
    if (int64_t(take) < k) {
      std::vector<int32_t> ties(a.ties.ptr<int32_t>() + t * tie_cap,
                                a.ties.ptr<int32_t>() + t * tie_cap + count[1]);
      std::sort(ties.begin(), ties.end());
      ties.resize(std::min(ties.size(), size_t(k) - take));
      ids.insert(ids.end(), ties.begin(), ties.end());
    }
    std::sort(ids.begin(), ids.end());
    std::copy(ids.begin(), ids.end(), out);
  }
}

void thresholds_from_sample(const ThresholdsFromSampleArgs& a) {
  const int64_t rows = a.sample_scores.shape[0], width = a.sample_scores.shape[1];
  const int64_t rank = sdsa::threshold_rank(a.oversample, a.topk, a.sample_stride);
#pragma omp parallel for schedule(dynamic)
  for (int64_t t = 0; t < rows; ++t) {
    const float* row = a.sample_scores.ptr<float>() + t * a.sample_scores.strides[0];
    std::vector<uint32_t> keys;
    for (int64_t j = 0; j < width; ++j) {
      const uint32_t key = sdsa::rank_key(row[j]);
      if (key != 0) keys.push_back(key);  // -inf marks no sample
    }
    uint32_t bar = 0;  // fewer samples than the rank: -inf, every key a candidate
    if (int64_t(keys.size()) >= rank) {
      std::nth_element(keys.begin(), keys.begin() + (rank - 1), keys.end(), std::greater<>());
      bar = keys[size_t(rank - 1)];
    }
    a.thresholds.ptr<float>()[t] = sdsa::rank_value(bar);
    std::fill(a.counts.ptr<int32_t>() + 3 * t, a.counts.ptr<int32_t>() + 3 * t + 3, 0);
  }
}

void quantize_write_index_qk_nvfp4(const QuantizeIndexQKArgs& a) {
  if (a.key.defined()) {
    const Tensor& v = a.key_cache.values;
    const Tensor& sc = a.key_cache.scale;
    const int64_t page_size = v.shape[1];
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < a.key.shape[0]; ++n) {
      const int32_t slot = a.slots.ptr<int32_t>()[n];
      // Validation checked each slot; one written since is skipped rather than written out of
      // bounds (the bindings release the GIL).
      if (slot < 0 || slot >= v.shape[0] * page_size) continue;
      const int64_t page = slot / page_size, in_page = slot % page_size;
      encode_row(a.key, n, a.key_cache.global_scale,
                 v.ptr<uint8_t>() + page * v.strides[0] + in_page * v.strides[1],
                 sc.ptr<uint8_t>() + page * sc.strides[0] + in_page * sc.strides[1]);
    }
  }
  if (a.query.defined()) {
    const Tensor& v = a.query_out.values;
    const Tensor& sc = a.query_out.scale;
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < a.query.shape[0]; ++t)
      encode_row(a.query, t, a.query_out.global_scale, v.ptr<uint8_t>() + t * v.strides[0],
                 sc.ptr<uint8_t>() + t * sc.strides[0]);
  }
}

}  // namespace msa::cpu
