// The prep chain of the sm_90a sparse forward (prep.cu): paged-KV checks, the CSR build or the
// check of the caller's k2q, the schedule, and the prep kernels that turn it into the chunk
// table (KV-major path) and the unit table (uniform path). Called by launch.cu.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/problem.h"
#include "cuda/sm90/sparse_fwd/params.h"
#include "cuda/sm90/sparse_fwd/plan.h"
#include "msa/attention.h"

namespace msa::cuda::sparse_fwd {

// Enqueues the chain on `stream` (kernels only after the first check, each launched with PDL)
// into the workspace `ws` laid out by `w`. Returns the tables as the main kernels and the combine
// read them; cu_seqlens_k is the flat form of the keys' lengths (paged: the checked, clamped
// ones), uniform_enabled is 0 when no key can exist.
// Enqueues the paged-KV checks (paged_checks.cuh) into w.key_offsets / w.paged_offence and
// returns key_offsets, the clamped lengths as a flat cu_seqlens_k for everything that follows.
const int32_t* launch_paged_checks(const AttentionArgs& a, const ProblemShape& s,
                                   const AttnPlan& w, uint8_t* ws, int32_t* status,
                                   cudaStream_t stream);

// FP8 / FP4 K/V as a flat bf16 copy (common/dequant_kv.cuh) at w.k_bf16 / w.v_bf16, batch b's
// keys from row out_offsets[b] (launch.cu; the sparse path and the token path, token_launch.cu).
void launch_dequant(const AttentionArgs& a, const ProblemShape& s, const AttnPlan& w, uint8_t* ws,
                    const int32_t* out_offsets, cudaStream_t stream);

PrepParams launch_prep(const AttentionArgs& a, const ProblemShape& s, const AttnPlan& w,
                       uint8_t* ws, cudaStream_t stream);

}  // namespace msa::cuda::sparse_fwd
