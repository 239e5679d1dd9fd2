// CPU references of the SDSA indexer ops that read the paged key cache (msa/sdsa.h):
// indexer_scores, indexer_threshold_select and gather_key_sample. A score is the dot product of
// the decoded query row and key in fp64, rounded once to f32 (NVFP4 over NVFP4: exact from the
// codes, common/sdsa.h); both ops score through one function, so the select keeps exactly the
// keys a sort of indexer_scores' row would rank first.
#include <atomic>
#include <cstring>
#include <limits>
#include <vector>

#include "common/sdsa.h"
#include "cpu/access.h"

namespace msa::cpu {
namespace {

// Reads query rows and their request's keys. Validation checked every length, request and page
// id, but they are the caller's memory and the bindings release the GIL: each is checked again
// where it is read. One out of range then (written during the call) ends its row early or reads
// NaN instead of reading out of bounds, and marks the reader for the op to report after its
// loops (an exception cannot leave an OpenMP region).
class IndexReader {
 public:
  IndexReader(const IndexQueryRows& r, const IndexKeyCache& c, const ProblemShape& s)
      : rows_(r), cache_(c), s_(s), qdec_(r.query, s.head_dim), kdec_(c.key_cache, s.head_dim),
        both_nvfp4_(r.query.values.dtype == DType::fp4x2 &&
                    c.key_cache.values.dtype == DType::fp4x2) {}

  // Decodes row t's query into q (D doubles); returns its request b and length L_t (-1, 0 when a
  // value changed after validation).
  std::pair<int64_t, int64_t> row(int64_t t, double* q) const {
    const int64_t b = rows_.row_requests.ptr<int32_t>()[t];
    if (b < 0 || b >= s_.batch) return changed(-1);
    const int64_t seq = cache_.seq_lens.ptr<int32_t>()[b];
    const int64_t len = rows_.row_lens.defined() ? rows_.row_lens.ptr<int32_t>()[t] : seq;
    if (seq > s_.max_pages * s_.page_size || len < 0 || len > seq) return changed(b);
    qdec_.decode(t * rows_.query.values.strides[0], t, 0, q);
    return {b, len};
  }

  // The f32 score of key j of request b against row t's query, decoded in q; krow: D doubles of
  // scratch. An NVFP4 query over NVFP4 keys scores exactly from the codes (common/sdsa.h).
  float score(const double* q, int64_t t, int64_t b, int64_t j, double* krow) const {
    if (both_nvfp4_) return score_nvfp4(t, b, j);
    if (!key(b, j, krow)) return std::numeric_limits<float>::quiet_NaN();
    double dot = 0;
    for (int64_t d = 0; d < s_.head_dim; ++d) dot += q[d] * krow[d];
    // One NaN for every NaN sum: the payload and sign an invalid operation gives differ between
    // processors (x86 makes a negative NaN, CUDA a positive one).
    return dot != dot ? std::numeric_limits<float>::quiet_NaN() : float(dot);
  }

  float score_nvfp4(int64_t t, int64_t b, int64_t j) const {
    const int32_t page = page_of(b, j);
    if (page < 0) return std::numeric_limits<float>::quiet_NaN();
    const QTensor& qt = rows_.query;
    const QTensor& kt = cache_.key_cache;
    const int64_t slot = j % s_.page_size;
    const uint8_t* qv = qt.values.ptr<uint8_t>() + t * qt.values.strides[0];
    const uint8_t* qs = qt.scale.ptr<uint8_t>() + t * qt.scale.strides[0];
    const uint8_t* kv =
        kt.values.ptr<uint8_t>() + page * kt.values.strides[0] + slot * kt.values.strides[1];
    const uint8_t* ks =
        kt.scale.ptr<uint8_t>() + page * kt.scale.strides[0] + slot * kt.scale.strides[1];
    int64_t sum = 0;
    bool nan = false;
    for (int64_t g = 0; g < s_.head_dim / 16; ++g) {
      const int32_t part =
          sdsa::nvfp4_group_dot(qv + 8 * g, kv + 8 * g) * sdsa::e4m3_units(qs[g], nan);
      sum += int64_t(part) * sdsa::e4m3_units(ks[g], nan);
    }
    return sdsa::nvfp4_score(sum, nan, qt.global_scale, kt.global_scale);
  }

  // Key j of request b decoded into k (D doubles); false when its page id changed after
  // validation (k is then not written).
  bool key(int64_t b, int64_t j, double* k) const {
    const int32_t page = page_of(b, j);
    if (page < 0) return false;
    const Tensor& v = cache_.key_cache.values;
    const int64_t slot = j % s_.page_size;
    std::optional<int64_t> scale_row;
    if (v.dtype == DType::fp4x2) {
      const Tensor& sc = cache_.key_cache.scale;
      scale_row = page * sc.strides[0] + slot * sc.strides[1];
    }
    kdec_.decode(page * v.strides[0] + slot * v.strides[1], 0, 0, k, scale_row);
    return true;
  }

  // The page of key j of request b, or -1 (marked) when out of range.
  int32_t page_of(int64_t b, int64_t j) const {
    const Tensor& bt = cache_.block_table;
    const int32_t page = bt.ptr<int32_t>()[b * bt.strides[0] + j / s_.page_size];
    if (page >= 0 && page < s_.num_pages) return page;
    changed_.store(true, std::memory_order_relaxed);
    return -1;
  }

  void check_unchanged(const char* op) const {
    MSA_CHECK(!changed_.load(), op, ": seq_lens, row_requests, row_lens or block_table changed "
              "during the call (a value out of range when read, after it passed validation); the "
              "outputs are not valid");
  }

 private:
  std::pair<int64_t, int64_t> changed(int64_t b) const {
    changed_.store(true, std::memory_order_relaxed);
    return {b, 0};
  }

  IndexQueryRows rows_;
  IndexKeyCache cache_;
  ProblemShape s_;
  RowDecoder qdec_, kdec_;
  bool both_nvfp4_;
  mutable std::atomic<bool> changed_{false};
};

}  // namespace

void indexer_scores(const IndexerScoresArgs& a, const ProblemShape& s) {
  const IndexReader reader(a.rows, a.cache, s);
  const int64_t width = a.scores.shape[1];
#pragma omp parallel for schedule(dynamic)
  for (int64_t t = 0; t < s.total_q; ++t) {
    std::vector<double> q(size_t(s.head_dim)), k(size_t(s.head_dim));
    const auto [b, len] = reader.row(t, q.data());
    float* out = a.scores.ptr<float>() + t * a.scores.strides[0];
    const int64_t end = std::min(len, width);  // a length changed past validation stops here
    for (int64_t j = 0; j < end; ++j) out[j] = reader.score(q.data(), t, b, j, k.data());
    for (int64_t j = end; j < width; ++j) out[j] = -std::numeric_limits<float>::infinity();
  }
  reader.check_unchanged("indexer_scores");
}

void indexer_threshold_select(const ThresholdSelectArgs& a, const ProblemShape& s) {
  const IndexReader reader(a.rows, a.cache, s);
  const int64_t cap = a.candidates.shape[1], tie_cap = a.ties.shape[1];
#pragma omp parallel for schedule(dynamic)
  for (int64_t t = 0; t < s.total_q; ++t) {
    std::vector<double> q(size_t(s.head_dim)), k(size_t(s.head_dim));
    const auto [b, len] = reader.row(t, q.data());
    const uint32_t bar = sdsa::rank_key(a.thresholds.ptr<float>()[t]);
    int32_t* cand = a.candidates.ptr<int32_t>() + t * cap * 2;
    int32_t* ties = a.ties.ptr<int32_t>() + t * tie_cap;
    int32_t* count = a.counts.ptr<int32_t>() + 3 * t;
    for (int64_t j = 0; j < len; ++j) {
      const float score = reader.score(q.data(), t, b, j, k.data());
      const uint32_t key = sdsa::rank_key(score);
      if (key > bar) {
        if (count[0] < cap) {
          cand[2 * count[0]] = int32_t(j);
          cand[2 * count[0] + 1] = int32_t(codec::float_bits(score));
        }
        ++count[0];
      } else if (key == bar && key != 0) {
        if (count[1] < tie_cap) ties[count[1]] = int32_t(j);
        ++count[1];
      } else if (key != 0) {
        ++count[2];
      }
    }
  }
  reader.check_unchanged("indexer_threshold_select");
}

void gather_key_sample(const GatherKeySampleArgs& a, const ProblemShape& s) {
  const IndexReader reader(IndexQueryRows{}, a.cache, s);
  const Tensor& src = a.cache.key_cache.values;
  const Tensor& dst = a.sample.values;
  const bool fp4 = src.dtype == DType::fp4x2;
  const size_t row_bytes = size_t(src.shape[2]) * dtype_size(src.dtype);
  const size_t scale_bytes = fp4 ? size_t(s.head_dim / 16) : 0;
  std::atomic<bool> bad_length{false};
#pragma omp parallel for schedule(dynamic)
  for (int64_t b = 0; b < s.batch; ++b) {
    const int64_t off = a.offsets.defined() ? a.offsets.ptr<int32_t>()[b] : 0;
    const int64_t len = a.cache.seq_lens.ptr<int32_t>()[b];
    const int64_t n = sdsa::sample_count(len, off, a.stride);
    if (len > s.max_pages * s.page_size || off < 0 || off >= a.stride || n > dst.shape[1]) {
      bad_length.store(true, std::memory_order_relaxed);
      a.sample_lens.ptr<int32_t>()[b] = 0;
      continue;
    }
    for (int64_t i = 0; i < n; ++i) {
      const int64_t j = off + i * a.stride;
      const int32_t page = reader.page_of(b, j);
      if (page < 0) continue;
      const int64_t slot = j % s.page_size;
      const size_t e = dtype_size(src.dtype);
      std::memcpy(static_cast<uint8_t*>(dst.data) + (b * dst.strides[0] + i * dst.strides[1]) * e,
                  static_cast<const uint8_t*>(src.data) +
                      (page * src.strides[0] + slot * src.strides[1]) * e,
                  row_bytes);
      if (fp4) {
        const Tensor& ss = a.cache.key_cache.scale;
        const Tensor& ds = a.sample.scale;
        std::memcpy(ds.ptr<uint8_t>() + b * ds.strides[0] + i * ds.strides[1],
                    ss.ptr<uint8_t>() + page * ss.strides[0] + slot * ss.strides[1], scale_bytes);
      }
    }
    a.sample_lens.ptr<int32_t>()[b] = int32_t(n);
  }
  reader.check_unchanged("gather_key_sample");
  MSA_CHECK(!bad_length.load(), "gather_key_sample: seq_lens or offsets changed during the call "
            "(a value out of range when read, after it passed validation); the sample is not "
            "valid");
}

}  // namespace msa::cpu
