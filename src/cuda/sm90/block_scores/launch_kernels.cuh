// Body of kernel_for (launch_kernels.h), included only by the one-line instantiation files;
// MSA_BLOCK_SCORES_INSTANTIATE(elem) instantiates an input type's six kernels.
#pragma once

#include "cuda/sm90/block_scores/kernel.cuh"
#include "cuda/sm90/block_scores/launch_kernels.h"

namespace msa::cuda::indexer_sm90 {

template <Elem kElem, bool kWide>
KernelFn pick_rows(int row_groups) {
  return row_groups == 4   ? block_scores_kernel<kElem, 4, kWide>
         : row_groups == 2 ? block_scores_kernel<kElem, 2, kWide>
                           : block_scores_kernel<kElem, 1, kWide>;
}

template <Elem kElem>
KernelFn kernel_for(int row_groups, bool wide) {
  return wide ? pick_rows<kElem, true>(row_groups) : pick_rows<kElem, false>(row_groups);
}

}  // namespace msa::cuda::indexer_sm90

#define MSA_BLOCK_SCORES_INSTANTIATE(elem) \
  template msa::cuda::indexer_sm90::KernelFn msa::cuda::indexer_sm90::kernel_for<elem>(int, bool);
