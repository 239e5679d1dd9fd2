// Launchers of the decode kernels for one (q type, KV kind): the main kernel over items x Hkv
// CTAs, which also combines split requests and finalizes the status; with no items, a one-thread
// status kernel instead.
// Included by instantiate_native.cu and instantiate_fp8.cu; declared in launch_kernels.h.
#pragma once

#include <algorithm>

#include "cuda/decode/kernel.cuh"
#include "cuda/decode/launch_kernels.h"
#include "cuda/device/check.h"

namespace msa::cuda::decode {

// The largest plan's need, so a later plan never lowers the limit under an earlier one's.
template <typename TQ, bool kFp8, int kW>
void set_smem_limit_of() {
  static_assert(smem_bytes<kFp8, kW>(kMaxBitmapWords) <= 227 * 1024,
                "decode: shared memory of the largest sparse plan exceeds 227 KB");
  MSA_CUDA_CHECK(cudaFuncSetAttribute(decode_kernel<TQ, kFp8, kW>,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      int(smem_bytes<kFp8, kW>(kMaxBitmapWords))));
}

template <typename TQ, bool kFp8>
void set_smem_limit() {
  set_smem_limit_of<TQ, kFp8, 4>();
  set_smem_limit_of<TQ, kFp8, 8>();
}

template <typename TQ, bool kFp8>
void launch(const DecodeParams& p, const CUtensorMap& tm_k, const CUtensorMap& tm_v,
            cudaStream_t stream) {
  const unsigned grid = unsigned(p.num_items * p.num_kv_heads);
  if (grid == 0)
    status_kernel<TQ><<<1, 32, 0, stream>>>(p);
  else if (p.warps == 4)
    decode_kernel<TQ, kFp8, 4>
        <<<grid, Traits<kFp8, 4>::kThreads, smem_bytes<kFp8, 4>(p.bitmap_words), stream>>>(
            p, tm_k, tm_v);
  else
    decode_kernel<TQ, kFp8, 8>
        <<<grid, Traits<kFp8, 8>::kThreads, smem_bytes<kFp8, 8>(p.bitmap_words), stream>>>(
            p, tm_k, tm_v);
  MSA_CUDA_CHECK_LAUNCH();
}

}  // namespace msa::cuda::decode
