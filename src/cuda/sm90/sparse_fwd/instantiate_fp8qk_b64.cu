// The sparse forward kernels for e4m3 q and K (QK in FP8) with bf16 P V and out, over 64-key kv
// blocks (launch_kernels.h).
#include "cuda/sm90/sparse_fwd/launch_kernels.cuh"
MSA_SPARSE_FWD_INSTANTIATE(false, true, 64)
