// Public attention entry points (msa/attention.h): validate every argument once (shared rules
// in api/validate.h and api/k2q.h), then dispatch to the CPU or the CUDA backend.
#include <cmath>
#include <vector>

#include "api/attention.h"
#include "api/k2q.h"
#include "api/validate.h"

namespace msa {
namespace {

// An optional [Hq, total_q] f32 output (lse, tlse).
void check_row_stat(const Tensor& t, const char* name, const ProblemShape& s, Device device) {
  check_dtype(t, name, {DType::f32});
  check_shape(t, name, {s.num_q_heads, s.total_q});
  check_contiguous(t, name);
  MSA_CHECK(t.device == device, name, ": must be on ", device_name(device), ", got ",
            device_name(t.device));
}

void check_params(const AttentionArgs& a) {
  const AttentionParams& p = a.params;
  MSA_CHECK(std::isfinite(p.softmax_scale) && p.softmax_scale >= 0.f,
            "params.softmax_scale: must be finite and >= 0 (0 means 1/sqrt(D)), got ",
            p.softmax_scale);
  MSA_CHECK(std::isfinite(p.temperature) && p.temperature >= 0.f,
            "params.temperature: must be finite and >= 0, got ", p.temperature);
  // tlse is written iff a temperature is set: one without the other is a caller mistake.
  MSA_CHECK(!a.tlse.defined() || p.temperature > 0.f,
            "tlse: given, so params.temperature must be > 0, got ", p.temperature);
  MSA_CHECK(a.tlse.defined() || p.temperature == 0.f, "params.temperature: is ", p.temperature,
            " (> 0), so tlse [Hq, total_q] f32 must be given");
  MSA_CHECK(!p.partial_dtype || *p.partial_dtype == DType::f32 || *p.partial_dtype == DType::bf16,
            "params.partial_dtype: must be f32 or bf16 (or absent), got ",
            dtype_name(p.partial_dtype.value_or(DType::f32)));
  MSA_CHECK(std::isfinite(p.soft_cap) && p.soft_cap >= 0.f,
            "params.soft_cap: must be finite and >= 0 (0 means no soft-cap), got ", p.soft_cap);
}

// causal_offset [B] int32 and key_mask [B or total_q, Lk_max] (msa/attention.h). Returns the
// mask's row kind made explicit (KeyMaskRows::from_shape resolved).
KeyMaskRows check_visibility_args(const AttentionArgs& a, const ProblemShape& s, Device device) {
  if (a.causal_offset.defined()) {
    const Tensor& c = a.causal_offset;
    MSA_CHECK(a.params.causal, "causal_offset: given, so params.causal must be true (the offset "
              "replaces the bottom-right causal rule; non-causal attention takes no offset)");
    check_dtype(c, "causal_offset", {DType::i32});
    check_shape(c, "causal_offset", {s.batch});
    check_contiguous(c, "causal_offset");
    MSA_CHECK(c.device == device, "causal_offset: must be on ", device_name(device), ", got ",
              device_name(c.device));
  }
  const Tensor& m = a.key_mask;
  if (!m.defined()) return a.key_mask_rows;
  check_dtype(m, "key_mask", {DType::boolean, DType::u8});
  check_ndim(m, "key_mask", 2);
  check_last_dim_contiguous(m, "key_mask");
  MSA_CHECK(m.device == device, "key_mask: must be on ", device_name(device), ", got ",
            device_name(m.device));
  KeyMaskRows rows = a.key_mask_rows;
  if (rows == KeyMaskRows::from_shape) {
    MSA_CHECK(m.shape[0] == s.batch || m.shape[0] == s.total_q, "key_mask: shape must be [B = ",
              s.batch, ", Lk_max] (per batch) or [total_q = ", s.total_q,
              ", Lk_max] (per query), got ", m.describe());
    MSA_CHECK(s.batch != s.total_q, "key_mask: ", m.describe(), " has B = total_q = ", s.batch,
              " rows, so it may be per batch or per query: set key_mask_rows to per_batch or "
              "per_query");
    rows = m.shape[0] == s.batch ? KeyMaskRows::per_batch : KeyMaskRows::per_query;
  } else if (rows == KeyMaskRows::per_batch) {
    check_shape(m, "key_mask", {s.batch, -1});
  } else {
    check_shape(m, "key_mask", {s.total_q, -1});
  }
  if (m.is_cuda()) return rows;  // key counts live on the device
  const std::vector<int64_t> lengths = host_key_lengths(a.kv, s);
  for (int64_t b = 0; b < s.batch; ++b)
    MSA_CHECK(lengths[b] <= m.shape[1], "key_mask: Lk_max = ", m.shape[1],
              " (its last dim) is less than the ", lengths[b], " keys of batch ", b);
  return rows;
}

// The call with its defaults made explicit (AttentionParams::partial_dtype, the key mask's row
// kind), so the backends never see them.
AttentionArgs with_defaults(const AttentionArgs& a, KeyMaskRows rows) {
  AttentionArgs r = a;
  if (!r.params.partial_dtype) r.params.partial_dtype = a.q.dtype == DType::f16 ? DType::f32 : DType::bf16;
  r.key_mask_rows = rows;
  return r;
}

// Every argument rule.
api::CheckedAttention check_attention_args(const AttentionArgs& a) {
  ProblemShape s = api::check_q_and_kv(QTensor(a.q, a.q_scale), a.kv, a.cu_seqlens_q,
                                       {DType::bf16, DType::f16, DType::fp8_e4m3},
                                       /*need_v=*/true, /*kv_may_be_quantized=*/true,
                                       a.params.kv_block_size);
  const Device device = a.q.device;
  api::check_scale_values(QTensor(a.q, a.q_scale), "q");
  api::check_kv_scale_values(a.kv, s);
  check_params(a);
  if (a.q2k.defined()) s.topk = api::check_q2k(a.q2k, s, device);
  if (a.k2q.row_ptr.defined() || a.k2q.q_idx.defined() || a.k2q.schedule.defined()) {
    MSA_CHECK(a.q2k.defined(), "k2q: given without q2k; the CSR index belongs to a sparse call "
              "(pass the q2k it was built from)");
    MSA_CHECK(s.kv_block_size > 1, "k2q: token-sparse attention (kv_block_size 1) takes q2k "
              "alone; the k2q index is built over blocks of 64 or 128 keys");
    api::check_k2q_index(a.k2q, "k2q", a.kv, s, device);
  }
  const Tensor& out = a.out;
  api::check_attention_out(out, a.q.dtype, s, device);
  if (a.lse.defined()) check_row_stat(a.lse, "lse", s, device);
  if (a.tlse.defined()) check_row_stat(a.tlse, "tlse", s, device);
  const KeyMaskRows rows = check_visibility_args(a, s, device);
  api::check_row_alignments(a.q, a.kv.k.values, a.kv.v.values, out, !a.q.is_cuda());
  if (a.q.is_cuda()) api::refuse_cpu_only_attention(a, "attention_forward", /*offsets=*/true);
  return {s, with_defaults(a, rows)};
}

}  // namespace

size_t attention_workspace_bytes(const AttentionArgs& a) {
  const api::CheckedAttention c = check_attention_args(a);
  return a.q.is_cuda() ? cuda::attention_workspace_bytes(c.args, c.shape) : 0;
}

namespace api {

CheckedAttention check_attention(const AttentionArgs& a) {
  CheckedAttention c = check_attention_args(a);
  if (c.args.q.is_cuda()) cuda::check_attention_supported(c.args, c.shape);
  return c;
}

void attention_forward(const AttentionArgs& a, cudaStream_t stream,
                       const cuda::WorkspaceSource& src) {
  attention_forward(check_attention_args(a), stream, src);
}

void attention_forward(const CheckedAttention& c, cudaStream_t stream,
                       const cuda::WorkspaceSource& src) {
  const ProblemShape& s = c.shape;
  const AttentionArgs& args = c.args;
  if (!args.q.is_cuda()) return cpu::attention_forward(args, s);
  if (args.workspace.defined()) {  // its size is checked against the backend's plan
    check_dtype(args.workspace, "workspace", {DType::u8});
    MSA_CHECK(args.workspace.device == args.q.device, "workspace: must be on ",
              device_name(args.q.device));
  }
  check_status_arg(args.status, args.q.device, "attention_forward");
  cuda::attention_forward(args, s, stream, src);
}

}  // namespace api

void attention_forward(const AttentionArgs& a, cudaStream_t stream) {
  api::attention_forward(a, stream, cuda::WorkspaceSource{});
}

}  // namespace msa
