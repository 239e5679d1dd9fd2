// Body of launch_token_kernel (token_launch.h), included only by the one-line instantiation files;
// MSA_TOKEN_FWD_INSTANTIATE(kF16) instantiates both kernels (with and without tlse) of a type.
#pragma once

#include <mutex>

#include "cuda/device/check.h"
#include "cuda/sm90/sparse_fwd/token_kernel.cuh"
#include "cuda/sm90/sparse_fwd/token_launch.h"

namespace msa::cuda::sparse_fwd {

template <bool kF16, bool kTemp>
void launch_token_kernel(const TokenParams& p, dim3 grid, cudaStream_t stream) {
  static std::once_flag once;
  std::call_once(once, [] {
    auto* k = token_fwd_kernel<kF16, kTemp>;
    MSA_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        kTokSmemBytes));
    // Two CTAs per SM need the whole 228 KB as shared memory.
    MSA_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributePreferredSharedMemoryCarveout,
                                        int(cudaSharedmemCarveoutMaxShared)));
  });
  token_fwd_kernel<kF16, kTemp><<<grid, kTokThreads, kTokSmemBytes, stream>>>(p);
  MSA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace msa::cuda::sparse_fwd

#define MSA_TOKEN_FWD_INSTANTIATE(kF16)                                                         \
  namespace msa::cuda::sparse_fwd {                                                             \
  template void launch_token_kernel<kF16, false>(const TokenParams&, dim3, cudaStream_t);       \
  template void launch_token_kernel<kF16, true>(const TokenParams&, dim3, cudaStream_t);        \
  }
