// Decode kernels at head dim 256 with FP8 e4m3 KV (per-tensor or per-slot scales) under bf16
// or f16 q.
#include "cuda/sm90/decode/launch_kernels.cuh"
MSA_DECODE_INSTANTIATE(__nv_bfloat16, fp8, 256)
MSA_DECODE_INSTANTIATE(__half, fp8, 256)
