// The indexer kernels for bf16 inputs, 64-key blocks (launch_kernels.h).
#include "cuda/sm90/block_scores/launch_kernels.cuh"
MSA_BLOCK_SCORES_INSTANTIATE(msa::cuda::indexer_sm90::Elem::bf16, 64)
MSA_BLOCK_SCORES_INSTANTIATE_SHARD(msa::cuda::indexer_sm90::Elem::bf16, 64)
