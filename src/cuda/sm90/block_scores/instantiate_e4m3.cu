// The indexer kernels for e4m3 inputs, 128-key blocks (launch_kernels.h).
#include "cuda/sm90/block_scores/launch_kernels.cuh"
MSA_BLOCK_SCORES_INSTANTIATE(msa::cuda::indexer_sm90::Elem::e4m3, 128)
MSA_BLOCK_SCORES_INSTANTIATE_SHARD(msa::cuda::indexer_sm90::Elem::e4m3, 128)
