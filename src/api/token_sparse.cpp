// Public token_sparse_kv_indices and group_union_masks (include/msa/token_sparse.h): shapes,
// dtypes, devices and the capacities the caller chose are checked here on the host; the values
// (positions, requests, lengths, page ids, cu_seqlens_q, union sizes) by the backend: the CPU
// reference throws, CUDA reports through the status buffer.
#include "msa/token_sparse.h"

#include <climits>
#include <string>
#include <vector>

#include "api/validate.h"
#include "backend.h"

namespace msa {
namespace {

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t d = 0; d < shape.size(); ++d) s += (d ? ", " : "") + std::to_string(shape[d]);
  return s + "]";
}
std::vector<int64_t> shape_of(const Tensor& t) { return {t.shape, t.shape + t.ndim}; }

bool has_shape(const Tensor& t, const std::vector<int64_t>& shape) {
  bool same = t.ndim == int(shape.size());
  for (int d = 0; same && d < t.ndim; ++d) same = t.shape[d] == shape[d];
  return same;
}

// An int32 contiguous tensor of exactly `shape` (`what` spells it in the message).
void check_i32(const Tensor& t, const char* name, const std::vector<int64_t>& shape,
               const std::string& what) {
  check_defined(t, name);
  check_dtype(t, name, {DType::i32});
  MSA_CHECK(has_shape(t, shape), name, ": shape must be ", what, ", got ", t.describe());
  check_contiguous(t, name);
}

// positions [rows, K] or [Hkv, rows, K] int32, contiguous.
void check_positions(const Tensor& p) {
  check_defined(p, "positions");
  check_dtype(p, "positions", {DType::i32});
  MSA_CHECK(p.ndim == 2 || p.ndim == 3, "positions: must be [rows, K] or [Hkv, rows, K], got ",
            p.describe());
  check_contiguous(p, "positions");
}

// What both CUDA builders need of positions: the limit of the per-row repeat test (a hash set of
// the row in shared memory) and int32 flat row ids in the status words.
void check_cuda_positions(const Tensor& p, const char* op) {
  const int64_t k = p.shape[p.ndim - 1], rows = p.ndim == 3 ? p.shape[0] * p.shape[1] : p.shape[0];
  MSA_CHECK(k <= kTokenSparseMaxK, op, ": CUDA takes rows of up to K = ", kTokenSparseMaxK,
            " positions, got ", p.describe());
  MSA_CHECK(rows < INT32_MAX, op, ": CUDA takes fewer than 2^31 rows (kv heads x rows), got ",
            p.describe());
}

}  // namespace

void token_sparse_kv_indices(const TokenSparseKvIndicesArgs& a, cudaStream_t stream) {
  const char* op = "token_sparse_kv_indices";
  const Device device = api::common_device(
      op, {{&a.positions, "positions"}, {&a.requests, "requests"}, {&a.block_table, "block_table"},
           {&a.seq_lens, "seq_lens"}, {&a.slots, "slots"}});
  check_positions(a.positions);
  const int64_t rows = a.positions.shape[a.positions.ndim - 2];
  check_defined(a.requests, "requests");
  check_dtype(a.requests, "requests", {DType::i32});
  MSA_CHECK(a.requests.ndim == 1 && a.requests.shape[0] == rows, "requests: must have one entry "
            "per row of positions (", rows, "), got ", a.requests.describe());
  check_contiguous(a.requests, "requests");
  check_defined(a.block_table, "block_table");
  check_dtype(a.block_table, "block_table", {DType::i32});
  check_ndim(a.block_table, "block_table", 2);
  check_last_dim_contiguous(a.block_table, "block_table");
  MSA_CHECK(a.block_table.strides[0] >= 0, "block_table: row stride must be >= 0, got ",
            a.block_table.describe());
  const int64_t batch = a.block_table.shape[0];
  MSA_CHECK(a.page_size >= 1 && a.page_size < INT32_MAX, "page_size: must be in [1, 2^31 - 1], "
            "got ", a.page_size);
  if (a.seq_lens.defined()) {
    check_dtype(a.seq_lens, "seq_lens", {DType::i32});
    MSA_CHECK(a.seq_lens.ndim == 1 && a.seq_lens.shape[0] == batch, "seq_lens: must have one "
              "entry per request of block_table (", batch, "), got ", a.seq_lens.describe());
    check_contiguous(a.seq_lens, "seq_lens");
  }
  check_i32(a.slots, "slots", shape_of(a.positions), "positions' " + shape_text(shape_of(a.positions)));
  if (device.type == DeviceType::cuda) {
    check_cuda_positions(a.positions, op);
    api::check_status_arg(a.status, device, op);
    return cuda::token_sparse_kv_indices(a, stream);
  }
  cpu::token_sparse_kv_indices(a);
}

void group_union_masks(const GroupUnionMasksArgs& a, cudaStream_t stream) {
  const char* op = "group_union_masks";
  const Device device = api::common_device(
      op, {{&a.positions, "positions"}, {&a.cu_seqlens_q, "cu_seqlens_q"},
           {&a.union_keys, "union_keys"}, {&a.union_lens, "union_lens"},
           {&a.group_rows, "group_rows"}, {&a.mask, "mask"}});
  check_positions(a.positions);
  const Tensor& p = a.positions;
  const bool heads = p.ndim == 3;
  const int64_t rows = p.shape[p.ndim - 2], k = p.shape[p.ndim - 1];
  check_defined(a.cu_seqlens_q, "cu_seqlens_q");
  check_dtype(a.cu_seqlens_q, "cu_seqlens_q", {DType::i32});
  MSA_CHECK(a.cu_seqlens_q.ndim == 1 && a.cu_seqlens_q.shape[0] >= 1, "cu_seqlens_q: must be "
            "[B + 1] with B + 1 >= 1 entries, got ", a.cu_seqlens_q.describe());
  check_contiguous(a.cu_seqlens_q, "cu_seqlens_q");
  MSA_CHECK(a.group_size >= 1 && a.group_size < INT32_MAX, "group_size: must be in [1, 2^31 - 1], "
            "got ", a.group_size);
  check_defined(a.union_keys, "union_keys");
  MSA_CHECK(a.union_keys.ndim == p.ndim, "union_keys: must be ",
            heads ? "[Hkv, G, U]" : "[G, U]", " like positions ", shape_text(shape_of(p)), ", got ",
            a.union_keys.describe());
  const int64_t groups = a.union_keys.shape[p.ndim - 2], cap = a.union_keys.shape[p.ndim - 1];
  const std::vector<int64_t> lead(p.shape, p.shape + p.ndim - 2);
  auto with = [&](std::initializer_list<int64_t> tail) {
    std::vector<int64_t> s = lead;
    s.insert(s.end(), tail);
    return s;
  };
  const std::string hkv = heads ? "Hkv, " : "";
  check_i32(a.union_keys, "union_keys", with({groups, cap}), "[" + hkv + "G, U]");
  MSA_CHECK(cap <= a.group_size * k, "union_keys: U = ", cap, " (max_union) must be at most "
            "group_size x K = ", a.group_size * k, ", the largest union a group can have");
  check_i32(a.union_lens, "union_lens", with({groups}),
            shape_text(with({groups})) + " ([" + hkv + "G] of union_keys)");
  check_i32(a.group_rows, "group_rows", {groups + 1}, "[G + 1] = [" + std::to_string(groups + 1) + "]");
  check_defined(a.mask, "mask");
  check_dtype(a.mask, "mask", {DType::boolean, DType::u8});
  const bool packed = a.mask.dtype == DType::u8;
  const int64_t mask_cols = packed ? (cap + 7) / 8 : cap;
  const std::vector<int64_t> ms = with({rows, mask_cols});
  MSA_CHECK(has_shape(a.mask, ms), "mask: shape must be [", hkv, "rows, ", packed ? "ceil(U / 8)" : "U", "] = ",
            shape_text(ms), " (bool, or u8 bit-packed), got ", a.mask.describe());
  check_contiguous(a.mask, "mask");
  if (device.type == DeviceType::cuda) {
    check_cuda_positions(p, op);
    MSA_CHECK(cap <= kGroupUnionMaxU, op, ": CUDA takes max_union (U) up to ", kGroupUnionMaxU,
              ", got ", cap);
    MSA_CHECK(groups < INT32_MAX && a.cu_seqlens_q.shape[0] < INT32_MAX, op, ": CUDA takes fewer "
              "than 2^31 groups and requests, got ", groups, " and ", a.cu_seqlens_q.shape[0] - 1);
    api::check_status_arg(a.status, device, op);
    return cuda::group_union_masks(a, stream);
  }
  cpu::group_union_masks(a);
}

}  // namespace msa
