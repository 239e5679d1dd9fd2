// The sparse forward kernels for f16 q / k / v (launch_kernels.h).
#include "cuda/sm90/sparse_fwd/launch_kernels.cuh"
MSA_SPARSE_FWD_INSTANTIATE(true, false, 128)
