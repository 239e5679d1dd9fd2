// MQA logits kernel: paged MXFP4 rows, 128 query rows per token.
#include "cuda/sm90/mqa_logits/launch_kernels.cuh"

namespace msa::cuda::mqa_logits_sm90 {
template void launch<true, 128, true>(const CUtensorMap&, const CUtensorMap&, const Params&,
                                     unsigned, cudaStream_t);
}  // namespace msa::cuda::mqa_logits_sm90
