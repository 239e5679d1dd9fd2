// The attention entry with the workspace's size function named by the caller: the public
// attention_forward names attention_workspace_bytes, the pipeline (api/pipeline.cpp) names its
// own, since it hands attention the remainder of its workspace.
#pragma once

#include "backend.h"

namespace msa::api {

void attention_forward(const AttentionArgs& a, cudaStream_t stream,
                       const cuda::WorkspaceSource& src);

}  // namespace msa::api
