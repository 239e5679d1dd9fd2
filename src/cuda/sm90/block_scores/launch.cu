// Host side of the sm_90a indexer: capability checks, TMA descriptors and the launch of the block
// scores kernel, materialized (cuda::block_scores) or fused with top-K (cuda::block_topk).
// Instantiations (the only ones): block_scores_kernel<f16?, R> for bf16/f16 x R row groups per
// CTA in {4 (G >= 4), 2 (G = 2), 1 (G = 1)}: R decides which wgmma each warpgroup issues.
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
  MSA_CHECK(q.values.dtype == DType::bf16 || q.values.dtype == DType::f16, op,
            ": CUDA supports bf16 and f16 inputs so far, got ", dtype_name(q.values.dtype),
            " (FP8 and FP4 indexer inputs run on the CPU)");
  MSA_CHECK(kv.layout == KVLayout::flat, op, ": CUDA supports a flat key cache so far, got ",
            kv_layout_name(kv.layout));
  MSA_CHECK(s.head_dim == kHeadDim, op, ": CUDA supports head dim 128, got ", s.head_dim);
  MSA_CHECK(blk == kBlockN, op, ": CUDA supports kv_block_size 128, got ", blk);
  MSA_CHECK(s.total_q < std::numeric_limits<int32_t>::max() &&
                kv.k.values.shape[0] < std::numeric_limits<int32_t>::max(),
            op, ": token counts must be below 2^31 on CUDA (TMA coordinates are int32)");
}

Params make_params(const QTensor& q, const KVCache& kv, const Tensor& cu_q, const ProblemShape& s,
                   bool causal, const Tensor& status) {
  Params p{};
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

void launch(const QTensor& q, const KVCache& kv, const Params& p, cudaStream_t stream) {
  if (p.total_q == 0 || p.batch == 0) return;
  const char* op = p.scores ? "block_scores" : "block_topk";
  const int tokens_per_group = kTileM / p.group;
  const CUtensorMap tm_q = make_tma_3d(q.values, 64, uint32_t(p.group), uint32_t(tokens_per_group), op);
  const CUtensorMap tm_k = make_tma_3d(kv.k.values, 64, 1, kBlockN, op);
  const dim3 grid(unsigned((p.total_q + p.tokens_per_cta - 1) / p.tokens_per_cta), unsigned(p.num_kv_heads));
  const bool f16 = q.values.dtype == DType::f16;
  auto kernel = p.row_groups == 4 ? (f16 ? block_scores_kernel<true, 4> : block_scores_kernel<false, 4>)
                : p.row_groups == 2 ? (f16 ? block_scores_kernel<true, 2> : block_scores_kernel<false, 2>)
                                    : (f16 ? block_scores_kernel<true, 1> : block_scores_kernel<false, 1>);
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
