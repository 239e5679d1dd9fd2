// Decode kernels at head dim 256 with FP8 e4m3 queries over FP8 e4m3 KV and over bf16 KV.
#include "cuda/sm90/decode/launch_kernels.cuh"
MSA_DECODE_INSTANTIATE(__nv_fp8_e4m3, fp8, 256)
MSA_DECODE_INSTANTIATE(__nv_fp8_e4m3, native, 256)
