// Decode kernels with FP8 e4m3 queries over FP8 e4m3 KV and over bf16 KV.
#include "cuda/sm90/decode/launch_kernels.cuh"

namespace msa::cuda::decode {
template void set_smem_limit<__nv_fp8_e4m3, KV::fp8>();
template void set_smem_limit<__nv_fp8_e4m3, KV::native>();
template void launch<__nv_fp8_e4m3, KV::fp8>(const DecodeParams&, const CUtensorMap&,
                                          const CUtensorMap&, cudaStream_t);
template void launch<__nv_fp8_e4m3, KV::native>(const DecodeParams&, const CUtensorMap&,
                                           const CUtensorMap&, cudaStream_t);
}  // namespace msa::cuda::decode
