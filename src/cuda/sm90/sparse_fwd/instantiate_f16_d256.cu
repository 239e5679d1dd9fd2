// The uniform kernel (dense attention) for f16 q / k / v at head dim 256 (launch_kernels.h).
#include "cuda/sm90/sparse_fwd/launch_kernels.cuh"
MSA_SPARSE_FWD_INSTANTIATE_UNIFORM(true, 256)
