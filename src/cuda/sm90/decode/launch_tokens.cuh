// Launchers of the token-id decode kernels (kernel.cuh decode_kernel with kTokens: sparse plans of
// kv_block_size 1) for one (q type, KV kind, head dim), native and FP8 KV (NVFP4 runs token ids in
// its block kernels). launch_kernels.cuh's launch() and set_smem_limit() call these; they compile
// in the instantiate_tokens*.cu files only. Declared in launch_kernels.h.
#pragma once

#include "cuda/sm90/decode/launch_kernels.cuh"

namespace msa::cuda::decode {

template <typename TQ, KV kKV, int kD>
void set_smem_limit_tokens() {
  static_assert(kKV != KV::nvfp4, "set_smem_limit_tokens: NVFP4 has no token kernels");
  set_smem_limit_of<TQ, kKV, 4, kD, false, true>();
  set_smem_limit_of<TQ, kKV, 8, kD, false, true>();
  if constexpr (kKV == KV::fp8) {
    set_smem_limit_of<TQ, kKV, 4, kD, true, true>();
    set_smem_limit_of<TQ, kKV, 8, kD, true, true>();
  }
}

template <typename TQ, KV kKV, int kD>
void launch_tokens(const DecodeParams& p, const CUtensorMap& tm_k, const CUtensorMap& tm_v,
                   unsigned grid, cudaStream_t stream) {
  static_assert(kKV != KV::nvfp4, "launch_tokens: NVFP4 has no token kernels");
  if (p.warps == 4) launch_main<TQ, kKV, 4, kD, true>(p, tm_k, tm_v, grid, stream);
  else launch_main<TQ, kKV, 8, kD, true>(p, tm_k, tm_v, grid, stream);
}

}  // namespace msa::cuda::decode

// The token launchers of q type TQ over KV kind KIND (native, fp8) at head dim D.
#define MSA_DECODE_INSTANTIATE_TOKENS(TQ, KIND, D)                                          \
  namespace msa::cuda::decode {                                                             \
  template void set_smem_limit_tokens<TQ, KV::KIND, D>();                                   \
  template void launch_tokens<TQ, KV::KIND, D>(const DecodeParams&, const CUtensorMap&,     \
                                               const CUtensorMap&, unsigned, cudaStream_t); \
  }
