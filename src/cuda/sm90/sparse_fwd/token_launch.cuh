// Body of launch_token_kernel (token_launch.h), included only by the one-line instantiation files;
// MSA_TOKEN_FWD_INSTANTIATE(kF16, kD) instantiates both kernels (with and without tlse) of a type
// and head dim.
#pragma once

#include <mutex>

#include "cuda/device/check.h"
#include "cuda/sm90/sparse_fwd/token_kernel.cuh"
#include "cuda/sm90/sparse_fwd/token_launch.h"
#include "cuda/device/smem_limit.h"

namespace msa::cuda::sparse_fwd {

template <bool kF16, bool kTemp, int kD>
void launch_token_kernel(const TokenParams& p, dim3 grid, cudaStream_t stream) {
  // Two CTAs per SM need the whole 228 KB as shared memory: the carveout at its maximum.
  allow_dynamic_smem(token_fwd_kernel<kF16, kTemp, kD>, kTokSmemBytes<kD>, "attention_forward",
                     /*max_carveout=*/true);
  token_fwd_kernel<kF16, kTemp, kD><<<grid, kTokThreads, kTokSmemBytes<kD>, stream>>>(p);
  MSA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace msa::cuda::sparse_fwd

#define MSA_TOKEN_FWD_INSTANTIATE(kF16, kD)                                                     \
  namespace msa::cuda::sparse_fwd {                                                             \
  template void launch_token_kernel<kF16, false, kD>(const TokenParams&, dim3, cudaStream_t);   \
  template void launch_token_kernel<kF16, true, kD>(const TokenParams&, dim3, cudaStream_t);    \
  }
