// The attention entry with the workspace's size function named by the caller: the public
// attention_forward names attention_workspace_bytes, the pipeline (api/pipeline.cpp) names its
// own, since it hands attention the remainder of its workspace.
#pragma once

#include "backend.h"

namespace msa::api {

// A validated call: its shape and its arguments with the defaults made explicit.
struct CheckedAttention {
  ProblemShape shape;
  AttentionArgs args;
};
// Every argument rule of attention_forward (an msa::Error naming the first broken one); on CUDA
// also what its kernels refuse (cuda::check_attention_supported).
CheckedAttention check_attention(const AttentionArgs& a);

void attention_forward(const AttentionArgs& a, cudaStream_t stream,
                       const cuda::WorkspaceSource& src);
// The same call on arguments check_attention returned (the pipeline checks them before its
// indexer runs, and not twice).
void attention_forward(const CheckedAttention& c, cudaStream_t stream,
                       const cuda::WorkspaceSource& src);

}  // namespace msa::api
