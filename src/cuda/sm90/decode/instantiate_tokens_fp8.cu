// Token-id decode kernels (kv_block_size 1) at head dim 128 with FP8 e4m3 KV (per-tensor or
// per-slot scales) under bf16, f16 or FP8 e4m3 q.
#include "cuda/sm90/decode/launch_tokens.cuh"
MSA_DECODE_INSTANTIATE_TOKENS(__nv_bfloat16, fp8, 128)
MSA_DECODE_INSTANTIATE_TOKENS(__half, fp8, 128)
MSA_DECODE_INSTANTIATE_TOKENS(__nv_fp8_e4m3, fp8, 128)
