// Declarations of the decode launchers (bodies in launch_kernels.cuh). The only instantiations:
// q bf16 / f16 x KV native (same type as q) / fp8 e4m3, in instantiate_native.cu and
// instantiate_fp8.cu so the two kernel families compile in parallel.
#pragma once

#include <cuda_runtime.h>

#include "cuda/decode/params.h"

namespace msa::cuda::decode {

// Raises the kernel's dynamic shared-memory limit (plan time; not a stream operation).
template <typename TQ, bool kFp8>
void set_smem_limit();

// The main kernel (or, with no items, the status kernel); no allocation, no sync.
template <typename TQ, bool kFp8>
void launch(const DecodeParams& p, cudaStream_t stream);

}  // namespace msa::cuda::decode
