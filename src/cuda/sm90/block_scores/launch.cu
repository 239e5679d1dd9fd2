// Host side of the sm_90a indexer: capability checks, TMA descriptors and the launch of the block
// scores kernel, materialized (cuda::block_scores) or fused with top-K (cuda::block_topk).
// Instantiations (the only ones): block_scores_kernel<Elem, R> for Elem in {bf16, f16, e4m3} x R
// row groups per CTA in {4 (G >= 4), 2 (G = 2), 1 (G = 1)}: R decides which wgmma each
// warpgroup issues, so it cannot be a runtime value.
#include <limits>

#include "backend.h"
#include "cuda/device/check.h"
#include "cuda/device/tma_map.h"
#include "cuda/sm90/block_scores/kernel.cuh"

namespace msa::cuda {
namespace {

using namespace indexer_sm90;

// What this kernel supports; anything else is an msa::Error naming the feature.
void check_supported(const QTensor& q, const KVCache& kv, const ProblemShape& s, int blk, const char* op) {
  MSA_CHECK(q.values.dtype == DType::bf16 || q.values.dtype == DType::f16 ||
                q.values.dtype == DType::fp8_e4m3,
            op, ": CUDA supports bf16, f16 and fp8_e4m3 inputs, got ", dtype_name(q.values.dtype),
            " (FP4 indexer inputs run on the CPU)");
  MSA_CHECK(kv.layout == KVLayout::flat, op, ": a paged key cache (", kv_layout_name(kv.layout),
            ") is not supported on CUDA yet");
  MSA_CHECK(s.head_dim == kHeadDim, op, ": head_dim must be 128 on CUDA, got ", s.head_dim);
  MSA_CHECK(blk == kBlockN, op, ": kv_block_size must be 128 on CUDA, got ", blk);
  MSA_CHECK(s.total_q < std::numeric_limits<int32_t>::max() &&
                kv.k.values.shape[0] < std::numeric_limits<int32_t>::max(),
            op, ": token counts must be below 2^31 on CUDA (TMA coordinates are int32)");
}

// FP8 scale kind (Params): 0 none, 1 per tensor [1], 2 per token [T], 3 per token and head [T, H].
int scale_kind(const Tensor& scale) {
  if (!scale.defined()) return 0;
  if (scale.numel() == 1) return 1;
  return scale.ndim == 1 ? 2 : 3;
}

Params make_params(const QTensor& q, const KVCache& kv, const Tensor& cu_q, const ProblemShape& s,
                   bool causal, const Tensor& status) {
  Params p{};
  p.q_scale = q.scale.defined() ? q.scale.ptr<float>() : nullptr;
  p.k_scale = kv.k.scale.defined() ? kv.k.scale.ptr<float>() : nullptr;
  p.q_scale_kind = scale_kind(q.scale);
  p.k_scale_kind = scale_kind(kv.k.scale);
  p.cu_seqlens_q = cu_q.ptr<int32_t>();
  p.keys.cu_seqlens_k = kv.cu_seqlens_k.ptr<int32_t>();
  p.keys.total_k = kv.k.values.shape[0];
  p.status = status.ptr<int32_t>();
  p.total_q = s.total_q;
  p.total_k = kv.k.values.shape[0];
  p.batch = s.batch;
  p.num_q_heads = int(s.num_q_heads);
  p.num_kv_heads = int(s.num_kv_heads);
  p.group = int(s.group);
  p.row_groups = p.group < kMaxRowGroups ? p.group : kMaxRowGroups;
  p.tokens_per_cta = p.row_groups * kTileM / p.group;
  p.causal = causal;
  return p;
}

using KernelFn = void (*)(const CUtensorMap, const CUtensorMap, const Params);

template <Elem kElem>
KernelFn pick_rows(int row_groups) {
  return row_groups == 4 ? block_scores_kernel<kElem, 4>
         : row_groups == 2 ? block_scores_kernel<kElem, 2> : block_scores_kernel<kElem, 1>;
}

// The instantiation for an input type and row-group count (R = 4 for G >= 4, 2 for G = 2, 1).
KernelFn pick_kernel(DType dt, int row_groups) {
  switch (dt) {
    case DType::f16: return pick_rows<Elem::f16>(row_groups);
    case DType::fp8_e4m3: return pick_rows<Elem::e4m3>(row_groups);
    default: return pick_rows<Elem::bf16>(row_groups);
  }
}

void launch(const QTensor& q, const KVCache& kv, const Params& p, cudaStream_t stream) {
  if (p.total_q == 0 || p.batch == 0) return;
  const char* op = p.scores ? "block_scores" : "block_topk";
  const int tokens_per_group = kTileM / p.group;
  const DType dt = q.values.dtype;
  const uint32_t cols = dt == DType::fp8_e4m3 ? 128 : 64;  // one 128-byte swizzle row per box row
  const CUtensorMap tm_q = make_tma_3d(q.values, cols, uint32_t(p.group), uint32_t(tokens_per_group), op);
  const CUtensorMap tm_k = make_tma_3d(kv.k.values, cols, 1, kBlockN, op);
  const dim3 grid(unsigned((p.total_q + p.tokens_per_cta - 1) / p.tokens_per_cta), unsigned(p.num_kv_heads));
  const auto kernel = pick_kernel(dt, p.row_groups);
  MSA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  kernel<<<grid, kThreads, kSmemBytes, stream>>>(tm_q, tm_k, p);
  MSA_CUDA_CHECK_LAUNCH();
}

}  // namespace

void block_scores(const BlockScoresArgs& a, const ProblemShape& s, cudaStream_t stream) {
  check_supported(a.q, a.kv, s, a.kv_block_size, "block_scores");
  Params p = make_params(a.q, a.kv, a.cu_seqlens_q, s, a.causal, a.status);
  p.scores = a.scores.ptr<float>();
  p.nblk_max = a.scores.shape[1];
  if (p.total_q > 0 && p.batch == 0) return;
  launch(a.q, a.kv, p, stream);
}

void block_topk(const BlockTopKArgs& a, const ProblemShape& s, cudaStream_t stream) {
  check_supported(a.q, a.kv, s, a.kv_block_size, "block_topk");
  MSA_CHECK(a.topk <= kMaxPicks, "topk: at most ", kMaxPicks, " on CUDA, got ", a.topk);
  Params p = make_params(a.q, a.kv, a.cu_seqlens_q, s, a.causal, a.status);
  p.q2k = a.q2k.ptr<int32_t>();
  p.rule = SelectRule{a.topk, a.sink_blocks, a.local_blocks};
  p.nblk_max = std::numeric_limits<int32_t>::max();  // nothing materialized: no bound
  launch(a.q, a.kv, p, stream);
}

}  // namespace msa::cuda
