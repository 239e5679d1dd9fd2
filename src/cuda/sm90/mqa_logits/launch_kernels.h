// Declarations of the MQA logits launchers (bodies in launch_kernels.cuh). Instantiations:
// ragged and paged, for 32, 64 and 128 query rows per token (instantiate_{ragged,paged}_h*.cu).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include "cuda/sm90/mqa_logits/params.h"

namespace msa::cuda::mqa_logits_sm90 {

// Launches `ctas` CTAs (tokens of kHp rows each) on `stream` (no allocation, no sync).
// kFp4: paged MXFP4 q and pool (fp4_load.cuh; the maps are unused).
template <bool kPaged, int kHp, bool kFp4 = false>
void launch(const CUtensorMap& tm_q, const CUtensorMap& tm_k, const Params& p, unsigned ctas,
            cudaStream_t stream);

}  // namespace msa::cuda::mqa_logits_sm90
