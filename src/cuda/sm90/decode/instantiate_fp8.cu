// Decode kernels with FP8 e4m3 KV (per-tensor scales) under bf16 or f16 q.
#include "cuda/sm90/decode/launch_kernels.cuh"

namespace msa::cuda::decode {
template void set_smem_limit<__nv_bfloat16, KV::fp8>();
template void set_smem_limit<__half, KV::fp8>();
template void launch<__nv_bfloat16, KV::fp8>(const DecodeParams&, const CUtensorMap&,
                                          const CUtensorMap&, cudaStream_t);
template void launch<__half, KV::fp8>(const DecodeParams&, const CUtensorMap&,
                                          const CUtensorMap&, cudaStream_t);
}  // namespace msa::cuda::decode
