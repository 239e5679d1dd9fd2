// The merging KV-major kernel, bf16 q at D = 128 over 128-key blocks (launch_kernels.h
// launch_main_merge), with a key mask when the call has one.
#include "cuda/sm90/sparse_fwd/launch_kernels.cuh"
#include "cuda/sm90/sparse_fwd/merge.cuh"

namespace msa::cuda::sparse_fwd {

void launch_main_merge(const CUtensorMap& tq, const CUtensorMap& tk, const CUtensorMap& tv,
                       const MainParams& p, cudaStream_t stream) {
  constexpr int smem = merge_smem_bytes<KVMajorStorage<kBlockN, kHeadDim>>();
  if (p.mask_bits != nullptr)
    launch_persistent(sparse_fwd_merge_kernel<true>, smem, 512, tq, tk, tv, p, stream);
  else
    launch_persistent(sparse_fwd_merge_kernel<false>, smem, 512, tq, tk, tv, p, stream);
}

}  // namespace msa::cuda::sparse_fwd
