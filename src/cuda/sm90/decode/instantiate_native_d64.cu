// Decode kernels at head dim 64 with KV of q's own type (bf16 q with bf16 KV, f16 with f16).
#include "cuda/sm90/decode/launch_kernels.cuh"
MSA_DECODE_INSTANTIATE(__nv_bfloat16, native, 64)
MSA_DECODE_INSTANTIATE(__half, native, 64)
