// DecodePlan (msa/decode.h): plan() validates and records a decode batch shape; run() checks
// that its arguments fit that shape, then runs attention_forward semantics over the paged KV.
// The CPU backend needs no work list (workspace 0); the CUDA backend (src/cuda/sm90/decode/) plans a
// split-KV work list into the workspace and runs it without allocating or synchronizing.
#include <cmath>
#include <utility>

#include "api/validate.h"
#include "msa/decode.h"

namespace msa {
namespace {

#ifndef MSA_WITH_CUDA
[[noreturn]] void no_cuda_build() {
  fail("decode: CUDA tensors given, but msa was built without CUDA (configure with nvcc present "
       "or -DMSA_CUDA=ON)");
}
#endif

void check_decode_shape(const DecodeShape& s) {
  MSA_CHECK(s.batch >= 0, "decode shape: batch must be >= 0, got ", s.batch);
  MSA_CHECK(s.max_queries_per_request >= 1,
            "decode shape: max_queries_per_request must be >= 1, got ", s.max_queries_per_request);
  MSA_CHECK(s.num_q_heads > 0 && s.num_kv_heads > 0 && s.num_q_heads % s.num_kv_heads == 0,
            "decode shape: num_kv_heads (", s.num_kv_heads, ") must be > 0 and divide num_q_heads (",
            s.num_q_heads, ")");
  const int64_t g = s.num_q_heads / s.num_kv_heads;
  const bool cuda = s.device.type == DeviceType::cuda;
  MSA_CHECK(g <= 128, "decode shape: GQA group num_q_heads / num_kv_heads must be at most 128, got ",
            g);
  // CUDA takes every group this leaves (up to 128; sparse: 1, 2, 4, 8, 16, or any with one kv
  // head): a CTA's rows map to (query, head) for any group (query_of), and sparse plans whose
  // group does not divide 16, and all token-id plans, put one query with all its heads in a CTA
  // (cuda/sm90/decode/plan.cpp geometry).
  if (s.topk > 0) api::check_sparse_group(g, s.num_kv_heads, "decode shape (topk > 0)");
  MSA_CHECK(s.head_dim > 0, "decode shape: head_dim must be > 0, got ", s.head_dim);
  MSA_CHECK(s.page_size == 16 || s.page_size == 32 || s.page_size == 64 || s.page_size == 128 ||
                s.page_size == 256,
            "decode shape: page_size must be 16, 32, 64, 128 or 256, got ", s.page_size);
  MSA_CHECK(s.max_pages >= 0, "decode shape: max_pages must be >= 0, got ", s.max_pages);
  MSA_CHECK(s.layout == KVLayout::paged_nhd || s.layout == KVLayout::paged_hnd,
            "decode shape: layout must be paged_nhd or paged_hnd, got ", kv_layout_name(s.layout));
  MSA_CHECK(s.kv_dtype == DType::bf16 || s.kv_dtype == DType::f16 || s.kv_dtype == DType::fp8_e4m3 ||
                s.kv_dtype == DType::fp4x2,
            "decode shape: kv_dtype must be bf16, f16, fp8_e4m3 or fp4x2, got ",
            dtype_name(s.kv_dtype));
  MSA_CHECK(s.topk >= 0, "decode shape: topk must be >= 0 (0 = dense), got ", s.topk);
  // 1: q2k holds key ids (docs/semantics.md, Token-sparse attention); CUDA plans refuse requests
  // past the union bitmap's 65536 keys (plan.cpp build_work_list).
  MSA_CHECK(s.kv_block_size == 1 || s.kv_block_size == 64 || s.kv_block_size == 128,
            "decode shape: kv_block_size must be 1 (token ids), 64 or 128, got ", s.kv_block_size);
  if (cuda) {
    MSA_CHECK(s.head_dim == 64 || s.head_dim == 128 || s.head_dim == 256,
              "decode shape: CUDA decode takes head_dim 64, 128 or 256, got ", s.head_dim);
    // FP8 rows of 64 bytes fill half the 128-byte swizzled line the kernel's stages are built
    // of; NVFP4's producers convert 64-byte packed rows (D = 128) only.
    MSA_CHECK(s.kv_dtype != DType::fp8_e4m3 || s.head_dim != 64,
              "decode shape: CUDA decode takes fp8_e4m3 KV at head_dim 128 or 256, got head_dim 64 "
              "(bf16 and f16 KV take 64)");
    MSA_CHECK(s.kv_dtype != DType::fp4x2 || s.head_dim == 128,
              "decode shape: CUDA decode takes fp4x2 (NVFP4) KV at head_dim 128 only, got "
              "head_dim ", s.head_dim, " (bf16 and f16 KV take 64, 128 and 256)");
  }
}

// Decode-specific agreement between run()'s arguments and the planned shape; the general
// attention rules follow in attention_forward.
void check_matches_plan(const AttentionArgs& a, const DecodeShape& s) {
  const Tensor& q = a.q;
  check_defined(q, "q");
  check_ndim(q, "q", 3);
  MSA_CHECK(q.shape[1] == s.num_q_heads && q.shape[2] == s.head_dim, "q: shape must be [*, ",
            s.num_q_heads, ", ", s.head_dim, "] as planned, got ", q.describe());
  MSA_CHECK(a.kv.layout == s.layout, "kv.layout: planned ", kv_layout_name(s.layout), ", got ",
            kv_layout_name(a.kv.layout));
  const Tensor& k = a.kv.k.values;
  check_defined(k, "k");
  MSA_CHECK(k.dtype == s.kv_dtype, "k: dtype must be ", dtype_name(s.kv_dtype), " as planned, got ",
            dtype_name(k.dtype));
  check_ndim(k, "k", 4);
  const bool nhd = s.layout == KVLayout::paged_nhd;
  const int64_t page_size = nhd ? k.shape[1] : k.shape[2], heads = nhd ? k.shape[2] : k.shape[1];
  MSA_CHECK(page_size == s.page_size && heads == s.num_kv_heads &&
                api::logical_last_dim(k, "k") == s.head_dim,
            "k: page size, kv heads and head dim must be ", s.page_size, ", ", s.num_kv_heads,
            ", ", s.head_dim, " as planned, got ", k.describe());
  const Tensor& pt = a.kv.page_table;
  check_defined(pt, "page_table");
  check_ndim(pt, "page_table", 2);
  MSA_CHECK(pt.shape[0] == s.batch && pt.shape[1] == s.max_pages, "page_table: shape must be [",
            s.batch, ", ", s.max_pages, "] as planned, got ", pt.describe());
  MSA_CHECK(a.q2k.defined() == (s.topk > 0), "q2k: must be ",
            s.topk > 0 ? "given (planned sparse, topk > 0)" : "absent (planned dense, topk = 0)");
  if (a.q2k.defined()) {
    check_ndim(a.q2k, "q2k", 3);
    MSA_CHECK(a.q2k.shape[2] == s.topk, "q2k: topk (last dim) must be ", s.topk,
              " as planned, got ", a.q2k.describe());
  }
  MSA_CHECK(a.params.kv_block_size == s.kv_block_size, "params.kv_block_size: must be ",
            s.kv_block_size, " as planned, got ", a.params.kv_block_size);
  const Tensor& cu = a.cu_seqlens_q;
  api::check_cu_seqlens(cu, "cu_seqlens_q", s.batch, q.shape[0], q.device);
  if (cu.is_cuda()) return;
  for (int64_t b = 0; b < s.batch; ++b) {
    const int64_t n = cu.ptr<int32_t>()[b + 1] - cu.ptr<int32_t>()[b];
    MSA_CHECK(n <= s.max_queries_per_request, "cu_seqlens_q: request ", b, " has ", n,
              " queries, more than the planned max_queries_per_request = ",
              s.max_queries_per_request);
  }
}

// The attention_forward argument rules that CUDA decode relies on (the CPU path gets them from
// attention_forward itself), plus what CUDA decode does not support.
void check_cuda_run_args(const AttentionArgs& a, int64_t kv_block_size) {
  const ProblemShape s = api::check_q_and_kv(QTensor(a.q, a.q_scale), a.kv, a.cu_seqlens_q,
                                             {DType::bf16, DType::f16, DType::fp8_e4m3},
                                             /*need_v=*/true, /*kv_may_be_quantized=*/true,
                                             int(kv_block_size));
  const Device device = a.q.device;
  const AttentionParams& p = a.params;
  MSA_CHECK(std::isfinite(p.softmax_scale) && p.softmax_scale >= 0.f,
            "params.softmax_scale: must be finite and >= 0 (0 means 1/sqrt(D)), got ",
            p.softmax_scale);
  MSA_CHECK(!a.tlse.defined() && p.temperature == 0.f,
            "tlse: the temperature LSE is not supported by CUDA decode yet (leave tlse absent and "
            "params.temperature 0)");
  MSA_CHECK(!a.k2q.row_ptr.defined() && !a.k2q.q_idx.defined() && !a.k2q.schedule.defined(),
            "k2q: CUDA decode reads q2k directly; leave the k2q index empty");
  api::refuse_cpu_only_attention(a, "decode");
  if (a.q2k.defined()) api::check_q2k(a.q2k, s, device);
  api::check_attention_out(a.out, a.q.dtype, s, device);
  api::check_row_alignments(a.q, a.kv.k.values, a.kv.v.values, a.out);
  if (a.lse.defined()) {
    check_dtype(a.lse, "lse", {DType::f32});
    check_shape(a.lse, "lse", {s.num_q_heads, s.total_q});
    check_contiguous(a.lse, "lse");
    MSA_CHECK(a.lse.device == device, "lse: must be on ", device_name(device), ", got ",
              device_name(a.lse.device));
  }
  if (a.kv.k.values.dtype == DType::fp4x2) {
    for (const auto& [t, name] : {std::pair{&a.kv.k, "k"}, std::pair{&a.kv.v, "v"}}) {
      MSA_CHECK(t->scale.dtype == DType::fp8_e4m3, name,
                ": CUDA decode takes NVFP4 (an e4m3 scale per 16 values); MXFP4 runs on the CPU, "
                "got ", dtype_name(t->scale.dtype), " scales");
      // Each slot's 8 scales are one 8-byte copy (load_fp4.cuh).
      check_row_alignment(t->scale, name[0] == 'k' ? "k scale" : "v scale", 8);
    }
  }
  api::check_status_arg(a.status, device, "decode");
  MSA_CHECK(s.total_q < INT32_MAX, "q: CUDA decode supports up to 2^31 - 1 tokens, got ",
            a.q.describe());
}

}  // namespace

size_t DecodePlan::workspace_bytes(const DecodeShape& shape) {
  check_decode_shape(shape);
  if (shape.device.type != DeviceType::cuda) return 0;
#ifdef MSA_WITH_CUDA
  return cuda::decode_workspace_bytes(shape);
#else
  no_cuda_build();
#endif
}

void DecodePlan::plan(const DecodeShape& shape, const int32_t* seqused_k_host,
                      const Tensor& workspace, cudaStream_t stream) {
  planned_ = false;
  const size_t need = workspace_bytes(shape);
  if (need > 0) {
    check_defined(workspace, "workspace");
    MSA_CHECK(size_t(workspace.numel()) * dtype_size(workspace.dtype) >= need,
              "workspace: needs DecodePlan::workspace_bytes(shape) = ", need, " bytes, got ",
              workspace.describe());
  }
  const int64_t cap = int64_t(shape.max_pages) * shape.page_size;
  for (int b = 0; seqused_k_host && b < shape.batch; ++b)
    MSA_CHECK(seqused_k_host[b] >= 0 && seqused_k_host[b] <= cap, "seqused_k_host: entry ", b,
              " = ", seqused_k_host[b], " must be in [0, ", cap, "] (max_pages * page_size)");
  if (shape.device.type == DeviceType::cuda) {
    MSA_CHECK(workspace.device == shape.device, "workspace: must be on ", device_name(shape.device),
              " as the shape says, got ", device_name(workspace.device));
    check_contiguous(workspace, "workspace");
#ifdef MSA_WITH_CUDA
    const cuda::DecodeWork w = cuda::decode_plan(shape, seqused_k_host, workspace, stream);
    num_items_ = w.items;
    sm_count_ = w.sm_count;
    warps_ = w.warps;
    identity_tiles_ = w.identity_tiles;
#else
    no_cuda_build();
#endif
  }
  shape_ = shape;
  workspace_ = workspace;
  planned_ = true;
}

void DecodePlan::run(const AttentionArgs& args, cudaStream_t stream) const {
  MSA_CHECK(planned_, "decode: run() called before a successful plan()");
  MSA_CHECK(args.q.device == shape_.device, "q: must be on ", device_name(shape_.device),
            " as planned, got ", device_name(args.q.device));
  check_matches_plan(args, shape_);
  if (!args.q.is_cuda()) return attention_forward(args, stream);
  check_cuda_run_args(args, shape_.kv_block_size);
#ifdef MSA_WITH_CUDA
  cuda::decode_run(args, shape_, cuda::DecodeWork{num_items_, sm_count_, warps_, identity_tiles_},
                   workspace_, stream);
#else
  no_cuda_build();
#endif
}

}  // namespace msa
