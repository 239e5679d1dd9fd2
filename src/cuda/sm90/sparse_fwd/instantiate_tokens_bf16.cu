// The token-sparse forward kernels for bf16 q / k / v (token_launch.h).
#include "cuda/sm90/sparse_fwd/token_launch.cuh"
MSA_TOKEN_FWD_INSTANTIATE(false, 128)
