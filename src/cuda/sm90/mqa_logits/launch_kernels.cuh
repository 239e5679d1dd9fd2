// Launcher of the MQA logits kernel for one (ragged or paged, rows per token); included by the
// instantiate_*.cu files, declared in launch_kernels.h.
#pragma once

#include "cuda/device/check.h"
#include "cuda/sm90/mqa_logits/kernel.cuh"
#include "cuda/sm90/mqa_logits/launch_kernels.h"

namespace msa::cuda::mqa_logits_sm90 {

template <bool kPaged, int kHp, bool kFp4>
void launch(const CUtensorMap& tm_q, const CUtensorMap& tm_k, const Params& p, unsigned ctas,
            cudaStream_t stream) {
  // The smem opt-in is a per-device function attribute: set on every launch, as the indexer's.
  MSA_CUDA_CHECK(cudaFuncSetAttribute(mqa_logits_kernel<kPaged, kHp, kFp4>,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  mqa_logits_kernel<kPaged, kHp, kFp4><<<ctas, Cfg::kThreads, kSmemBytes, stream>>>(tm_q, tm_k, p);
  MSA_CUDA_CHECK_LAUNCH();
}

}  // namespace msa::cuda::mqa_logits_sm90
