// Decode kernels with KV of q's own type (bf16 q with bf16 KV, f16 with f16).
#include "cuda/sm90/decode/launch_kernels.cuh"

namespace msa::cuda::decode {
template void set_smem_limit<__nv_bfloat16, KV::native>();
template void set_smem_limit<__half, KV::native>();
template void launch<__nv_bfloat16, KV::native>(const DecodeParams&, const CUtensorMap&,
                                          const CUtensorMap&, cudaStream_t);
template void launch<__half, KV::native>(const DecodeParams&, const CUtensorMap&,
                                          const CUtensorMap&, cudaStream_t);
}  // namespace msa::cuda::decode
