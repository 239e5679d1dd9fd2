// The sparse forward kernels (KV-major and uniform) for bf16 q / k / v at head dim 256 over
// 64-key kv blocks (launch_kernels.h).
#include "cuda/sm90/sparse_fwd/launch_kernels.cuh"
MSA_SPARSE_FWD_INSTANTIATE_D(false, 256, 64)
