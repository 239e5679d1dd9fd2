// Random SDSA indexer problems on the host (msa/sdsa.h) for the CPU and GPU suites: a paged index
// key cache (bf16, or NVFP4 written by quantize_write_index_qk_nvfp4) with shuffled pages, NaN in
// every slot no length covers and a table column past every length holding an invalid id, query
// rows mapped to requests with optional causal row lengths, and the brute-force full sort the
// selection must equal.
#pragma once

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "support/host_tensor.h"

namespace msa::test {

struct SdsaShape {
  int64_t dim = 64;
  int64_t page_size = 16;
  std::vector<int32_t> seq_lens;      // per request
  std::vector<int32_t> row_requests;  // per query row
  bool row_lens = false;              // rows see a random prefix of their request
  bool fp4_keys = false, fp4_query = false;
  bool coarse = false;  // small integer values: many equal scores
};

struct SdsaCase {
  SdsaShape shape;
  HostTensor keys, key_scale, table, lens, query, query_scale, requests, row_lens;
  float key_global = 1.f, query_global = 1.f;

  IndexKeyCache cache() const {
    IndexKeyCache c;
    c.key_cache = shape.fp4_keys ? QTensor(keys.t, key_scale.t, key_global) : QTensor(keys.t);
    c.block_table = table.t;
    c.seq_lens = lens.t;
    return c;
  }
  IndexQueryRows rows() const {
    IndexQueryRows r;
    r.query = shape.fp4_query ? QTensor(query.t, query_scale.t, query_global) : QTensor(query.t);
    r.row_requests = requests.t;
    if (shape.row_lens) r.row_lens = row_lens.t;
    return r;
  }
  int64_t num_rows() const { return int64_t(shape.row_requests.size()); }
  // Keys row t sees.
  int32_t row_len(int64_t t) const {
    return shape.row_lens ? row_lens.data<int32_t>()[t] : shape.seq_lens[shape.row_requests[t]];
  }
  int32_t longest_row() const {
    int32_t m = 0;
    for (int64_t t = 0; t < num_rows(); ++t) m = std::max(m, row_len(t));
    return m;
  }
};

inline float sdsa_value(std::mt19937& rng, bool coarse) {
  if (coarse) return float(std::uniform_int_distribution<int>(-2, 2)(rng));
  return std::normal_distribution<float>(0.f, 1.f)(rng);
}

inline HostTensor random_rows(std::mt19937& rng, int64_t n, int64_t dim, bool coarse) {
  HostTensor x(DType::f32, {n, dim});
  for (int64_t i = 0; i < n * dim; ++i) x.data<float>()[i] = sdsa_value(rng, coarse);
  return x;
}

inline void store_bf16_rows(const HostTensor& src, HostTensor& dst, int64_t row, int64_t dst_off) {
  const int64_t dim = src.t.shape[1];
  for (int64_t d = 0; d < dim; ++d)
    dst.data<uint16_t>()[dst_off + d] = codec::float_to_bf16(src.data<float>()[row * dim + d]);
}

inline SdsaCase make_sdsa_case(const SdsaShape& sh, uint32_t seed) {
  std::mt19937 rng(seed);
  const int64_t batch = int64_t(sh.seq_lens.size()), rows = int64_t(sh.row_requests.size());
  const int64_t ps = sh.page_size, dim = sh.dim;
  int64_t width = 1, used = 0;
  for (int32_t l : sh.seq_lens) {
    width = std::max<int64_t>(width, (l + ps - 1) / ps + 1);
    used += (l + ps - 1) / ps;
  }
  const int64_t num_pages = used + 2;
  std::vector<int32_t> pages(static_cast<size_t>(num_pages));
  std::iota(pages.begin(), pages.end(), 0);
  std::shuffle(pages.begin(), pages.end(), rng);
  const DType kdt = sh.fp4_keys ? DType::fp4x2 : DType::bf16;
  const DType qdt = sh.fp4_query ? DType::fp4x2 : DType::bf16;
  const int64_t kdim = sh.fp4_keys ? dim / 2 : dim, qdim = sh.fp4_query ? dim / 2 : dim;
  SdsaCase c{sh,
             HostTensor(kdt, {num_pages, ps, kdim}),
             HostTensor(DType::fp8_e4m3, {num_pages, ps, std::max<int64_t>(dim / 16, 1)}),
             HostTensor(DType::i32, {batch, width}),
             i32_tensor(sh.seq_lens),
             HostTensor(qdt, {rows, qdim}),
             HostTensor(DType::fp8_e4m3, {rows, std::max<int64_t>(dim / 16, 1)}),
             i32_tensor(sh.row_requests),
             HostTensor(DType::i32, {rows})};
  c.key_global = sh.fp4_keys ? 0.25f : 1.f;
  c.query_global = sh.fp4_query ? 0.5f : 1.f;
  // Keys: the source rows of each request in position order; slots from the shuffled pages. The
  // column past every length holds an id outside the pool: it must never be read.
  std::vector<int32_t> slots;
  int64_t next = 0;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t col = 0; col < width; ++col)
      c.table.data<int32_t>()[b * width + col] =
          col * ps < sh.seq_lens[b] ? pages[size_t(next++)] : int32_t(num_pages + 1000);
    for (int32_t j = 0; j < sh.seq_lens[b]; ++j)
      slots.push_back(c.table.data<int32_t>()[b * width + j / ps] * int32_t(ps) + j % int32_t(ps));
  }
  const HostTensor ksrc = random_rows(rng, int64_t(slots.size()), dim, sh.coarse);
  const HostTensor qsrc = random_rows(rng, rows, dim, sh.coarse);
  if (sh.fp4_keys || sh.fp4_query) {
    const HostTensor slot_t = i32_tensor(slots);
    QuantizeIndexQKArgs w;
    if (sh.fp4_keys) {
      w.key = ksrc.t;
      w.slots = slot_t.t;
      w.key_cache = QTensor(c.keys.t, c.key_scale.t, c.key_global);
    }
    if (sh.fp4_query) {
      w.query = qsrc.t;
      w.query_out = QTensor(c.query.t, c.query_scale.t, c.query_global);
    }
    quantize_write_index_qk_nvfp4(w);
  }
  if (!sh.fp4_keys)
    for (size_t n = 0; n < slots.size(); ++n) store_bf16_rows(ksrc, c.keys, int64_t(n), slots[n] * dim);
  if (!sh.fp4_query)
    for (int64_t t = 0; t < rows; ++t) store_bf16_rows(qsrc, c.query, t, t * dim);
  for (int64_t t = 0; t < rows; ++t) {
    const int32_t len = sh.seq_lens[size_t(sh.row_requests[t])];
    c.row_lens.data<int32_t>()[t] = std::uniform_int_distribution<int32_t>(0, len)(rng);
  }
  return c;
}

// The full sort (docs/semantics.md, SDSA indexer): per row of scores [T, W] the topk best
// positions below the row's length, higher scores first (-0 == +0), NaN below every other value,
// -inf never; ties toward the lower position; ascending, -1 padded. Written from the definition
// with float comparisons, apart from the rank keys the library uses.
inline std::vector<int32_t> full_sort_topk(const float* row, int64_t len, int64_t topk) {
  std::vector<int32_t> pos;
  for (int64_t j = 0; j < len; ++j)
    if (!(row[j] == -INFINITY)) pos.push_back(int32_t(j));
  std::stable_sort(pos.begin(), pos.end(), [row](int32_t x, int32_t y) {
    const bool xn = std::isnan(row[x]), yn = std::isnan(row[y]);
    if (xn || yn) return !xn && yn;
    return row[x] > row[y];
  });
  pos.resize(std::min<size_t>(pos.size(), size_t(topk)));
  std::sort(pos.begin(), pos.end());
  pos.resize(size_t(topk), -1);
  return pos;
}

}  // namespace msa::test
