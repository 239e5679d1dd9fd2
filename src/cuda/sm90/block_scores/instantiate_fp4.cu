// The indexer kernels for FP4 (NVFP4, MXFP4) inputs, 128-key blocks (launch_kernels.h).
#include "cuda/sm90/block_scores/launch_kernels.cuh"
MSA_BLOCK_SCORES_INSTANTIATE(msa::cuda::indexer_sm90::Elem::fp4, 128)
