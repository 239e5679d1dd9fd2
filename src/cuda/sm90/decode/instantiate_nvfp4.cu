// Decode kernels over NVFP4 KV (packed e2m1, e4m3 scales per 16 values; head dim 128) under
// bf16, f16 or e4m3 q.
#include "cuda/sm90/decode/launch_kernels.cuh"
MSA_DECODE_INSTANTIATE(__nv_bfloat16, nvfp4, 128)
MSA_DECODE_INSTANTIATE(__half, nvfp4, 128)
MSA_DECODE_INSTANTIATE(__nv_fp8_e4m3, nvfp4, 128)
