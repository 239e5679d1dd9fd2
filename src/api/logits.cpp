// Public mqa_logits and token_topk (include/msa/logits.h): check every argument on the host (the
// key ranges' values too), then run the CPU reference (no CUDA kernels yet).
#include "msa/logits.h"

#include "api/validate.h"
#include "backend.h"

namespace msa {
namespace {

// These ops run on the CPU only so far, and their checks read the ranges and lengths: every
// tensor argument given must be a host tensor.
void require_cpu(const char* op, std::initializer_list<std::pair<const Tensor*, const char*>> args) {
  for (const auto& [t, name] : args)
    MSA_CHECK(!t->defined() || t->device.type == DeviceType::cpu, op, ": runs on the CPU only so "
              "far (its CUDA kernel is not written yet); got ", name, " on ",
              device_name(t->device));
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

void mqa_logits(const MqaLogitsArgs& a, cudaStream_t /*stream*/) {
  require_cpu("mqa_logits", {{&a.q.values, "q"}, {&a.q.scale, "q.scale"}, {&a.k.values, "k"},
                             {&a.k.scale, "k.scale"}, {&a.weights, "weights"}, {&a.ks, "ks"},
                             {&a.ke, "ke"}, {&a.logits, "logits"}});
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
  check_ranges(a.ks, a.ke, t_rows, s_keys);

  check_defined(a.logits, "logits");
  check_dtype(a.logits, "logits", {DType::f32});
  check_shape(a.logits, "logits", {t_rows, s_keys});
  check_last_dim_contiguous(a.logits, "logits");
  cpu::mqa_logits(a);
}

void token_topk(const TokenTopKArgs& a, cudaStream_t /*stream*/) {
  require_cpu("token_topk", {{&a.logits, "logits"}, {&a.ks, "ks"}, {&a.ke, "ke"}, {&a.ids, "ids"}});
  check_defined(a.logits, "logits");
  check_dtype(a.logits, "logits", {DType::f32});
  check_ndim(a.logits, "logits", 2);
  check_last_dim_contiguous(a.logits, "logits");
  const int64_t rows = a.logits.shape[0], s_keys = a.logits.shape[1];
  MSA_CHECK(a.ks.defined() == a.ke.defined(), "ks, ke: give both or neither");
  if (a.ks.defined()) check_ranges(a.ks, a.ke, rows, s_keys);
  MSA_CHECK(a.topk >= 1, "topk: must be >= 1, got ", a.topk);
  check_defined(a.ids, "ids");
  check_dtype(a.ids, "ids", {DType::i32});
  check_shape(a.ids, "ids", {rows, int64_t(a.topk)});
  check_contiguous(a.ids, "ids");
  cpu::token_topk(a);
}

void paged_mqa_logits(const PagedMqaLogitsArgs& a, cudaStream_t /*stream*/) {
  require_cpu("paged_mqa_logits", {{&a.q, "q"}, {&a.q_sf, "q_sf"}, {&a.kv_fused, "kv_fused"},
                                   {&a.weights, "weights"}, {&a.block_tables, "block_tables"},
                                   {&a.seq_lens, "seq_lens"}, {&a.logits, "logits"}});
  const Tensor& q = a.q;
  check_defined(q, "q");
  check_dtype(q, "q", {DType::fp8_e4m3, DType::fp4x2});
  check_ndim(q, "q", 4);
  check_last_dim_contiguous(q, "q");
  const bool fp4 = q.dtype == DType::fp4x2;
  const int64_t batch = q.shape[0], next_n = q.shape[1], heads = q.shape[2];
  const int64_t dim = fp4 ? 2 * q.shape[3] : q.shape[3];
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
  const int64_t token_bytes = fp4 ? dim / 2 + dim / 32 : dim + 4;
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
  check_defined(a.logits, "logits");
  check_dtype(a.logits, "logits", {DType::f32});
  check_ndim(a.logits, "logits", 2);
  check_last_dim_contiguous(a.logits, "logits");
  MSA_CHECK(a.logits.shape[0] == batch * next_n && a.logits.shape[1] >= a.max_seq_len,
            "logits: must be [B * next_n = ", batch * next_n, ", >= max_seq_len = ", a.max_seq_len,
            "], got ", a.logits.describe());
  // What the seed leaves undefined is an error here: lengths past max_seq_len, a table too
  // narrow for a length, block ids outside the pool.
  const Tensor& bt = a.block_tables;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t len = a.seq_lens.ptr<int32_t>()[b * a.seq_lens.strides[0]];
    MSA_CHECK(len >= 0 && len <= a.max_seq_len, "seq_lens: entry ", b, " must be in [0, max_seq_len = ",
              a.max_seq_len, "], got ", len);
    const int64_t used = (len + block_size - 1) / block_size;
    MSA_CHECK(used <= bt.shape[1], "block_tables: ", bt.shape[1], " columns cannot hold batch ", b,
              "'s ", len, " keys (", used, " blocks of ", block_size, ")");
    for (int64_t c = 0; c < used; ++c) {
      const int32_t id = bt.ptr<int32_t>()[b * bt.strides[0] + c];
      MSA_CHECK(id >= 0 && id < num_blocks, "block_tables: block id ", id, " out of range [0, ",
                num_blocks, ") at (batch ", b, ", column ", c, ")");
    }
  }
  cpu::paged_mqa_logits(a);
}

}  // namespace msa
