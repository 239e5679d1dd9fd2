// CPU reference of the token-sparse builders (msa/token_sparse.h): token_sparse_kv_indices and
// group_union_masks as plain loops over validated host tensors. The value checks run in the
// header's order, each class over its whole argument before the next (as msa.token_sparse's numpy
// version does), and name the offending entry as that version does.
#include <algorithm>
#include <climits>
#include <cstring>
#include <string>
#include <vector>

#include "backend.h"

namespace msa::cpu {
namespace {

// A row of positions as positions' (Python) index: positions[t] or positions[h, t].
struct Rows {
  const int32_t* data;
  bool heads;
  int64_t num_heads, rows, k;

  explicit Rows(const Tensor& p)
      : data(p.ptr<int32_t>()), heads(p.ndim == 3), num_heads(p.ndim == 3 ? p.shape[0] : 1),
        rows(p.shape[p.ndim - 2]), k(p.shape[p.ndim - 1]) {}
  int64_t flat_rows() const { return num_heads * rows; }
  const int32_t* row(int64_t r) const { return data + r * k; }
  std::string label(int64_t r) const {
    return heads ? detail::concat("positions[", r / rows, ", ", r % rows, "]")
                 : detail::concat("positions[", r, "]");
  }
  std::string entry(int64_t r, int64_t e) const {
    return heads ? detail::concat("positions[", r / rows, ", ", r % rows, ", ", e, "]")
                 : detail::concat("positions[", r, ", ", e, "]");
  }
};

// Every entry -1 or in [0, n) (`unit` names n), then no position repeated in a row: the first
// out-of-range entry in row-major order, else the first row with a repeat and its smallest
// repeated position.
void check_positions(const Rows& p, int64_t n, const std::string& unit) {
  for (int64_t r = 0; r < p.flat_rows(); ++r)
    for (int64_t e = 0; e < p.k; ++e) {
      const int64_t v = p.row(r)[e];
      MSA_CHECK(v >= -1 && v < n, "positions: id ", v, " at ", p.label(r), " entry ", e,
                " is outside [-1, ", n, ") (", n, " ", unit, ")");
    }
  std::vector<int32_t> s;
  for (int64_t r = 0; r < p.flat_rows(); ++r) {
    s.assign(p.row(r), p.row(r) + p.k);
    s.erase(std::remove(s.begin(), s.end(), -1), s.end());
    std::sort(s.begin(), s.end());
    const auto dup = std::adjacent_find(s.begin(), s.end());
    MSA_CHECK(dup == s.end(), "positions: id ", *dup, " is repeated in the row at ", p.label(r));
  }
}

}  // namespace

void token_sparse_kv_indices(const TokenSparseKvIndicesArgs& a) {
  const Rows p(a.positions);
  const int32_t* req = a.requests.ptr<int32_t>();
  const int32_t* table = a.block_table.ptr<int32_t>();
  const int64_t batch = a.block_table.shape[0], width = a.block_table.shape[1];
  const int64_t ld = a.block_table.strides[0], ps = a.page_size, n = width * ps;
  check_positions(p, n, detail::concat("block_table's ", width, " pages of ", ps, " slots"));
  for (int64_t t = 0; t < p.rows; ++t)
    MSA_CHECK(req[t] >= 0 && req[t] < batch, "requests[", t, "] = ", req[t], ": must be in [0, ",
              batch, ") (the requests of block_table)");
  const int32_t* lens = a.seq_lens.defined() ? a.seq_lens.ptr<int32_t>() : nullptr;
  if (lens) {
    for (int64_t b = 0; b < batch; ++b)
      MSA_CHECK(lens[b] >= 0 && lens[b] <= n, "seq_lens[", b, "] = ", lens[b], ": must be in [0, ",
                n, "] (block_table's ", width, " pages of ", ps, ")");
    for (int64_t r = 0; r < p.flat_rows(); ++r) {
      const int32_t b = req[r % p.rows];
      for (int64_t e = 0; e < p.k; ++e)
        MSA_CHECK(p.row(r)[e] < lens[b], p.entry(r, e), " = ", p.row(r)[e], ": at or past seq_lens[",
                  b, "] = ", lens[b], ", the length of the row's request");
    }
  }
  // The page of each used position; negative ids first (all of them), then ids whose slots do
  // not fit int32.
  const auto page_of = [&](int64_t r, int64_t e) {
    return table[req[r % p.rows] * ld + p.row(r)[e] / ps];
  };
  for (int64_t r = 0; r < p.flat_rows(); ++r)
    for (int64_t e = 0; e < p.k; ++e)
      if (p.row(r)[e] >= 0)
        MSA_CHECK(page_of(r, e) >= 0, "block_table[", req[r % p.rows], ", ", p.row(r)[e] / ps,
                  "] = ", page_of(r, e), ": the page of ", p.entry(r, e), " = ", p.row(r)[e],
                  " must be a page id >= 0");
  const int64_t max_page = (int64_t(INT32_MAX) - (ps - 1)) / ps;
  for (int64_t r = 0; r < p.flat_rows(); ++r)
    for (int64_t e = 0; e < p.k; ++e)
      if (p.row(r)[e] >= 0)
        MSA_CHECK(page_of(r, e) <= max_page, "block_table: page id ", page_of(r, e), " x page_size ",
                  ps, " does not fit an int32 slot index (", p.entry(r, e), ")");
  int32_t* out = a.slots.ptr<int32_t>();
  for (int64_t r = 0; r < p.flat_rows(); ++r)
    for (int64_t e = 0; e < p.k; ++e) {
      const int64_t v = p.row(r)[e];
      out[r * p.k + e] = v < 0 ? -1 : int32_t(int64_t(page_of(r, e)) * ps + v % ps);
    }
}

void group_union_masks(const GroupUnionMasksArgs& a) {
  const Rows p(a.positions);
  check_positions(p, INT32_MAX, "int32 key positions");
  const int32_t* cu = a.cu_seqlens_q.ptr<int32_t>();
  const int64_t batch = a.cu_seqlens_q.shape[0] - 1;
  MSA_CHECK(cu[0] == 0, "cu_seqlens_q: must start at 0, got cu_seqlens_q[0] = ", cu[0]);
  for (int64_t b = 0; b < batch; ++b)
    MSA_CHECK(cu[b] <= cu[b + 1], "cu_seqlens_q: must be non-decreasing, got cu_seqlens_q[", b,
              "] = ", cu[b], " > cu_seqlens_q[", b + 1, "] = ", cu[b + 1]);
  MSA_CHECK(cu[batch] == p.rows, "cu_seqlens_q[-1] = ", cu[batch], ": must equal the rows of "
            "positions (", p.rows, ")");
  const int64_t g = a.group_size, cap_groups = a.group_rows.shape[0] - 1;
  const int64_t u_cap = a.union_keys.shape[a.union_keys.ndim - 1];
  std::vector<int64_t> starts;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t s = cu[b]; s < cu[b + 1]; s += g) starts.push_back(s);
  const int64_t groups = int64_t(starts.size());
  MSA_CHECK(groups <= cap_groups, "group_rows: the requests form ", groups, " groups of ",
            "group_size ", g, ", more than the ", cap_groups, " the outputs hold (union_keys' G)");
  starts.resize(cap_groups + 1, p.rows);  // the groups past the last hold no row
  // Each group's union, sorted; the largest over every head and group, and the first too large.
  std::vector<std::vector<int32_t>> unions(p.num_heads * cap_groups);
  int64_t largest = 0, first_h = -1, first_g = -1;
  for (int64_t h = 0; h < p.num_heads; ++h)
    for (int64_t i = 0; i < cap_groups; ++i) {
      auto& u = unions[h * cap_groups + i];
      for (int64_t t = starts[i]; t < starts[i + 1]; ++t)
        for (int64_t e = 0; e < p.k; ++e)
          if (p.row(h * p.rows + t)[e] >= 0) u.push_back(p.row(h * p.rows + t)[e]);
      std::sort(u.begin(), u.end());
      u.erase(std::unique(u.begin(), u.end()), u.end());
      largest = std::max<int64_t>(largest, int64_t(u.size()));
      if (int64_t(u.size()) > u_cap && first_h < 0) first_h = h, first_g = i;
    }
  MSA_CHECK(largest <= u_cap, "max_union = ", u_cap, ": a group's union has ", largest,
            " keys (the first past it: kv head ", first_h, ", group ", first_g, ")");
  int32_t* keys = a.union_keys.ptr<int32_t>();
  int32_t* lens = a.union_lens.ptr<int32_t>();
  int32_t* grows = a.group_rows.ptr<int32_t>();
  for (int64_t i = 0; i <= cap_groups; ++i) grows[i] = int32_t(starts[i]);
  const bool packed = a.mask.dtype == DType::u8;
  const int64_t mask_cols = packed ? (u_cap + 7) / 8 : u_cap;
  uint8_t* mask = static_cast<uint8_t*>(a.mask.data);
  if (p.num_heads * p.rows * mask_cols > 0) std::memset(mask, 0, size_t(p.num_heads * p.rows * mask_cols));
  for (int64_t h = 0; h < p.num_heads; ++h)
    for (int64_t i = 0; i < cap_groups; ++i) {
      const auto& u = unions[h * cap_groups + i];
      int32_t* out = keys + (h * cap_groups + i) * u_cap;
      std::fill(out, out + u_cap, -1);
      std::copy(u.begin(), u.end(), out);
      lens[h * cap_groups + i] = int32_t(u.size());
      for (int64_t t = starts[i]; t < starts[i + 1]; ++t) {
        uint8_t* m = mask + (h * p.rows + t) * mask_cols;
        for (int64_t e = 0; e < p.k; ++e) {
          const int32_t v = p.row(h * p.rows + t)[e];
          if (v < 0) continue;
          const int64_t j = std::lower_bound(u.begin(), u.end(), v) - u.begin();
          if (packed) m[j / 8] = uint8_t(m[j / 8] | (1u << (j % 8)));
          else m[j] = 1;
        }
      }
    }
}

}  // namespace msa::cpu
