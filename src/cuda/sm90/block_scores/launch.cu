// Host side of the sm_90a indexer: capability checks, TMA descriptors, the paged-K check and the
// launch of the block scores kernel (launch_kernels.h), materialized (cuda::block_scores) or
// fused with top-K (cuda::block_topk).
#include <algorithm>
#include <bit>
#include <limits>

#include "backend.h"
#include "cuda/common/paged_checks.cuh"
#include "cuda/device/check.h"
#include "cuda/device/tma_map.h"
#include "cuda/sm90/block_scores/launch_kernels.h"

namespace msa::cuda {
namespace {

using namespace indexer_sm90;

// What this kernel supports; anything else is an msa::Error naming the feature.
void check_supported(const QTensor& q, const KVCache& kv, const ProblemShape& s, int blk, const char* op) {
  MSA_CHECK(q.values.dtype == DType::bf16 || q.values.dtype == DType::f16 ||
                q.values.dtype == DType::fp8_e4m3,
            op, ": CUDA supports bf16, f16 and fp8_e4m3 inputs, got ", dtype_name(q.values.dtype),
            " (FP4 indexer inputs run on the CPU)");
  MSA_CHECK(s.head_dim == kHeadDim, op, ": head_dim must be 128 on CUDA, got ", s.head_dim);
  MSA_CHECK(blk == kBlockN, op, ": kv_block_size must be 128 on CUDA, got ", blk);
  MSA_CHECK(s.group <= 16, op, ": GQA group Hq/Hkv must be at most 16 on CUDA, got ", s.group);
  MSA_CHECK(s.total_q < std::numeric_limits<int32_t>::max() &&
                kv.k.values.shape[0] < std::numeric_limits<int32_t>::max(),
            op, ": token counts must be below 2^31 on CUDA (TMA coordinates are int32)");
  if (kv.layout == KVLayout::flat) return;
  // Paged: the kernel reads batch-local key indices as int32.
  MSA_CHECK(s.max_pages * s.page_size < std::numeric_limits<int32_t>::max(), op,
            ": page_table: max_pages * page_size (", s.max_pages, " * ", s.page_size,
            ") must be below 2^31 on CUDA (key indices are int32)");
}

Params make_params(const QTensor& q, const KVCache& kv, const Tensor& cu_q, const ProblemShape& s,
                   bool causal, const Tensor& status) {
  Params p{};
  p.q_scale = q.scale.defined() ? q.scale.ptr<float>() : nullptr;
  p.k_scale = kv.k.scale.defined() ? kv.k.scale.ptr<float>() : nullptr;
  p.q_scale_kind = fp8_scale_kind(q.scale);
  p.k_scale_kind = fp8_scale_kind(kv.k.scale);
  p.cu_seqlens_q = cu_q.ptr<int32_t>();
  if (kv.layout == KVLayout::flat) {
    p.keys.cu_seqlens_k = kv.cu_seqlens_k.ptr<int32_t>();
    p.keys.total_k = p.total_k = kv.k.values.shape[0];
  } else {
    p.keys.seqused_k = kv.seqused_k.defined() ? kv.seqused_k.ptr<int32_t>() : nullptr;
    p.keys.max_keys = s.max_pages * s.page_size;
    p.paged = make_paged_kv(kv.page_table.ptr<int32_t>(), kv.page_table.strides[0], s.num_pages,
                            s.page_size, kv.layout == KVLayout::paged_hnd);
  }
  p.status = status.ptr<int32_t>();
  p.total_q = s.total_q;
  p.batch = s.batch;
  p.num_q_heads = int(s.num_q_heads);
  p.num_kv_heads = int(s.num_kv_heads);
  p.group = int(s.group);
  p.row_groups = p.group < kMaxRowGroups ? p.group : kMaxRowGroups;
  p.tokens_per_cta = p.row_groups * kTileM / p.group;
  p.causal = causal;
  return p;
}

// The instantiation for an input type, row-group count (R = 4 for G >= 4, 2 for G = 2, 1) and
// the fused flag: fused runs the wide kernel (Cfg).
KernelFn pick_kernel(DType dt, int row_groups, bool fused) {
  switch (dt) {
    case DType::f16: return kernel_for<Elem::f16>(row_groups, fused);
    case DType::fp8_e4m3: return kernel_for<Elem::e4m3>(row_groups, fused);
    default: return kernel_for<Elem::bf16>(row_groups, fused);
  }
}

// Paged K: seqused_k and the page ids its lengths use, checked by one block before the main
// kernel (the indexer has no workspace for the sparse forward's multi-block form); the first
// offence lands in the status buffer, which check_status() turns into an msa::Error.
void launch_paged_check(const ProblemShape& s, const Params& p, cudaStream_t stream) {
  const PagedCheckParams c{.page_table = p.paged.page_table,
                                       .page_table_stride = p.paged.page_table_stride,
                                       .seqused_k = p.keys.seqused_k,
                                       .batch = s.batch,
                                       .max_pages = s.max_pages,
                                       .num_pages = s.num_pages,
                                       .page_size = int32_t(s.page_size),
                                       .max_keys = p.keys.max_keys,
                                       .status = p.status};
  launch_paged_check_block(c, stream);
}

void launch(const QTensor& q, const KVCache& kv, const ProblemShape& s, const Params& p,
            cudaStream_t stream) {
  const bool paged = kv.layout != KVLayout::flat;
  if (paged && p.batch > 0) launch_paged_check(s, p, stream);  // even without queries
  if (p.total_q == 0 || p.batch == 0) return;
  const char* op = p.scores ? "block_scores" : "block_topk";
  const int tokens_per_group = kTileM / p.group;
  const DType dt = q.values.dtype;
  const uint32_t cols = dt == DType::fp8_e4m3 ? 128 : 64;  // one 128-byte swizzle row per box row
  const CUtensorMap tm_q = make_tma_3d(q.values, cols, uint32_t(p.group), uint32_t(tokens_per_group), op);
  // Paged: boxes of 2^box_shift slots of one page (load.cuh). Without pages to read, no map over
  // an empty pool (a TMA map needs a non-empty extent): every length is 0 or every page id is bad,
  // so no K box is issued and tm_k stands in for nothing.
  const CUtensorMap tm_k =
      !paged ? make_tma_3d(kv.k.values, cols, 1, kBlockN, op)
      : s.num_pages > 0 && s.max_pages > 0
          ? make_tma_paged(kv.k.values, kv.layout == KVLayout::paged_nhd, cols,
                           1u << p.paged.box_shift, "k", op)
          : tm_q;
  const dim3 grid(unsigned((p.total_q + p.tokens_per_cta - 1) / p.tokens_per_cta), unsigned(p.num_kv_heads));
  const bool wide = p.scores == nullptr;
  const auto kernel = pick_kernel(dt, p.row_groups, wide);
  const int threads = wide ? Cfg<true>::kThreads : Cfg<false>::kThreads;
  MSA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  kernel<<<grid, threads, kSmemBytes, stream>>>(tm_q, tm_k, p);
  MSA_CUDA_CHECK_LAUNCH();
}

}  // namespace

void block_scores(const BlockScoresArgs& a, const ProblemShape& s, cudaStream_t stream) {
  check_supported(a.q, a.kv, s, a.kv_block_size, "block_scores");
  Params p = make_params(a.q, a.kv, a.cu_seqlens_q, s, a.causal, a.status);
  p.scores = a.scores.ptr<float>();
  p.nblk_max = a.scores.shape[1];
  launch(a.q, a.kv, s, p, stream);
}

void block_topk(const BlockTopKArgs& a, const ProblemShape& s, cudaStream_t stream) {
  check_supported(a.q, a.kv, s, a.kv_block_size, "block_topk");
  MSA_CHECK(a.topk <= kMaxPicks, "topk: at most ", kMaxPicks, " on CUDA, got ", a.topk);
  Params p = make_params(a.q, a.kv, a.cu_seqlens_q, s, a.causal, a.status);
  p.q2k = a.q2k.ptr<int32_t>();
  p.rule = SelectRule{a.topk, a.sink_blocks, a.local_blocks};
  p.nblk_max = std::numeric_limits<int32_t>::max();  // nothing materialized: no bound
  launch(a.q, a.kv, s, p, stream);
}

}  // namespace msa::cuda
