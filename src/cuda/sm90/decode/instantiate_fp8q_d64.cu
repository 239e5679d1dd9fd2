// Decode kernels at head dim 64 with FP8 e4m3 queries over bf16 KV (FP8 KV needs D >= 128).
#include "cuda/sm90/decode/launch_kernels.cuh"
MSA_DECODE_INSTANTIATE(__nv_fp8_e4m3, native, 64)
