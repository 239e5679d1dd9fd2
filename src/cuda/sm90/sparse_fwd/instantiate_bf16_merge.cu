// The merging KV-major kernel, bf16 q at D = 128 over 128-key blocks (launch_kernels.h
// launch_main_merge), with a key mask when the call has one.
#include "cuda/sm90/sparse_fwd/launch_kernels.cuh"
#include "cuda/sm90/sparse_fwd/merge.cuh"

namespace msa::cuda::sparse_fwd {

void launch_main_merge(const CUtensorMap& tq, const CUtensorMap& tk, const CUtensorMap& tv,
                       const MainParams& p, cudaStream_t stream) {
  constexpr int smem = merge_smem_bytes<KVMajorStorage<kBlockN, kHeadDim>>();
  // What the kernel assumes of the plan (plan.cpp AttnPlan::merge): without bf16 partials its
  // consumers would never hand a tile to the store warps, which would wait for ever.
  MSA_CHECK(p.part_bf16 && p.part_tlse == nullptr && p.merge_count != nullptr &&
                merge_shape_fits(p.group, p.topk),
            "attention_forward: the merging kernel got a plan outside its scope (G ", p.group,
            ", topk ", p.topk, ", bf16 partials ", p.part_bf16, ")");
  // Cooperative: a CTA's merge warps wait for pairs other CTAs publish (merge.cuh merge_wait).
  if (p.mask_bits != nullptr)
    launch_persistent(sparse_fwd_merge_kernel<true>, smem, 512, tq, tk, tv, p, stream, true);
  else
    launch_persistent(sparse_fwd_merge_kernel<false>, smem, 512, tq, tk, tv, p, stream, true);
}

}  // namespace msa::cuda::sparse_fwd
