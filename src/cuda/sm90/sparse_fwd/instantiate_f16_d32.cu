// The uniform kernel for f16 q / k / v at head dim 32 (dense attention only, on D = 64's tiles:
// traits.h HeadDimTraits).
#include "cuda/sm90/sparse_fwd/launch_kernels.cuh"
MSA_SPARSE_FWD_INSTANTIATE_DENSE(true, 32)
