// Public SDSA indexer ops that read the paged key cache (include/msa/sdsa.h): indexer_scores,
// indexer_threshold_select and gather_key_sample. Every argument is checked on the host; for CPU
// tensors the lengths', row requests' and block ids' values too (CUDA checks those on the device).
#include "msa/sdsa.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "api/sdsa_checks.h"
#include "api/validate.h"
#include "backend.h"
#include "common/sdsa.h"

namespace msa {
namespace api {

namespace {

// An NVFP4 tensor's scale and global scale: e4m3 [lead..., D / 16], contiguous last dim, on the
// values' device; bf16 / f16 values take no scale.
void check_nvfp4_scale(const QTensor& x, const char* name, int64_t dim) {
  const std::string sn = std::string(name) + ".scale";
  if (x.values.dtype != DType::fp4x2) {
    MSA_CHECK(!x.scale.defined(), sn, ": only NVFP4 (fp4x2) values take a scale");
    return;
  }
  MSA_CHECK(dim % 16 == 0, name, ": NVFP4 head dim ", dim, " must be a multiple of 16");
  const Tensor& sc = x.scale;
  check_defined(sc, sn.c_str());
  check_dtype(sc, sn.c_str(), {DType::fp8_e4m3});
  check_same_device(x.values, name, sc, sn.c_str());
  MSA_CHECK(sc.ndim == x.values.ndim, sn, ": must have ", x.values.ndim, " dims, got ",
            sc.describe());
  for (int d = 0; d + 1 < sc.ndim; ++d)
    MSA_CHECK(sc.shape[d] == x.values.shape[d], sn, ": must be [", name, "'s leading dims, D / 16 = ",
              dim / 16, "], got ", sc.describe(), " for ", x.values.describe());
  MSA_CHECK(sc.shape[sc.ndim - 1] == dim / 16, sn, ": last dim must be D / 16 = ", dim / 16,
            ", got ", sc.describe());
  check_last_dim_contiguous(sc, sn.c_str());
  MSA_CHECK(std::isfinite(x.global_scale) && x.global_scale > 0.f, name,
            ".global_scale: must be finite and > 0 for NVFP4, got ", x.global_scale);
}

}  // namespace

void check_i32_vector(const Tensor& t, const char* name, int64_t n) {
  check_defined(t, name);
  check_dtype(t, name, {DType::i32});
  check_shape(t, name, {n});
  check_contiguous(t, name);
}

int64_t check_index_values(const QTensor& x, const char* name, int ndim) {
  const Tensor& v = x.values;
  check_defined(v, name);
  check_dtype(v, name, {DType::bf16, DType::f16, DType::fp4x2});
  check_ndim(v, name, ndim);
  check_last_dim_contiguous(v, name);
  const int64_t dim = logical_last_dim(v, name);
  MSA_CHECK(dim >= 1, name, ": needs a head dim of at least one element, got ", v.describe());
  check_nvfp4_scale(x, name, dim);
  return dim;
}

ProblemShape check_index_cache(const IndexKeyCache& c) {
  ProblemShape s;
  s.head_dim = check_index_values(c.key_cache, "key_cache", 3);
  s.num_pages = c.key_cache.values.shape[0];
  s.page_size = c.key_cache.values.shape[1];
  MSA_CHECK(s.page_size >= 1, "key_cache: page_size (dim 1) must be >= 1, got ", c.key_cache.values.describe());
  check_defined(c.block_table, "block_table");
  check_dtype(c.block_table, "block_table", {DType::i32});
  check_ndim(c.block_table, "block_table", 2);
  check_last_dim_contiguous(c.block_table, "block_table");
  s.batch = c.block_table.shape[0];
  s.max_pages = c.block_table.shape[1];
  check_i32_vector(c.seq_lens, "seq_lens", s.batch);
  s.num_q_heads = s.num_kv_heads = 1;
  return s;
}

void check_index_rows(const IndexQueryRows& r, ProblemShape& s) {
  const int64_t dim = check_index_values(r.query, "query", 2);
  MSA_CHECK(dim == s.head_dim, "query: head dim ", dim, " must equal key_cache's ", s.head_dim);
  s.total_q = r.query.values.shape[0];
  check_i32_vector(r.row_requests, "row_requests", s.total_q);
  if (r.row_lens.defined()) check_i32_vector(r.row_lens, "row_lens", s.total_q);
}

void check_cache_values(const IndexKeyCache& c, const ProblemShape& s) {
  const int32_t* lens = c.seq_lens.ptr<int32_t>();
  const Tensor& bt = c.block_table;
  for (int64_t b = 0; b < s.batch; ++b) {
    MSA_CHECK(lens[b] >= 0 && lens[b] <= s.max_pages * s.page_size, "seq_lens: entry ", b,
              " must be in [0, W * page_size = ", s.max_pages * s.page_size, "], got ", lens[b]);
    for (int64_t c = 0; c < num_blocks(lens[b], s.page_size); ++c) {
      const int32_t id = bt.ptr<int32_t>()[b * bt.strides[0] + c];
      MSA_CHECK(id >= 0 && id < s.num_pages, "block_table: page id ", id, " out of range [0, ",
                s.num_pages, ") at (request ", b, ", column ", c, ")");
    }
  }
}

int64_t check_row_values(const IndexQueryRows& r, const IndexKeyCache& c, const ProblemShape& s) {
  int64_t longest = 0;
  for (int64_t t = 0; t < s.total_q; ++t) {
    const int32_t b = r.row_requests.ptr<int32_t>()[t];
    MSA_CHECK(b >= 0 && b < s.batch, "row_requests: row ", t, " names request ", b,
              ", outside [0, B = ", s.batch, ")");
    const int32_t len = c.seq_lens.ptr<int32_t>()[b];
    if (r.row_lens.defined()) {
      const int32_t l = r.row_lens.ptr<int32_t>()[t];
      MSA_CHECK(l >= 0 && l <= len, "row_lens: row ", t, " must be in [0, seq_lens[", b, "] = ",
                len, "], got ", l);
      longest = std::max<int64_t>(longest, l);
    } else {
      longest = std::max<int64_t>(longest, len);
    }
  }
  return longest;
}

}  // namespace api

namespace {

// The device of an op over query rows and the key cache, with `more` output arguments.
Device rows_cache_device(const char* op, const IndexQueryRows& r, const IndexKeyCache& c,
                         api::TensorArgs more) {
  const Device d = api::common_device(
      op, {{&r.query.values, "query"}, {&r.query.scale, "query.scale"},
           {&r.row_requests, "row_requests"}, {&r.row_lens, "row_lens"},
           {&c.key_cache.values, "key_cache"}, {&c.key_cache.scale, "key_cache.scale"},
           {&c.block_table, "block_table"}, {&c.seq_lens, "seq_lens"}});
  for (const auto& [t, name] : more)
    MSA_CHECK(!t->defined() || t->device == d, op, ": ", name, " is on ", device_name(t->device),
              ", but query on ", device_name(d), "; all on one device");
  return d;
}

}  // namespace

void indexer_scores(const IndexerScoresArgs& a, cudaStream_t stream) {
  const Device device = rows_cache_device("indexer_scores", a.rows, a.cache, {{&a.scores, "scores"}});
  ProblemShape s = api::check_index_cache(a.cache);
  api::check_index_rows(a.rows, s);
  check_defined(a.scores, "scores");
  check_dtype(a.scores, "scores", {DType::f32});
  check_ndim(a.scores, "scores", 2);
  check_last_dim_contiguous(a.scores, "scores");
  MSA_CHECK(a.scores.shape[0] == s.total_q, "scores: must be [T = ", s.total_q, ", max_len], got ",
            a.scores.describe());
  if (device.type == DeviceType::cuda) {
    api::check_status_arg(a.status, device, "indexer_scores");
    return cuda::indexer_scores(a, s, stream);
  }
  api::check_cache_values(a.cache, s);
  const int64_t longest = api::check_row_values(a.rows, a.cache, s);
  MSA_CHECK(longest <= a.scores.shape[1], "scores: ", a.scores.shape[1],
            " columns cannot hold a row of ", longest, " keys, got ", a.scores.describe());
  cpu::indexer_scores(a, s);
}

void indexer_threshold_select(const ThresholdSelectArgs& a, cudaStream_t stream) {
  const Device device = rows_cache_device(
      "indexer_threshold_select", a.rows, a.cache,
      {{&a.thresholds, "thresholds"}, {&a.candidates, "candidates"}, {&a.ties, "ties"},
       {&a.counts, "counts"}});
  ProblemShape s = api::check_index_cache(a.cache);
  api::check_index_rows(a.rows, s);
  check_defined(a.thresholds, "thresholds");
  check_dtype(a.thresholds, "thresholds", {DType::f32});
  check_shape(a.thresholds, "thresholds", {s.total_q});
  check_contiguous(a.thresholds, "thresholds");
  api::check_candidate_stores(a.candidates, a.ties, a.counts, s.total_q);
  if (device.type == DeviceType::cuda) {
    api::check_status_arg(a.status, device, "indexer_threshold_select");
    return cuda::indexer_threshold_select(a, s, stream);
  }
  api::check_cache_values(a.cache, s);
  api::check_row_values(a.rows, a.cache, s);
  for (int64_t t = 0; t < s.total_q; ++t) {
    const int32_t* c = a.counts.ptr<int32_t>() + 3 * t;
    MSA_CHECK(c[0] == 0 && c[1] == 0 && c[2] == 0, "counts: must be zero on entry "
              "(thresholds_from_sample zeroes them), got (", c[0], ", ", c[1], ", ", c[2],
              ") for row ", t);
  }
  cpu::indexer_threshold_select(a, s);
}

void gather_key_sample(const GatherKeySampleArgs& a, cudaStream_t stream) {
  const IndexKeyCache& c = a.cache;
  const Device device = api::common_device(
      "gather_key_sample",
      {{&c.key_cache.values, "key_cache"}, {&c.key_cache.scale, "key_cache.scale"}, {&c.block_table, "block_table"},
       {&c.seq_lens, "seq_lens"}, {&a.offsets, "offsets"}, {&a.sample.values, "sample"},
       {&a.sample.scale, "sample.scale"}, {&a.sample_lens, "sample_lens"}});
  const ProblemShape s = api::check_index_cache(c);
  MSA_CHECK(a.stride >= 1, "stride: must be >= 1, got ", a.stride);
  if (a.offsets.defined()) api::check_i32_vector(a.offsets, "offsets", s.batch);
  const Tensor& out = a.sample.values;
  check_defined(out, "sample");
  check_dtype(out, "sample", {c.key_cache.values.dtype});
  check_ndim(out, "sample", 3);
  MSA_CHECK(out.shape[0] == s.batch && out.shape[2] == c.key_cache.values.shape[2], "sample: must be "
            "[B = ", s.batch, ", S, ", c.key_cache.values.shape[2], "] (key_cache's last dim), got ",
            out.describe());
  check_last_dim_contiguous(out, "sample");
  if (out.dtype == DType::fp4x2) {
    const Tensor& sc = a.sample.scale;
    check_defined(sc, "sample.scale");
    check_dtype(sc, "sample.scale", {DType::fp8_e4m3});
    check_shape(sc, "sample.scale", {s.batch, out.shape[1], s.head_dim / 16});
    check_last_dim_contiguous(sc, "sample.scale");
  } else {
    MSA_CHECK(!a.sample.scale.defined(), "sample.scale: only NVFP4 (fp4x2) samples take a scale");
  }
  api::check_i32_vector(a.sample_lens, "sample_lens", s.batch);
  if (device.type == DeviceType::cuda) {
    api::check_status_arg(a.status, device, "gather_key_sample");
    return cuda::gather_key_sample(a, s, stream);
  }
  api::check_cache_values(c, s);
  for (int64_t b = 0; b < s.batch; ++b) {
    const int32_t off = a.offsets.defined() ? a.offsets.ptr<int32_t>()[b] : 0;
    MSA_CHECK(off >= 0 && off < a.stride, "offsets: entry ", b, " must be in [0, stride = ",
              a.stride, "), got ", off);
    const int64_t n = sdsa::sample_count(c.seq_lens.ptr<int32_t>()[b], off, a.stride);
    MSA_CHECK(n <= out.shape[1], "sample: S = ", out.shape[1], " cannot hold request ", b, "'s ",
              n, " samples (", c.seq_lens.ptr<int32_t>()[b], " keys, stride ", a.stride, ")");
  }
  cpu::gather_key_sample(a, s);
}

}  // namespace msa
