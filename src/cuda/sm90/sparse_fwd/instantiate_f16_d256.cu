// The sparse forward kernels (KV-major and uniform) for f16 q / k / v at head dim 256 over
// 128-key kv blocks; the uniform kernel runs dense attention at D = 256 too (launch_kernels.h).
#include "cuda/sm90/sparse_fwd/launch_kernels.cuh"
MSA_SPARSE_FWD_INSTANTIATE_D(true, 256, 128)
MSA_SPARSE_FWD_INSTANTIATE_PARTS(true)
