// Body of kernel_for (launch_kernels.h), included only by the one-line instantiation files;
// MSA_BLOCK_SCORES_INSTANTIATE(elem, blk) instantiates an input type's six kernels for one
// block size at head dim 128, MSA_BLOCK_SCORES_INSTANTIATE_D(elem, blk, d) at head dim d.
#pragma once

#include "cuda/sm90/block_scores/kernel.cuh"
#include "cuda/sm90/block_scores/launch_kernels.h"

namespace msa::cuda::indexer_sm90 {

template <Elem kElem, int kBlk, bool kWide, int kD>
KernelFn pick_rows(int row_groups) {
  return row_groups == 4   ? block_scores_kernel<kElem, kBlk, 4, kWide, false, kD>
         : row_groups == 2 ? block_scores_kernel<kElem, kBlk, 2, kWide, false, kD>
                           : block_scores_kernel<kElem, kBlk, 1, kWide, false, kD>;
}

template <Elem kElem, int kBlk, int kD>
KernelFn kernel_for(int row_groups, bool wide) {
  return wide ? pick_rows<kElem, kBlk, true, kD>(row_groups)
              : pick_rows<kElem, kBlk, false, kD>(row_groups);
}

template <Elem kElem, int kBlk>
KernelFn shard_kernel_for(bool wide) {
  return wide ? block_scores_kernel<kElem, kBlk, 4, true, true> : block_scores_kernel<kElem, kBlk, 4, false, true>;
}

}  // namespace msa::cuda::indexer_sm90

#define MSA_BLOCK_SCORES_INSTANTIATE(elem, blk) MSA_BLOCK_SCORES_INSTANTIATE_D(elem, blk, 128)
#define MSA_BLOCK_SCORES_INSTANTIATE_D(elem, blk, d) \
  template msa::cuda::indexer_sm90::KernelFn msa::cuda::indexer_sm90::kernel_for<elem, blk, d>(int, bool);
// ... and its ICP shard kernels (16- and 8-bit inputs).
#define MSA_BLOCK_SCORES_INSTANTIATE_SHARD(elem, blk) \
  template msa::cuda::indexer_sm90::KernelFn msa::cuda::indexer_sm90::shard_kernel_for<elem, blk>(bool);
