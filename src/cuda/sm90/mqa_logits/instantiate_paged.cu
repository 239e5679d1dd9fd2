// MQA logits kernels, paged rows, 1, 2 and 4 row groups.
#include "cuda/sm90/mqa_logits/launch_kernels.cuh"

namespace msa::cuda::mqa_logits_sm90 {
template void launch<true, 1>(const CUtensorMap&, const CUtensorMap&, const Params&, unsigned, cudaStream_t);
template void launch<true, 2>(const CUtensorMap&, const CUtensorMap&, const Params&, unsigned, cudaStream_t);
template void launch<true, 4>(const CUtensorMap&, const CUtensorMap&, const Params&, unsigned, cudaStream_t);
}  // namespace msa::cuda::mqa_logits_sm90
