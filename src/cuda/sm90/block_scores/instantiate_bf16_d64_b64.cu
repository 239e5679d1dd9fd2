// The indexer kernels for bf16 inputs at head dim 64, 64-key blocks (launch_kernels.h).
#include "cuda/sm90/block_scores/launch_kernels.cuh"
MSA_BLOCK_SCORES_INSTANTIATE_D(msa::cuda::indexer_sm90::Elem::bf16, 64, 64)
