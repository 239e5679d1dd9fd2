// Host side of the token-sparse forward (kv_block_size = 1; token_traits.h): its checks, its
// workspace and its launches, reached from cuda::attention_forward (launch.cu) and
// cuda::attention_workspace_bytes (plan.cpp). Defined in token_launch.cu; the kernel launches in
// instantiate_tokens_*.cu.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "backend.h"
#include "common/problem.h"
#include "cuda/sm90/sparse_fwd/token_traits.h"
#include "msa/attention.h"

namespace msa::cuda::sparse_fwd {

// A sparse call whose q2k holds key positions.
inline bool is_token_call(const AttentionArgs& a, const ProblemShape& s) {
  return a.q2k.defined() && s.kv_block_size == 1;
}

size_t token_workspace_bytes(const AttentionArgs& a, const ProblemShape& s);
// What the token kernel covers; anything else is an msa::Error naming it.
void check_token_supported(const AttentionArgs& a, const ProblemShape& s);
void token_attention_forward(const AttentionArgs& a, const ProblemShape& s, cudaStream_t stream,
                             const WorkspaceSource& src);

// One launch of the kernel over `grid` (x: query tokens, y: kv heads x row tiles), head dim kD
// (64, 128, 256: instantiate_tokens_{bf16,f16}{,_d64,_d256}.cu).
template <bool kF16, bool kTemp, int kD>
void launch_token_kernel(const TokenParams& p, dim3 grid, cudaStream_t stream);

}  // namespace msa::cuda::sparse_fwd
