// The dense kernel for bf16 q / k / v at head dim 128, with its Q warp (kernel.cuh kDenseQ).
#include "cuda/sm90/sparse_fwd/launch_kernels.cuh"
MSA_SPARSE_FWD_INSTANTIATE_DENSE_Q(false)
