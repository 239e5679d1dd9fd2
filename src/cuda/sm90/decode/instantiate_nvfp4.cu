// Decode kernels over NVFP4 KV (packed e2m1, e4m3 scales per 16 values) under bf16, f16 or e4m3 q.
#include "cuda/sm90/decode/launch_kernels.cuh"

namespace msa::cuda::decode {
template void set_smem_limit<__nv_bfloat16, KV::nvfp4>();
template void set_smem_limit<__half, KV::nvfp4>();
template void set_smem_limit<__nv_fp8_e4m3, KV::nvfp4>();
template void launch<__nv_bfloat16, KV::nvfp4>(const DecodeParams&, const CUtensorMap&,
                                               const CUtensorMap&, cudaStream_t);
template void launch<__half, KV::nvfp4>(const DecodeParams&, const CUtensorMap&,
                                        const CUtensorMap&, cudaStream_t);
template void launch<__nv_fp8_e4m3, KV::nvfp4>(const DecodeParams&, const CUtensorMap&,
                                               const CUtensorMap&, cudaStream_t);
}  // namespace msa::cuda::decode
