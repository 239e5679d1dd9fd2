// Public mqa_logits, paged_mqa_logits and token_topk (include/msa/logits.h): check every argument
// on the host (for CPU tensors the ranges', lengths' and block ids' values too; CUDA checks those
// on the device), then run the CPU reference or the CUDA kernels.
#include "msa/logits.h"

#include <algorithm>
#include <climits>
#include <vector>

#include "api/validate.h"
#include "backend.h"

namespace msa {
namespace {

// What the CUDA kernels read with 16-byte loads (TMA boxes of 128-byte rows): the data and the
// given byte strides multiples of 16.
void check_rows_16b(const Tensor& t, const char* name, std::initializer_list<int> dims) {
  MSA_CHECK(reinterpret_cast<uintptr_t>(t.data) % 16 == 0, name,
            ": must be 16-byte aligned on CUDA, got ", t.describe());
  for (int d : dims)
    MSA_CHECK(t.strides[d] % 16 == 0 && t.strides[d] > 0, name, ": stride of dim ", d,
              " must be a positive multiple of 16 bytes on CUDA, got ", t.describe());
}

// The head count and head dim the CUDA kernels take.
void check_cuda_heads(const char* op, int64_t heads, int64_t dim) {
  MSA_CHECK(dim == 128, op, ": CUDA takes head dim 128 so far, got ", dim);
  MSA_CHECK(heads <= 128, op, ": CUDA takes up to 128 heads, got ", heads);
}

// ks / ke: [T] int32, 0 <= ks[t] <= ke[t] <= S.
void check_ranges(const Tensor& ks_t, const Tensor& ke_t, int64_t t_rows, int64_t s_keys) {
  for (const auto& [t, name] : {std::pair{&ks_t, "ks"}, std::pair{&ke_t, "ke"}}) {
    check_defined(*t, name);
    check_dtype(*t, name, {DType::i32});
    check_shape(*t, name, {t_rows});
    check_contiguous(*t, name);
  }
  const int32_t* ks = ks_t.ptr<int32_t>();
  const int32_t* ke = ke_t.ptr<int32_t>();
  for (int64_t t = 0; t < t_rows; ++t)
    MSA_CHECK(0 <= ks[t] && ks[t] <= ke[t] && ke[t] <= s_keys, "ks, ke: row ", t,
              " must satisfy 0 <= ks <= ke <= S (", s_keys, "), got [", ks[t], ", ", ke[t], ")");
}

}  // namespace

namespace {

// The ragged logits' inputs (everything but the output), in the order the checks run.
struct Dims {
  int64_t rows, keys;
};
Dims check_mqa_inputs(const MqaLogitsArgs& a) {
  const Tensor& q = a.q.values;
  check_defined(q, "q");
  check_dtype(q, "q", {DType::fp8_e4m3, DType::bf16});
  check_ndim(q, "q", 3);
  check_last_dim_contiguous(q, "q");
  MSA_CHECK(!a.q.scale.defined(), "q.scale: must be absent (fold the query scale into weights)");
  const int64_t t_rows = q.shape[0], heads = q.shape[1], dim = q.shape[2];
  MSA_CHECK(heads >= 1 && dim >= 1, "q: needs at least one head and one element, got ",
            q.describe());

  const Tensor& k = a.k.values;
  check_defined(k, "k");
  check_dtype(k, "k", {q.dtype});
  check_ndim(k, "k", 2);
  check_last_dim_contiguous(k, "k");
  MSA_CHECK(k.shape[1] == dim, "k: must be [S, ", dim, "] (q's head dim), got ", k.describe());
  const int64_t s_keys = k.shape[0];
  if (a.k.scale.defined()) {
    MSA_CHECK(k.dtype == DType::fp8_e4m3, "k.scale: only fp8_e4m3 keys take a scale");
    check_dtype(a.k.scale, "k.scale", {DType::f32});
    check_shape(a.k.scale, "k.scale", {s_keys});
    check_contiguous(a.k.scale, "k.scale");
  }

  check_defined(a.weights, "weights");
  check_dtype(a.weights, "weights", {DType::f32});
  check_shape(a.weights, "weights", {t_rows, heads});
  check_last_dim_contiguous(a.weights, "weights");
  return {t_rows, s_keys};
}

// The ranges and what CUDA takes (the CPU checks the ranges' values instead); after the output.
void check_mqa_device(const MqaLogitsArgs& a, const Device& device, Dims d, const char* op) {
  const Tensor& q = a.q.values;
  if (device.type == DeviceType::cuda) {
    for (const auto& [t, name] : {std::pair{&a.ks, "ks"}, std::pair{&a.ke, "ke"}}) {
      check_defined(*t, name);
      check_dtype(*t, name, {DType::i32});
      check_shape(*t, name, {d.rows});
      check_contiguous(*t, name);
    }
    MSA_CHECK(q.dtype == DType::fp8_e4m3, "q: CUDA ", op, " takes fp8_e4m3 q and k (bf16 runs on "
              "the CPU only so far), got ", dtype_name(q.dtype));
    check_cuda_heads(op, q.shape[1], q.shape[2]);
    MSA_CHECK(d.rows < INT32_MAX && d.keys < INT32_MAX, op, ": CUDA takes fewer than 2^31 "
              "rows and keys, got ", q.describe(), " and ", a.k.values.describe());
    check_rows_16b(q, "q", {0, 1});
    check_rows_16b(a.k.values, "k", {0});
    api::check_status_arg(a.status, device, op);
    return;
  }
  check_ranges(a.ks, a.ke, d.rows, d.keys);
}

// token_topk's ids and topk.
void check_ids(const Tensor& ids, int64_t rows, int topk) {
  MSA_CHECK(topk >= 1, "topk: must be >= 1, got ", topk);
  check_defined(ids, "ids");
  check_dtype(ids, "ids", {DType::i32});
  check_shape(ids, "ids", {rows, int64_t(topk)});
  check_contiguous(ids, "ids");
}

// token_topk's CUDA bounds: positions are int32 ids, and the kernel's position arithmetic stays
// below 2^31 with room for one step of 2048.
void check_topk_cuda_shape(int64_t rows, int64_t cols, const char* op) {
  MSA_CHECK(rows < INT32_MAX && cols <= INT32_MAX - 8192, op, ": CUDA takes fewer than 2^31 rows "
            "and at most 2^31 - 8193 columns, got ", rows, " rows of ", cols);
}

}  // namespace

void mqa_logits(const MqaLogitsArgs& a, cudaStream_t stream) {
  const Device device =
      api::common_device("mqa_logits", {{&a.q.values, "q"}, {&a.q.scale, "q.scale"}, {&a.k.values, "k"},
                                   {&a.k.scale, "k.scale"}, {&a.weights, "weights"}, {&a.ks, "ks"},
                                   {&a.ke, "ke"}, {&a.logits, "logits"}});
  const Dims d = check_mqa_inputs(a);
  check_defined(a.logits, "logits");
  check_dtype(a.logits, "logits", {DType::f32});
  check_shape(a.logits, "logits", {d.rows, d.keys});
  check_last_dim_contiguous(a.logits, "logits");
  check_mqa_device(a, device, d, "mqa_logits");
  if (device.type == DeviceType::cuda) return cuda::mqa_logits(a, stream);
  cpu::mqa_logits(a);
}

void token_topk(const TokenTopKArgs& a, cudaStream_t stream) {
  const Device device = api::common_device(
      "token_topk", {{&a.logits, "logits"}, {&a.ks, "ks"}, {&a.ke, "ke"}, {&a.ids, "ids"}});
  check_defined(a.logits, "logits");
  check_dtype(a.logits, "logits", {DType::f32});
  check_ndim(a.logits, "logits", 2);
  check_last_dim_contiguous(a.logits, "logits");
  const int64_t rows = a.logits.shape[0], s_keys = a.logits.shape[1];
  MSA_CHECK(a.ks.defined() == a.ke.defined(), "ks, ke: give both or neither");
  check_ids(a.ids, rows, a.topk);
  if (device.type == DeviceType::cuda) {
    if (a.ks.defined()) {
      for (const auto& [t, name] : {std::pair{&a.ks, "ks"}, std::pair{&a.ke, "ke"}}) {
        check_dtype(*t, name, {DType::i32});
        check_shape(*t, name, {rows});
        check_contiguous(*t, name);
      }
    }
    check_topk_cuda_shape(rows, s_keys, "token_topk");
    MSA_CHECK(reinterpret_cast<uintptr_t>(a.logits.data) % 4 == 0 && a.logits.strides[0] >= 0,
              "logits: must be 4-byte aligned with a non-negative row stride on CUDA, got ",
              a.logits.describe());
    api::check_status_arg(a.status, device, "token_topk");
    return cuda::token_topk(a, stream);
  }
  if (a.ks.defined()) check_ranges(a.ks, a.ke, rows, s_keys);
  cpu::token_topk(a);
}

namespace {

struct PagedDims {
  int64_t batch, next_n, heads, dim, block_size, num_blocks;
};
// The paged logits' inputs (everything but the output), in the order the checks run.
PagedDims check_paged_inputs(const PagedMqaLogitsArgs& a) {
  const Tensor& q = a.q;
  check_defined(q, "q");
  check_dtype(q, "q", {DType::fp8_e4m3, DType::fp4x2});
  check_ndim(q, "q", 4);
  check_last_dim_contiguous(q, "q");
  const bool fp4 = q.dtype == DType::fp4x2;
  const int64_t batch = q.shape[0], next_n = q.shape[1], heads = q.shape[2];
  const int64_t dim = api::logical_last_dim(q, "q");
  MSA_CHECK(next_n >= 1 && heads >= 1 && dim >= 1, "q: must be [B, next_n >= 1, H >= 1, D >= 1], "
            "got ", q.describe());
  if (fp4) {
    MSA_CHECK(dim % 32 == 0, "q: FP4 head dim ", dim, " must be a multiple of 32 (MXFP4 groups)");
    check_defined(a.q_sf, "q_sf");
    check_dtype(a.q_sf, "q_sf", {DType::e8m0, DType::u8});
    check_shape(a.q_sf, "q_sf", {batch, next_n, heads, dim / 32});
    check_last_dim_contiguous(a.q_sf, "q_sf");
  } else {
    MSA_CHECK(!a.q_sf.defined(), "q_sf: FP4 q only (FP8 q takes no scale)");
  }
  const Tensor& kv = a.kv_fused;
  check_defined(kv, "kv_fused");
  check_dtype(kv, "kv_fused", {DType::u8});
  check_ndim(kv, "kv_fused", 4);
  // A token's bytes: its values, then its scales (FP8: one f32; FP4: one e8m0 per 32 values).
  int64_t token_bytes = 0;
  MSA_CHECK(!__builtin_add_overflow(fp4 ? dim / 2 : dim, fp4 ? dim / 32 : 4, &token_bytes),
            "q: head dim ", dim, " is too large for a kv_fused row, got ", q.describe());
  MSA_CHECK(kv.shape[2] == 1 && kv.shape[3] == token_bytes && kv.shape[1] >= 1,
            "kv_fused: must be [num_blocks, block_size, 1, ", fp4 ? "D / 2 + D / 32" : "D + 4",
            " = ", token_bytes, "], got ", kv.describe());
  MSA_CHECK(kv.strides[3] == 1 && kv.strides[1] == token_bytes, "kv_fused: each block's bytes must "
            "be contiguous (values, then scales), got ", kv.describe());
  const int64_t block_size = kv.shape[1], num_blocks = kv.shape[0];
  check_defined(a.weights, "weights");
  check_dtype(a.weights, "weights", {DType::f32});
  check_shape(a.weights, "weights", {batch * next_n, heads});
  check_last_dim_contiguous(a.weights, "weights");
  check_defined(a.seq_lens, "seq_lens");
  check_dtype(a.seq_lens, "seq_lens", {DType::i32});
  check_shape(a.seq_lens, "seq_lens", {batch});
  check_defined(a.block_tables, "block_tables");
  check_dtype(a.block_tables, "block_tables", {DType::i32});
  check_ndim(a.block_tables, "block_tables", 2);
  MSA_CHECK(a.block_tables.shape[0] == batch, "block_tables: must have B = ", batch, " rows, got ",
            a.block_tables.describe());
  check_last_dim_contiguous(a.block_tables, "block_tables");
  MSA_CHECK(a.max_seq_len >= 0, "max_seq_len: must be >= 0, got ", a.max_seq_len);
  return {batch, next_n, heads, dim, block_size, num_blocks};
}

// What CUDA takes, or (CPU) the lengths', tables' and block ids' values; after the output.
void check_paged_device(const PagedMqaLogitsArgs& a, const Device& device, const PagedDims& d,
                        const char* op) {
  const Tensor& q = a.q;
  const Tensor& kv = a.kv_fused;
  const bool fp4 = q.dtype == DType::fp4x2;
  const int64_t batch = d.batch, next_n = d.next_n, heads = d.heads, dim = d.dim;
  const int64_t block_size = d.block_size, num_blocks = d.num_blocks;
  if (device.type == DeviceType::cuda) {
    check_cuda_heads(op, heads, dim);
    if (fp4)  // rows b * next_n + t index q_sf as q (the FP4 kernels read both per row)
      MSA_CHECK(a.q_sf.strides[0] == next_n * a.q_sf.strides[1], "q_sf: CUDA needs the B and "
                "next_n dims of q_sf to merge (stride[0] = next_n * stride[1]), got ",
                a.q_sf.describe());
    MSA_CHECK(block_size == 32 || block_size == 64 || block_size == 128, "kv_fused: CUDA takes "
              "block sizes 32, 64 and 128, got ", block_size);
    MSA_CHECK(q.strides[0] == next_n * q.strides[1], "q: CUDA needs the B and next_n dims of q to "
              "merge (stride[0] = next_n * stride[1]), got ", q.describe());
    MSA_CHECK(batch * next_n < INT32_MAX && a.max_seq_len < INT32_MAX && num_blocks < INT32_MAX,
              op, ": CUDA takes fewer than 2^31 rows, columns and pool blocks");
    check_rows_16b(q, "q", {1, 2});
    check_rows_16b(kv, "kv_fused", {0});
    api::check_status_arg(a.status, device, op);
    return;
  }
  // What the seed leaves undefined is an error here: lengths past max_seq_len, a table too
  // narrow for a length, block ids outside the pool.
  const Tensor& bt = a.block_tables;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t len = a.seq_lens.ptr<int32_t>()[b * a.seq_lens.strides[0]];
    MSA_CHECK(len >= 0 && len <= a.max_seq_len, "seq_lens: entry ", b, " must be in [0, max_seq_len = ",
              a.max_seq_len, "], got ", len);
    const int64_t used = msa::num_blocks(len, block_size);
    MSA_CHECK(used <= bt.shape[1], "block_tables: ", bt.shape[1], " columns cannot hold batch ", b,
              "'s ", len, " keys (", used, " blocks of ", block_size, ")");
    for (int64_t c = 0; c < used; ++c) {
      const int32_t id = bt.ptr<int32_t>()[b * bt.strides[0] + c];
      MSA_CHECK(id >= 0 && id < num_blocks, "block_tables: block id ", id, " out of range [0, ",
                num_blocks, ") at (batch ", b, ", column ", c, ")");
    }
  }
}

}  // namespace

void paged_mqa_logits(const PagedMqaLogitsArgs& a, cudaStream_t stream) {
  const Device device = api::common_device(
      "paged_mqa_logits", {{&a.q, "q"}, {&a.q_sf, "q_sf"}, {&a.kv_fused, "kv_fused"},
                           {&a.weights, "weights"}, {&a.block_tables, "block_tables"},
                           {&a.seq_lens, "seq_lens"}, {&a.logits, "logits"}});
  const PagedDims d = check_paged_inputs(a);
  check_defined(a.logits, "logits");
  check_dtype(a.logits, "logits", {DType::f32});
  check_ndim(a.logits, "logits", 2);
  check_last_dim_contiguous(a.logits, "logits");
  MSA_CHECK(a.logits.shape[0] == d.batch * d.next_n && a.logits.shape[1] >= a.max_seq_len,
            "logits: must be [B * next_n = ", d.batch * d.next_n, ", >= max_seq_len = ", a.max_seq_len,
            "], got ", a.logits.describe());
  check_paged_device(a, device, d, "paged_mqa_logits");
  if (device.type == DeviceType::cuda) return cuda::paged_mqa_logits(a, stream);
  cpu::paged_mqa_logits(a);
}

namespace {

// One workspace row of logits `cols` wide: 16-byte aligned rows (the kernels' vector stores).
int64_t logits_row_bytes(int64_t cols) { return std::max<int64_t>(16, (cols * 4 + 15) / 16 * 16); }

// The rows a chunk of the logits + top-K ops takes: 2048 keep the logits kernels at several
// waves of CTAs (ragged, 64 heads: 4 tokens a CTA, 512 CTAs on 132 SMs).
constexpr int64_t kChunkRows = 2048;
// The CPU's chunk: at most 4M logits (16 MB) at a time.
constexpr int64_t kCpuChunkLogits = int64_t(1) << 22;

// Rows of the CUDA workspace a chunk takes, a multiple of `unit` (a paged chunk is whole batches).
int64_t workspace_rows(const Tensor& ws, int64_t cols, int64_t unit, const char* op) {
  check_defined(ws, "workspace");
  check_dtype(ws, "workspace", {DType::u8});
  check_ndim(ws, "workspace", 1);
  check_contiguous(ws, "workspace");
  MSA_CHECK(reinterpret_cast<uintptr_t>(ws.data) % 16 == 0, "workspace: must be 16-byte aligned, got ",
            ws.describe());
  const int64_t row = logits_row_bytes(cols), rows = ws.shape[0] / row;
  MSA_CHECK(rows >= unit, "workspace: ", op, " needs at least ", unit * row, " bytes (", unit,
            " row(s) of ", cols, " f32 logits, each padded to 16 bytes), got ", ws.describe(), "; ",
            op, "_workspace_bytes gives the size that keeps the GPU busy");
  return rows / unit * unit;
}

// Rows [r0, r0 + n) of t (dim 0).
Tensor rows_of(const Tensor& t, int64_t r0, int64_t n) {
  Tensor v = t;
  v.data = static_cast<uint8_t*>(t.data) + r0 * t.strides[0] * int64_t(dtype_size(t.dtype));
  v.shape[0] = n;
  return v;
}

// n rows of `cols` f32 logits at `data`, rows logits_row_bytes apart.
Tensor logits_rows(void* data, int64_t n, int64_t cols, const Device& device) {
  return Tensor(data, DType::f32, std::vector<int64_t>{n, cols},
                std::vector<int64_t>{logits_row_bytes(cols) / 4, 1}, device);
}

// Where a call's chunks of logits live: the workspace (required on CUDA), or, on the CPU without
// one, a buffer of its own of about kCpuChunkLogits. `rows` a multiple of `unit` (a paged chunk
// is whole batches).
struct ChunkBuffer {
  int64_t rows = 0;
  void* workspace = nullptr;
  std::vector<float> own;
  void* data() { return own.empty() ? workspace : own.data(); }
};
ChunkBuffer chunk_buffer(const Tensor& ws, int64_t cols, int64_t unit, int64_t total_rows, bool cuda,
                         const char* op) {
  ChunkBuffer b;
  if (cuda || ws.defined()) {
    b.rows = workspace_rows(ws, cols, unit, op);
    b.workspace = ws.data;
    return b;
  }
  b.rows = std::max<int64_t>(1, kCpuChunkLogits / std::max<int64_t>(1, cols * unit)) * unit;
  b.own.resize(size_t(std::min(b.rows, total_rows) * logits_row_bytes(cols) / 4));
  return b;
}

// token_topk over one chunk's logits into its rows of ids; `base` its first row in the call.
void chunk_topk(const Tensor& logits, const Tensor& ks, const Tensor& ke, int topk, const Tensor& ids,
                const Tensor& status, bool cuda, cudaStream_t stream, int64_t base) {
  TokenTopKArgs t;
  t.logits = logits;
  t.ks = ks;
  t.ke = ke;
  t.topk = topk;
  t.ids = ids;
  t.status = status;
  if (cuda) cuda::token_topk(t, stream, base);
  else cpu::token_topk(t);
}

}  // namespace

int64_t mqa_logits_topk_workspace_bytes(int64_t rows, int64_t keys) {
  MSA_CHECK(rows >= 0 && keys >= 0, "mqa_logits_topk_workspace_bytes: rows and keys must be >= 0, "
            "got ", rows, " and ", keys);
  return std::max<int64_t>(1, std::min(rows, kChunkRows)) * logits_row_bytes(keys);
}

void mqa_logits_topk(const MqaLogitsTopKArgs& a, cudaStream_t stream) {
  const char* op = "mqa_logits_topk";
  const Device device = api::common_device(
      op, {{&a.q.values, "q"}, {&a.q.scale, "q.scale"}, {&a.k.values, "k"}, {&a.k.scale, "k.scale"},
           {&a.weights, "weights"}, {&a.ks, "ks"}, {&a.ke, "ke"}, {&a.ids, "ids"},
           {&a.workspace, "workspace"}});
  MqaLogitsArgs la;
  la.q = a.q;
  la.k = a.k;
  la.weights = a.weights;
  la.ks = a.ks;
  la.ke = a.ke;
  la.clean_logits = false;  // the top-K reads each row's range only
  la.status = a.status;
  const Dims d = check_mqa_inputs(la);
  check_ids(a.ids, d.rows, a.topk);
  check_mqa_device(la, device, d, op);
  const bool cuda = device.type == DeviceType::cuda;
  if (cuda) check_topk_cuda_shape(d.rows, d.keys, op);
  ChunkBuffer buf = chunk_buffer(a.workspace, d.keys, 1, d.rows, cuda, op);
  for (int64_t r0 = 0; r0 < d.rows; r0 += buf.rows) {
    const int64_t n = std::min(buf.rows, d.rows - r0);
    MqaLogitsArgs c = la;
    c.q.values = rows_of(a.q.values, r0, n);
    c.weights = rows_of(a.weights, r0, n);
    c.ks = rows_of(a.ks, r0, n);
    c.ke = rows_of(a.ke, r0, n);
    c.logits = logits_rows(buf.data(), n, d.keys, device);
    if (cuda) cuda::mqa_logits(c, stream, r0);
    else cpu::mqa_logits(c);
    chunk_topk(c.logits, c.ks, c.ke, a.topk, rows_of(a.ids, r0, n), a.status, cuda, stream, r0);
  }
}

int64_t paged_mqa_logits_topk_workspace_bytes(int64_t batch, int64_t next_n, int64_t max_seq_len) {
  MSA_CHECK(batch >= 0 && next_n >= 1 && max_seq_len >= 0, "paged_mqa_logits_topk_workspace_bytes: "
            "needs batch >= 0, next_n >= 1, max_seq_len >= 0, got ", batch, ", ", next_n, ", ",
            max_seq_len);
  const int64_t batches = std::max<int64_t>(1, std::min(batch, (kChunkRows + next_n - 1) / next_n));
  return batches * next_n * logits_row_bytes(max_seq_len);
}

void paged_mqa_logits_topk(const PagedMqaLogitsTopKArgs& a, cudaStream_t stream) {
  const char* op = "paged_mqa_logits_topk";
  const Device device = api::common_device(
      op, {{&a.q, "q"}, {&a.q_sf, "q_sf"}, {&a.kv_fused, "kv_fused"}, {&a.weights, "weights"},
           {&a.block_tables, "block_tables"}, {&a.seq_lens, "seq_lens"}, {&a.ids, "ids"},
           {&a.workspace, "workspace"}});
  PagedMqaLogitsArgs la;
  la.q = a.q;
  la.q_sf = a.q_sf;
  la.kv_fused = a.kv_fused;
  la.weights = a.weights;
  la.block_tables = a.block_tables;
  la.seq_lens = a.seq_lens;
  la.max_seq_len = a.max_seq_len;
  la.clean_logits = true;  // the top-K reads whole rows: what a row does not see must be -inf
  la.status = a.status;
  const PagedDims d = check_paged_inputs(la);
  const int64_t rows = d.batch * d.next_n, cols = a.max_seq_len;
  check_ids(a.ids, rows, a.topk);
  check_paged_device(la, device, d, op);
  const bool cuda = device.type == DeviceType::cuda;
  if (cuda) check_topk_cuda_shape(rows, cols, op);
  ChunkBuffer buf = chunk_buffer(a.workspace, cols, d.next_n, rows, cuda, op);
  const int64_t chunk = buf.rows / d.next_n;  // whole batches
  for (int64_t b0 = 0; b0 < d.batch; b0 += chunk) {
    const int64_t nb = std::min(chunk, d.batch - b0);
    PagedMqaLogitsArgs c = la;
    c.q = rows_of(a.q, b0, nb);
    if (a.q_sf.defined()) c.q_sf = rows_of(a.q_sf, b0, nb);
    c.weights = rows_of(a.weights, b0 * d.next_n, nb * d.next_n);
    c.block_tables = rows_of(a.block_tables, b0, nb);
    c.seq_lens = rows_of(a.seq_lens, b0, nb);
    c.logits = logits_rows(buf.data(), nb * d.next_n, cols, device);
    if (cuda) cuda::paged_mqa_logits(c, stream, b0);
    else cpu::paged_mqa_logits(c);
    chunk_topk(c.logits, Tensor(), Tensor(), a.topk, rows_of(a.ids, b0 * d.next_n, nb * d.next_n),
               a.status, cuda, stream, b0 * d.next_n);
  }
}

}  // namespace msa
