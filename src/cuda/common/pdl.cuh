// Programmatic dependent launch (sm_90) for chains of kernels on one stream, such as the prefill's
// checks, prep kernels and main kernels: a kernel launched by launch_pdl may start while
// its predecessor still runs, once every CTA of the predecessor has called pdl_trigger (or
// exited), which hides the launch gap between dependent kernels.
//
// Rules every kernel launched by launch_pdl follows:
// - pdl_wait() before it reads anything an earlier kernel of the stream writes, or writes
//   anything an earlier kernel reads; it returns once the predecessor grid has completed and its
//   memory is visible (a no-op in a normal launch). Call it at the top unless the kernel's
//   comment says why it may run ahead.
// - The grid never completes before a pdl_wait() has returned in it (normally every thread calls
//   it at the top; one waiting thread suffices): each kernel's completion then implies the
//   completion of everything before it, so the next kernel's pdl_wait covers the whole chain.
// - pdl_trigger() only after pdl_wait(): a dependent that runs ahead of its own pdl_wait may rely
//   on everything before its predecessor being complete.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "cuda/device/check.h"

namespace msa::cuda {

__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

__device__ __forceinline__ void pdl_trigger() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

namespace detail {
template <typename... Params, typename... Args>
void launch_with_pdl(bool cooperative, void (*kernel)(Params...), dim3 grid, dim3 block,
                     size_t smem, cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  attr[1].id = cudaLaunchAttributeCooperative;
  attr[1].val.cooperative = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = cooperative ? 2 : 1;
  MSA_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}
}  // namespace detail

// kernel<<<grid, block, smem, stream>>>(args...) with programmatic stream serialization.
template <typename... Params, typename... Args>
void launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                cudaStream_t stream, Args&&... args) {
  detail::launch_with_pdl(false, kernel, grid, block, smem, stream, std::forward<Args>(args)...);
}

// The same as a cooperative launch (every CTA co-resident, so the kernel may use grid barriers;
// the launch fails if the grid cannot be).
template <typename... Params, typename... Args>
void launch_cooperative_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t stream,
                            Args&&... args) {
  detail::launch_with_pdl(true, kernel, grid, block, 0, stream, std::forward<Args>(args)...);
}

}  // namespace msa::cuda
