// Bodies of the sparse forward launches (launch_kernels.h), included only by the one-line
// instantiation files; MSA_SPARSE_FWD_INSTANTIATE(kF16, kFp8, kBlk) instantiates both kernels of a
// type and kv block size at head dim 128, MSA_SPARSE_FWD_INSTANTIATE_D(kF16, kD, kBlk) those of a
// 16-bit type at head dim 64 or 256, MSA_SPARSE_FWD_INSTANTIATE_DENSE(kF16, kD) the uniform kernel
// alone (dense attention at D = 32), MSA_SPARSE_FWD_INSTANTIATE_DENSE_Q(kF16) the dense kernel at
// D = 128.
#pragma once

#include <mutex>

#include "cuda/common/pdl.cuh"
#include "cuda/device/check.h"
#include "cuda/device/info.h"
#include "cuda/sm90/sparse_fwd/kernel.cuh"
#include "cuda/sm90/sparse_fwd/launch_kernels.h"
#include "cuda/device/smem_limit.h"

namespace msa::cuda::sparse_fwd {

// One persistent launch (a CTA per SM) of either kernel with `smem` bytes of shared memory (the
// plan of its head dim; the limit raised once per device, smem_limit.h); cooperative: every CTA
// resident at once (the launch fails if they cannot be).
template <typename P>
void launch_persistent(void (*kernel)(CUtensorMap, CUtensorMap, CUtensorMap, P), int smem,
                       int threads, const CUtensorMap& tq, const CUtensorMap& tk,
                       const CUtensorMap& tv, const P& p, cudaStream_t stream,
                       bool cooperative = false) {
  allow_dynamic_smem(kernel, size_t(smem), "attention_forward");
  detail::launch_with_pdl(cooperative, kernel, dim3(current_sm_count()), dim3(threads),
                          size_t(smem), stream, tq, tk, tv, p);
}

// With a key mask, the kernels instantiated for it (kMask: mma.cuh consume_tile, uniform_mma.cuh).
template <bool kF16, bool kFp8, int kBlk, int kD>
void launch_main(const CUtensorMap& tq, const CUtensorMap& tk, const CUtensorMap& tv,
                 const MainParams& p, cudaStream_t stream) {
  using KT = KVMajorTraits<kBlk, kD>;
  constexpr int smem = smem_bytes<typename KT::Storage>();
  if (p.mask_bits != nullptr)
    launch_persistent(sparse_fwd_kernel<kF16, kFp8, true, kBlk, kD>, smem, KT::kThreads, tq, tk,
                      tv, p, stream);
  else
    launch_persistent(sparse_fwd_kernel<kF16, kFp8, false, kBlk, kD>, smem, KT::kThreads, tq, tk,
                      tv, p, stream);
}

template <bool kF16, bool kFp8, int kD, int kBlk, bool kParts, bool kDenseQ>
void launch_uniform(const CUtensorMap& tq, const CUtensorMap& tk, const CUtensorMap& tv,
                    const UniformParams& p, cudaStream_t stream) {
  using HT = HeadDimTraits<kD, kBlk>;
  constexpr int smem = smem_bytes<typename HT::Storage>();
  if (p.mask_bits != nullptr)
    launch_persistent(sparse_fwd_uniform_kernel<kF16, kFp8, true, kD, kBlk, kParts, kDenseQ>,
                      smem, HT::kThreads, tq, tk, tv, p, stream);
  else
    launch_persistent(sparse_fwd_uniform_kernel<kF16, kFp8, false, kD, kBlk, kParts, kDenseQ>,
                      smem, HT::kThreads, tq, tk, tv, p, stream);
}

}  // namespace msa::cuda::sparse_fwd

#define MSA_SPARSE_FWD_INSTANTIATE(kF16, kFp8, kBlk)                                        \
  namespace msa::cuda::sparse_fwd {                                                         \
  template void launch_main<kF16, kFp8, kBlk, 128>(const CUtensorMap&, const CUtensorMap&,  \
                                                   const CUtensorMap&, const MainParams&,   \
                                                   cudaStream_t);                           \
  template void launch_uniform<kF16, kFp8, 128, kBlk>(const CUtensorMap&,                   \
                                                      const CUtensorMap&,                   \
                                                      const CUtensorMap&,                   \
                                                      const UniformParams&, cudaStream_t);  \
  }
// Both kernels of a 16-bit type at head dim kD (64 or 256) over kBlk-key blocks.
#define MSA_SPARSE_FWD_INSTANTIATE_D(kF16, kD, kBlk)                                        \
  namespace msa::cuda::sparse_fwd {                                                         \
  template void launch_main<kF16, false, kBlk, kD>(const CUtensorMap&, const CUtensorMap&,  \
                                                   const CUtensorMap&, const MainParams&,   \
                                                   cudaStream_t);                           \
  template void launch_uniform<kF16, false, kD, kBlk>(const CUtensorMap&,                   \
                                                      const CUtensorMap&,                   \
                                                      const CUtensorMap&,                   \
                                                      const UniformParams&, cudaStream_t);  \
  }
// The uniform kernel alone (dense attention over 128-key stages) of a 16-bit type at head dim kD
// (32: D = 64's tiles, traits.h HeadDimTraits).
#define MSA_SPARSE_FWD_INSTANTIATE_DENSE(kF16, kD)                                          \
  namespace msa::cuda::sparse_fwd {                                                         \
  template void launch_uniform<kF16, false, kD, 128>(const CUtensorMap&, const CUtensorMap&, \
                                                     const CUtensorMap&,                    \
                                                     const UniformParams&, cudaStream_t);   \
  }
// The dense kernel of a 16-bit type at D = 128 with its Q warp (kDenseQ).
#define MSA_SPARSE_FWD_INSTANTIATE_DENSE_Q(kF16)                                            \
  namespace msa::cuda::sparse_fwd {                                                         \
  template void launch_uniform<kF16, false, 128, 128, false, true>(                         \
      const CUtensorMap&, const CUtensorMap&, const CUtensorMap&, const UniformParams&,     \
      cudaStream_t);                                                                        \
  }
// At D = 256 over 128-key blocks, the uniform kernel of sparse calls too (kParts).
#define MSA_SPARSE_FWD_INSTANTIATE_PARTS(kF16)                                              \
  namespace msa::cuda::sparse_fwd {                                                         \
  template void launch_uniform<kF16, false, 256, 128, true>(                                \
      const CUtensorMap&, const CUtensorMap&, const CUtensorMap&, const UniformParams&,     \
      cudaStream_t);                                                                        \
  }
