// Queries of the current CUDA device that launches size their grids by (runtime.cu).
#pragma once

namespace msa::cuda {

// Streaming multiprocessors of the current device.
int current_sm_count();
// L2 cache bytes of the current device.
int current_l2_bytes();

}  // namespace msa::cuda
