// Launchers of the decode kernels for one (q type, KV kind): the main kernel over items x Hkv
// CTAs, then the combine when some request is split (or, with no items, to finalize the status).
// Included by instantiate_native.cu and instantiate_fp8.cu; declared in launch_kernels.h.
#pragma once

#include <algorithm>

#include "cuda/decode/combine.cuh"
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
void launch(const DecodeParams& p, cudaStream_t stream) {
  if (p.num_items > 0) {
    const unsigned grid = unsigned(p.num_items * p.num_kv_heads);
    if (p.warps == 4)
      decode_kernel<TQ, kFp8, 4><<<grid, 128, smem_bytes<kFp8, 4>(p.bitmap_words), stream>>>(p);
    else
      decode_kernel<TQ, kFp8, 8><<<grid, 256, smem_bytes<kFp8, 8>(p.bitmap_words), stream>>>(p);
    MSA_CUDA_CHECK_LAUNCH();
  }
  if (p.num_jobs == 0 && p.num_items > 0) return;  // the main kernel finalized the status
  const int64_t blocks = std::max<int64_t>(1, p.num_jobs * p.num_kv_heads);
  combine_kernel<TQ><<<unsigned(blocks), kCombineThreads, 0, stream>>>(p);
  MSA_CUDA_CHECK_LAUNCH();
}

}  // namespace msa::cuda::decode
