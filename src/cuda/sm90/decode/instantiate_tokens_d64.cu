// Token-id decode kernels (kv_block_size 1) at head dim 64 with KV of q's own type, and FP8 e4m3
// queries over bf16 KV (FP8 KV needs D >= 128).
#include "cuda/sm90/decode/launch_tokens.cuh"
MSA_DECODE_INSTANTIATE_TOKENS(__nv_bfloat16, native, 64)
MSA_DECODE_INSTANTIATE_TOKENS(__half, native, 64)
MSA_DECODE_INSTANTIATE_TOKENS(__nv_fp8_e4m3, native, 64)
