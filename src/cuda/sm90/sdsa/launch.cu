// The SDSA indexer's CUDA entry points (msa/sdsa.h): fill the kernel parameters of validated
// arguments and launch (launch_kernels.h). Values (lengths, requests, page ids, offsets, slots)
// are checked on the device and reported through the status buffer; nothing here synchronizes
// or allocates, so every op can be captured in a CUDA graph.
#include <algorithm>
#include <climits>
#include <cstdint>

#include "backend.h"
#include "common/sdsa.h"
#include "cuda/sm90/sdsa/launch_kernels.h"

namespace msa::cuda {
namespace {

using namespace sdsa_sm90;

bool aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// Every element the kernels read or write through a pointer of the tensor's element type must be
// aligned to it (framework tensors are; a byte-offset view is not).
void check_element_aligned(const char* op, const Tensor& t, const char* name) {
  if (!t.defined()) return;
  const size_t e = t.dtype == DType::fp4x2 ? 1 : dtype_size(t.dtype);
  MSA_CHECK(aligned(t.data, e), op, ": ", name, ": the base pointer must be aligned to its ",
            e, "-byte elements on CUDA");
}

int32_t clamp_i32(int64_t v) { return int32_t(std::min<int64_t>(v, INT32_MAX)); }

CacheView cache_view(const char* op, const IndexKeyCache& c, const ProblemShape& s) {
  const Tensor& k = c.key_cache.values;
  check_element_aligned(op, k, "key_cache");
  check_element_aligned(op, c.block_table, "block_table");
  check_element_aligned(op, c.seq_lens, "seq_lens");
  MSA_CHECK(s.max_pages <= INT32_MAX && s.page_size <= INT32_MAX && s.batch <= INT32_MAX, op,
            ": the block table [", s.batch, ", ", s.max_pages, "] and page size ", s.page_size,
            " must each be below 2^31 on CUDA");
  CacheView v;
  v.keys = k.data;
  v.key_s0 = k.strides[0];
  v.key_s1 = k.strides[1];
  const bool fp4 = k.dtype == DType::fp4x2;
  if (fp4) {
    v.scale = c.key_cache.scale.ptr<uint8_t>();
    v.scale_s0 = c.key_cache.scale.strides[0];
    v.scale_s1 = c.key_cache.scale.strides[1];
    v.global_scale = c.key_cache.global_scale;
    // 8-byte groups: base and row strides (bytes) multiples of 8.
    v.vec = aligned(k.data, 8) && v.key_s0 % 8 == 0 && v.key_s1 % 8 == 0;
    // 64 elements a step: 32 code bytes, 4 scale bytes (score_nvfp4.cuh, kNvfp4Vec).
    v.vec16 = s.head_dim % 64 == 0 && aligned(k.data, 16) && v.key_s0 % 16 == 0 &&
              v.key_s1 % 16 == 0 && aligned(v.scale, 4) && v.scale_s0 % 4 == 0 &&
              v.scale_s1 % 4 == 0;
  } else {
    // 8 elements (16 bytes) at a time: D a multiple of 8, base and row strides 16-byte aligned.
    v.vec = s.head_dim % 8 == 0 && aligned(k.data, 16) && v.key_s0 % 8 == 0 && v.key_s1 % 8 == 0;
  }
  v.block_table = c.block_table.ptr<int32_t>();
  v.bt_s0 = c.block_table.strides[0];
  v.seq_lens = c.seq_lens.ptr<int32_t>();
  v.batch = int32_t(s.batch);
  v.max_pages = int32_t(s.max_pages);
  v.page_size = int32_t(s.page_size);
  for (int32_t k = 0; k < 31; ++k)
    if ((int64_t(1) << k) == s.page_size) v.page_shift = k;
  v.num_pages = s.num_pages;
  v.dim = int32_t(s.head_dim);
  return v;
}

RowsView rows_view(const char* op, const IndexQueryRows& r, const ProblemShape& s) {
  MSA_CHECK(s.head_dim <= kMaxDim, op, ": CUDA takes head dims up to ", kMaxDim, " (the decoded "
            "query row is held in shared memory), got ", s.head_dim);
  MSA_CHECK(s.total_q <= INT32_MAX, op, ": CUDA takes fewer than 2^31 query rows, got ", s.total_q);
  check_element_aligned(op, r.query.values, "query");
  check_element_aligned(op, r.row_requests, "row_requests");
  check_element_aligned(op, r.row_lens, "row_lens");
  RowsView v;
  v.query = r.query.values.data;
  v.q_s0 = r.query.values.strides[0];
  v.dtype = r.query.values.dtype;
  if (v.dtype == DType::fp4x2) {
    v.scale = r.query.scale.ptr<uint8_t>();
    v.scale_s0 = r.query.scale.strides[0];
    v.global_scale = r.query.global_scale;
  }
  v.row_requests = r.row_requests.ptr<int32_t>();
  v.row_lens = r.row_lens.defined() ? r.row_lens.ptr<int32_t>() : nullptr;
  v.rows = int32_t(s.total_q);
  return v;
}

KeyFormat key_format(const IndexKeyCache& c) {
  switch (c.key_cache.values.dtype) {
    case DType::bf16: return KeyFormat::bf16;
    case DType::f16: return KeyFormat::f16;
    default: return KeyFormat::nvfp4;
  }
}

}  // namespace

void indexer_scores(const IndexerScoresArgs& a, const ProblemShape& s, cudaStream_t stream) {
  const char* op = "indexer_scores";
  check_element_aligned(op, a.scores, "scores");
  ScoresParams p;
  p.rows = rows_view(op, a.rows, s);
  p.cache = cache_view(op, a.cache, s);
  p.scores = a.scores.ptr<float>();
  p.out_s0 = a.scores.strides[0];
  p.width = a.scores.shape[1];
  p.status = a.status.ptr<int32_t>();
  launch_scores(p, key_format(a.cache), stream);
}

void indexer_threshold_select(const ThresholdSelectArgs& a, const ProblemShape& s,
                              cudaStream_t stream) {
  const char* op = "indexer_threshold_select";
  for (const auto& [t, name] : {std::pair{&a.thresholds, "thresholds"},
                                {&a.candidates, "candidates"}, {&a.ties, "ties"},
                                {&a.counts, "counts"}})
    check_element_aligned(op, *t, name);
  SelectParams p;
  p.rows = rows_view(op, a.rows, s);
  p.cache = cache_view(op, a.cache, s);
  p.thresholds = a.thresholds.ptr<float>();
  p.candidates = a.candidates.ptr<int32_t>();
  p.ties = a.ties.ptr<int32_t>();
  p.counts = a.counts.ptr<int32_t>();
  // Counts are int32: no row stores more than 2^31 - 1 keys, so wider stores are never filled.
  p.cap = clamp_i32(a.candidates.shape[1]);
  p.tie_cap = clamp_i32(a.ties.shape[1]);
  p.status = a.status.ptr<int32_t>();
  launch_select(p, key_format(a.cache), stream);
}

void top_k_from_candidates(const TopKFromCandidatesArgs& a, cudaStream_t stream) {
  const char* op = "top_k_from_candidates";
  for (const auto& [t, name] : {std::pair{&a.candidates, "candidates"}, {&a.ties, "ties"},
                                {&a.counts, "counts"}, {&a.ids, "ids"},
                                {&a.row_status, "row_status"}})
    check_element_aligned(op, *t, name);
  MSA_CHECK(a.candidates.shape[0] <= INT32_MAX, op, ": CUDA takes fewer than 2^31 rows, got ",
            a.candidates.shape[0]);
  TopKParams p;
  p.candidates = a.candidates.ptr<int32_t>();
  p.ties = a.ties.ptr<int32_t>();
  p.counts = a.counts.ptr<int32_t>();
  p.ids = a.ids.ptr<int32_t>();
  p.row_status = a.row_status.ptr<int32_t>();
  p.rows = a.candidates.shape[0];
  p.cap = a.candidates.shape[1];
  p.tie_cap = a.ties.shape[1];
  p.topk = a.topk;
  launch_top_k(p, stream);
}

void gather_key_sample(const GatherKeySampleArgs& a, const ProblemShape& s, cudaStream_t stream) {
  const char* op = "gather_key_sample";
  check_element_aligned(op, a.sample.values, "sample");
  check_element_aligned(op, a.offsets, "offsets");
  check_element_aligned(op, a.sample_lens, "sample_lens");
  GatherParams p;
  p.cache = cache_view(op, a.cache, s);
  p.stride = a.stride;
  p.offsets = a.offsets.defined() ? a.offsets.ptr<int32_t>() : nullptr;
  const Tensor& src = a.cache.key_cache.values;
  const Tensor& dst = a.sample.values;
  const int64_t e = dtype_size(src.dtype);  // fp4x2: one byte holds two values
  p.sample = static_cast<uint8_t*>(dst.data);
  p.sample_s0 = dst.strides[0] * e;
  p.sample_s1 = dst.strides[1] * e;
  p.key_s0_bytes = src.strides[0] * e;
  p.key_s1_bytes = src.strides[1] * e;
  p.row_bytes = int32_t(src.shape[2] * e);
  if (src.dtype == DType::fp4x2) {
    p.sample_scale = a.sample.scale.ptr<uint8_t>();
    p.sscale_s0 = a.sample.scale.strides[0];
    p.sscale_s1 = a.sample.scale.strides[1];
    p.scale_bytes = int32_t(s.head_dim / 16);
  }
  p.capacity = dst.shape[1];
  p.vec = p.row_bytes % 16 == 0 && aligned(src.data, 16) && aligned(dst.data, 16) &&
          p.sample_s0 % 16 == 0 && p.sample_s1 % 16 == 0 && p.key_s0_bytes % 16 == 0 &&
          p.key_s1_bytes % 16 == 0;
  p.sample_lens = a.sample_lens.ptr<int32_t>();
  p.status = a.status.ptr<int32_t>();
  launch_gather(p, stream);
}

void thresholds_from_sample(const ThresholdsFromSampleArgs& a, cudaStream_t stream) {
  const char* op = "thresholds_from_sample";
  check_element_aligned(op, a.sample_scores, "sample_scores");
  check_element_aligned(op, a.thresholds, "thresholds");
  check_element_aligned(op, a.counts, "counts");
  MSA_CHECK(a.sample_scores.shape[0] <= INT32_MAX, op, ": CUDA takes fewer than 2^31 rows, got ",
            a.sample_scores.shape[0]);
  ThresholdParams p;
  p.scores = a.sample_scores.ptr<float>();
  p.s0 = a.sample_scores.strides[0];
  p.width = a.sample_scores.shape[1];
  p.rows = a.sample_scores.shape[0];
  p.rank = sdsa::threshold_rank(a.oversample, a.topk, a.sample_stride);
  p.thresholds = a.thresholds.ptr<float>();
  p.counts = a.counts.ptr<int32_t>();
  launch_thresholds(p, stream);
}

void quantize_write_index_qk_nvfp4(const QuantizeIndexQKArgs& a, cudaStream_t stream) {
  const char* op = "quantize_write_index_qk_nvfp4";
  if (a.key.defined()) {
    check_element_aligned(op, a.key, "key");
    check_element_aligned(op, a.slots, "slots");
    const Tensor& v = a.key_cache.values;
    EncodeParams p;
    p.x = a.key.data;
    p.dtype = a.key.dtype;
    p.x_s0 = a.key.strides[0];
    p.n = a.key.shape[0];
    p.dim = int32_t(a.key.shape[1]);
    p.slots = a.slots.ptr<int32_t>();
    p.page_size = v.shape[1];
    p.pool = v.shape[0] * v.shape[1];
    p.codes = v.ptr<uint8_t>();
    p.codes_s0 = v.strides[0];
    p.codes_s1 = v.strides[1];
    p.scales = a.key_cache.scale.ptr<uint8_t>();
    p.scales_s0 = a.key_cache.scale.strides[0];
    p.scales_s1 = a.key_cache.scale.strides[1];
    p.global_scale = a.key_cache.global_scale;
    p.status = a.status.ptr<int32_t>();
    launch_encode(p, stream);
  }
  if (a.query.defined()) {
    check_element_aligned(op, a.query, "query");
    EncodeParams p;
    p.x = a.query.data;
    p.dtype = a.query.dtype;
    p.x_s0 = a.query.strides[0];
    p.n = a.query.shape[0];
    p.dim = int32_t(a.query.shape[1]);
    p.codes = a.query_out.values.ptr<uint8_t>();
    p.codes_s0 = a.query_out.values.strides[0];
    p.scales = a.query_out.scale.ptr<uint8_t>();
    p.scales_s0 = a.query_out.scale.strides[0];
    p.global_scale = a.query_out.global_scale;
    p.status = a.status.ptr<int32_t>();
    launch_encode(p, stream);
  }
}

}  // namespace msa::cuda
