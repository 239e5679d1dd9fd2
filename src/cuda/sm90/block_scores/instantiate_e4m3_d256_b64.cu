// The indexer kernels for FP8 e4m3 inputs at head dim 256, 64-key blocks (launch_kernels.h).
#include "cuda/sm90/block_scores/launch_kernels.cuh"
MSA_BLOCK_SCORES_INSTANTIATE_D(msa::cuda::indexer_sm90::Elem::e4m3, 64, 256)
