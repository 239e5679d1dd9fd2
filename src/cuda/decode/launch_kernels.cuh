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
template <typename TQ, bool kFp8>
void set_smem_limit() {
  static_assert(smem_bytes<kFp8>(kMaxBitmapWords) <= 227 * 1024,
                "decode: shared memory of the largest sparse plan exceeds 227 KB");
  MSA_CUDA_CHECK(cudaFuncSetAttribute(decode_kernel<TQ, kFp8>,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      int(smem_bytes<kFp8>(kMaxBitmapWords))));
}

template <typename TQ, bool kFp8>
void launch(const DecodeParams& p, cudaStream_t stream) {
  if (p.num_items > 0) {
    decode_kernel<TQ, kFp8><<<unsigned(p.num_items * p.num_kv_heads), kThreads,
                              smem_bytes<kFp8>(p.bitmap_words), stream>>>(p);
    MSA_CUDA_CHECK_LAUNCH();
  }
  if (p.num_jobs == 0 && p.num_items > 0) return;  // the main kernel finalized the status
  const int64_t blocks = std::max<int64_t>(1, p.num_jobs * p.num_kv_heads);
  combine_kernel<TQ><<<unsigned(blocks), kThreads, 0, stream>>>(p);
  MSA_CUDA_CHECK_LAUNCH();
}

}  // namespace msa::cuda::decode
