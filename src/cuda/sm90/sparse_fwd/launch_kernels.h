// Declarations of the sm_90a sparse forward's two persistent launches (bodies in
// launch_kernels.cuh). The only instantiations: bf16 (instantiate_bf16.cu), f16
// (instantiate_f16.cu) and FP8 QK with bf16 P V (instantiate_fp8qk.cu: kFp8, traits.h), each over
// 64-key blocks too (instantiate_bf16_b64.cu, instantiate_f16_b64.cu, instantiate_fp8qk_b64.cu);
// and both kernels at head dims 64 and 256 for 16-bit types (instantiate_*_d64*.cu,
// instantiate_*_d256*.cu), so they compile in parallel and host edits rebuild none.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include "cuda/sm90/sparse_fwd/params.h"

namespace msa::cuda::sparse_fwd {

// One CTA per SM, PDL after the prep chain. tm_q: q as [total_q, Hq, 128] in boxes of 64 columns
// x G heads x 1 token; tm_k / tm_v: flat [total_k, Hkv, 128] in boxes of 64 x 1 x 128 keys, or
// the page pools (make_tma_paged, boxes of 2^paged.box_shift slots). kFp8: q and K e4m3 in boxes
// of 128 columns (one 128-byte row), K the flat copy (its key scales at p.kscale). K/V boxes hold
// one kv block of kBlk keys (at D = 256 flat boxes of 64 keys, two a 128-key block). kD: the head
// dim, 128, 64 or 256 (16-bit types at 64 and 256; the maps' D is kD).
template <bool kF16, bool kFp8, int kBlk, int kD>
void launch_main(const CUtensorMap& tq, const CUtensorMap& tk, const CUtensorMap& tv,
                 const MainParams& p, cudaStream_t stream);

// The KV-major kernel with the combine inside it (merge.cuh; bf16 q, D = 128, 128-key blocks,
// bf16 partials, p.merge_count set by the prep): no combine launch after it
// (instantiate_bf16_merge.cu).
void launch_main_merge(const CUtensorMap& tq, const CUtensorMap& tk, const CUtensorMap& tv,
                       const MainParams& p, cudaStream_t stream);

// kD: the head dim (128, or 64 / 256: instantiate_*_d64*.cu, instantiate_*_d256*.cu; 32, dense
// only: instantiate_*_d32.cu).
// kBlk: keys per kv block of the call's q2k (kv_block_size), 128 or 64 (instantiate_*_b64.cu);
// dense attention runs 128.
// kParts: sparse units over 128-key blocks at D = 256 (two 64-key stages a block); the dense
// kernel of that shape runs without it.
// kDenseQ: the dense kernel at D = 128 with a Q warp (instantiate_*_dense_q.cu; kernel.cuh).
template <bool kF16, bool kFp8, int kD, int kBlk, bool kParts = false, bool kDenseQ = false>
void launch_uniform(const CUtensorMap& tq, const CUtensorMap& tk, const CUtensorMap& tv,
                    const UniformParams& p, cudaStream_t stream);

}  // namespace msa::cuda::sparse_fwd
