// Declarations of the MQA logits launchers (bodies in launch_kernels.cuh). Instantiations:
// ragged (instantiate_ragged.cu) and paged (instantiate_paged.cu), each for 1, 2 and 4 row groups.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include "cuda/sm90/mqa_logits/params.h"

namespace msa::cuda::mqa_logits_sm90 {

// Launches `ctas` CTAs of kR row groups on `stream` (no allocation, no sync).
template <bool kPaged, int kR>
void launch(const CUtensorMap& tm_q, const CUtensorMap& tm_k, const Params& p, unsigned ctas,
            cudaStream_t stream);

}  // namespace msa::cuda::mqa_logits_sm90
