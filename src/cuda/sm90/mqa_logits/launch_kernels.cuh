// Launcher of the MQA logits kernel for one (ragged or paged, rows per token); included by the
// instantiate_*.cu files, declared in launch_kernels.h.
#pragma once

#include "cuda/device/check.h"
#include "cuda/sm90/mqa_logits/kernel.cuh"
#include "cuda/sm90/mqa_logits/launch_kernels.h"
#include "cuda/device/smem_limit.h"

namespace msa::cuda::mqa_logits_sm90 {

template <bool kPaged, int kHp, bool kFp4>
void launch(const CUtensorMap& tm_q, const CUtensorMap& tm_k, const Params& p, unsigned ctas,
            cudaStream_t stream) {
  allow_dynamic_smem(mqa_logits_kernel<kPaged, kHp, kFp4>, kSmemBytes, "mqa_logits");
  mqa_logits_kernel<kPaged, kHp, kFp4><<<ctas, Cfg::kThreads, kSmemBytes, stream>>>(tm_q, tm_k, p);
  MSA_CUDA_CHECK_LAUNCH();
}

}  // namespace msa::cuda::mqa_logits_sm90
