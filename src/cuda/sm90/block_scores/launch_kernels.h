// The sm_90a indexer kernels as the host picks them (bodies in launch_kernels.cuh). The only
// instantiations, one file per input type and block size (instantiate_{bf16,f16,e4m3,fp4}.cu
// for 128-key blocks, instantiate_*_b64.cu for 64, compiled in parallel): R row groups per CTA
// in {4 (G >= 4), 2 (G = 2), 1 (G = 1)} x both widths (Cfg: fused runs wide, unfused narrow).
// R decides which wgmma each warpgroup issues and the width the CTA's size, so neither can be a
// runtime value; the block size is a template parameter so that the 128-key kernels carry no
// code of the 64-key epilogue (traits.h). The head dims other than 128 (traits.h kHeadDimOk) have
// files of their own: instantiate_{bf16,f16}_d64*.cu and instantiate_e4m3_d256*.cu. Besides, one
// ICP shard kernel per 16/8-bit input type and block size (shard_kernel_for), at D = 128.
#pragma once

#include <cuda.h>

#include "cuda/sm90/block_scores/params.h"
#include "cuda/sm90/block_scores/traits.h"

namespace msa::cuda::indexer_sm90 {

using KernelFn = void (*)(const CUtensorMap, const CUtensorMap, const Params);

// The kernel for `row_groups` (4, 2 or 1) and width (wide: fused with top-K), blocks of kBlk
// (128 or 64) keys, head dim kD.
template <Elem kElem, int kBlk, int kD>
KernelFn kernel_for(int row_groups, bool wide);

// The ICP shard kernels (Params::shard), 4 row groups (G >= 4; the M3 index geometry is 4 heads
// on 1 key head); bf16, f16 and e4m3 only: unfused (the partial scores into a plane) or wide
// (fused: the rank's lists written directly, Params::list_scores).
template <Elem kElem, int kBlk>
KernelFn shard_kernel_for(bool wide);

}  // namespace msa::cuda::indexer_sm90
