// The indexer kernels for f16 inputs at head dim 64, 64-key blocks (launch_kernels.h).
#include "cuda/sm90/block_scores/launch_kernels.cuh"
MSA_BLOCK_SCORES_INSTANTIATE_D(msa::cuda::indexer_sm90::Elem::f16, 64, 64)
