// Public SDSA indexer ops over rows and slots (include/msa/sdsa.h): top_k_from_candidates,
// thresholds_from_sample and quantize_write_index_qk_nvfp4. Every argument is checked on the
// host; for CPU tensors the counts' and slots' values too (CUDA checks those on the device).
#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "api/sdsa_checks.h"
#include "api/validate.h"
#include "backend.h"

namespace msa {
namespace api {

void check_candidate_stores(const Tensor& candidates, const Tensor& ties, const Tensor& counts,
                            int64_t rows) {
  check_defined(candidates, "candidates");
  check_dtype(candidates, "candidates", {DType::i32});
  check_ndim(candidates, "candidates", 3);
  MSA_CHECK(candidates.shape[0] == rows && candidates.shape[1] >= 1 && candidates.shape[2] == 2,
            "candidates: must be [T = ", rows, ", C >= 1, 2] (position, score bits), got ",
            candidates.describe());
  check_contiguous(candidates, "candidates");
  check_defined(ties, "ties");
  check_dtype(ties, "ties", {DType::i32});
  check_ndim(ties, "ties", 2);
  MSA_CHECK(ties.shape[0] == rows, "ties: must be [T = ", rows, ", Ct], got ", ties.describe());
  check_contiguous(ties, "ties");
  check_defined(counts, "counts");
  check_dtype(counts, "counts", {DType::i32});
  check_shape(counts, "counts", {rows, 3});
  check_contiguous(counts, "counts");
}

}  // namespace api

namespace {

// An NVFP4 output of `lead` leading dims and D values a row: values fp4x2 [lead..., D / 2], scale
// e4m3 [lead..., D / 16], both with a contiguous last dim, and a finite global scale > 0.
void check_nvfp4_out(const QTensor& x, const char* name, std::initializer_list<int64_t> lead,
                     int64_t dim) {
  const std::string sn = std::string(name) + ".scale";
  check_defined(x.values, name);
  check_dtype(x.values, name, {DType::fp4x2});
  check_ndim(x.values, name, int(lead.size()) + 1);
  int d = 0;
  for (int64_t n : lead) {
    MSA_CHECK(n < 0 || x.values.shape[d] == n, name, ": dim ", d, " must be ", n, ", got ",
              x.values.describe());
    ++d;
  }
  MSA_CHECK(x.values.shape[d] == dim / 2, name, ": last dim must be D / 2 = ", dim / 2,
            " bytes, got ", x.values.describe());
  check_last_dim_contiguous(x.values, name);
  check_defined(x.scale, sn.c_str());
  check_dtype(x.scale, sn.c_str(), {DType::fp8_e4m3});
  check_ndim(x.scale, sn.c_str(), d + 1);
  for (int i = 0; i < d; ++i)
    MSA_CHECK(x.scale.shape[i] == x.values.shape[i], sn, ": must be [", name,
              "'s leading dims, D / 16 = ", dim / 16, "], got ", x.scale.describe());
  MSA_CHECK(x.scale.shape[d] == dim / 16, sn, ": last dim must be D / 16 = ", dim / 16, ", got ",
            x.scale.describe());
  check_last_dim_contiguous(x.scale, sn.c_str());
  MSA_CHECK(std::isfinite(x.global_scale) && x.global_scale > 0.f, name,
            ".global_scale: must be finite and > 0, got ", x.global_scale);
}

// A plain [rows, D] input of the quantizer: f32 | bf16 | f16, D a multiple of 16.
int64_t check_plain_rows(const Tensor& t, const char* name) {
  check_defined(t, name);
  check_dtype(t, name, {DType::f32, DType::bf16, DType::f16});
  check_ndim(t, name, 2);
  check_last_dim_contiguous(t, name);
  MSA_CHECK(t.shape[1] >= 16 && t.shape[1] % 16 == 0, name, ": D must be a positive multiple of 16 "
            "(NVFP4 groups), got ", t.describe());
  return t.shape[1];
}

}  // namespace

void top_k_from_candidates(const TopKFromCandidatesArgs& a, cudaStream_t stream) {
  const Device device = api::common_device(
      "top_k_from_candidates", {{&a.candidates, "candidates"}, {&a.ties, "ties"},
                                {&a.counts, "counts"}, {&a.ids, "ids"},
                                {&a.row_status, "row_status"}});
  check_defined(a.candidates, "candidates");
  const int64_t rows = a.candidates.ndim >= 1 ? a.candidates.shape[0] : 0;
  api::check_candidate_stores(a.candidates, a.ties, a.counts, rows);
  MSA_CHECK(a.topk >= 1, "topk: must be >= 1, got ", a.topk);
  check_defined(a.ids, "ids");
  check_dtype(a.ids, "ids", {DType::i32});
  check_shape(a.ids, "ids", {rows, int64_t(a.topk)});
  check_contiguous(a.ids, "ids");
  api::check_i32_vector(a.row_status, "row_status", rows);
  if (device.type == DeviceType::cuda) return cuda::top_k_from_candidates(a, stream);
  for (int64_t t = 0; t < rows; ++t) {
    const int32_t* c = a.counts.ptr<int32_t>() + 3 * t;
    MSA_CHECK(c[0] >= 0 && c[1] >= 0 && c[2] >= 0, "counts: row ", t, " must be >= 0, got (",
              c[0], ", ", c[1], ", ", c[2], ")");
  }
  cpu::top_k_from_candidates(a);
}

void thresholds_from_sample(const ThresholdsFromSampleArgs& a, cudaStream_t stream) {
  const Device device = api::common_device(
      "thresholds_from_sample", {{&a.sample_scores, "sample_scores"},
                                 {&a.thresholds, "thresholds"}, {&a.counts, "counts"}});
  check_defined(a.sample_scores, "sample_scores");
  check_dtype(a.sample_scores, "sample_scores", {DType::f32});
  check_ndim(a.sample_scores, "sample_scores", 2);
  check_last_dim_contiguous(a.sample_scores, "sample_scores");
  const int64_t rows = a.sample_scores.shape[0];
  MSA_CHECK(a.topk >= 1, "topk: must be >= 1, got ", a.topk);
  MSA_CHECK(a.sample_stride >= 1, "sample_stride: must be >= 1, got ", a.sample_stride);
  // The bound keeps oversample * topk an exact integer range in double (threshold_rank).
  MSA_CHECK(std::isfinite(a.oversample) && a.oversample >= 1.0 && a.oversample <= 1048576.0,
            "oversample: must be in [1, 2^20], got ", a.oversample);
  check_defined(a.thresholds, "thresholds");
  check_dtype(a.thresholds, "thresholds", {DType::f32});
  check_shape(a.thresholds, "thresholds", {rows});
  check_contiguous(a.thresholds, "thresholds");
  check_defined(a.counts, "counts");
  check_dtype(a.counts, "counts", {DType::i32});
  check_shape(a.counts, "counts", {rows, 3});
  check_contiguous(a.counts, "counts");
  if (device.type == DeviceType::cuda) return cuda::thresholds_from_sample(a, stream);
  cpu::thresholds_from_sample(a);
}

void quantize_write_index_qk_nvfp4(const QuantizeIndexQKArgs& a, cudaStream_t stream) {
  const Device device = api::common_device(
      "quantize_write_index_qk_nvfp4",
      {{&a.key, "key"}, {&a.slots, "slots"}, {&a.key_cache.values, "key_cache"},
       {&a.key_cache.scale, "key_cache.scale"}, {&a.query, "query"},
       {&a.query_out.values, "query_out"}, {&a.query_out.scale, "query_out.scale"}});
  MSA_CHECK(a.key.defined() || a.query.defined(), "quantize_write_index_qk_nvfp4: give key (with "
            "slots and key_cache) or query (with query_out), or both");
  if (a.key.defined()) {
    const int64_t dim = check_plain_rows(a.key, "key");
    api::check_i32_vector(a.slots, "slots", a.key.shape[0]);
    check_nvfp4_out(a.key_cache, "key_cache", {-1, -1}, dim);
  } else {
    MSA_CHECK(!a.slots.defined() && !a.key_cache.values.defined(), "slots, key_cache: given "
              "without key");
  }
  if (a.query.defined()) {
    const int64_t dim = check_plain_rows(a.query, "query");
    check_nvfp4_out(a.query_out, "query_out", {a.query.shape[0]}, dim);
  } else {
    MSA_CHECK(!a.query_out.values.defined(), "query_out: given without query");
  }
  if (device.type == DeviceType::cuda) {
    api::check_status_arg(a.status, device, "quantize_write_index_qk_nvfp4");
    return cuda::quantize_write_index_qk_nvfp4(a, stream);
  }
  if (a.key.defined()) {
    // Each slot at most once: a repeated slot would leave the cache row to whichever key came
    // last, which a parallel writer cannot make deterministic.
    const int64_t pool = a.key_cache.values.shape[0] * a.key_cache.values.shape[1];
    std::vector<std::pair<int32_t, int64_t>> given;  // (slot, entry), the slots not skipped
    for (int64_t n = 0; n < a.key.shape[0]; ++n) {
      const int32_t slot = a.slots.ptr<int32_t>()[n];
      if (slot < 0) continue;
      MSA_CHECK(slot < pool, "slots: entry ", n, " = ", slot, " is past the cache's ", pool,
                " slots (num_pages * page_size)");
      given.emplace_back(slot, n);
    }
    std::sort(given.begin(), given.end());
    for (size_t i = 1; i < given.size(); ++i)
      MSA_CHECK(given[i].first != given[i - 1].first, "slots: slot ", given[i].first,
                " given twice (entries ", given[i - 1].second, " and ", given[i].second, ")");
  }
  cpu::quantize_write_index_qk_nvfp4(a);
}

}  // namespace msa
