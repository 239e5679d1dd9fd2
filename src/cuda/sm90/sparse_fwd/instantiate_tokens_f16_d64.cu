// The token-sparse forward kernels for f16 q / k / v at head dim 64 (token_launch.h).
#include "cuda/sm90/sparse_fwd/token_launch.cuh"
MSA_TOKEN_FWD_INSTANTIATE(true, 64)
