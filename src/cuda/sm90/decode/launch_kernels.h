// Declarations of the decode launchers (bodies in launch_kernels.cuh), per (q type, KV kind,
// head dim). The only instantiations, one compile unit per (kind, head dim) so that they build in
// parallel:
//   D = 128: q bf16 / f16 x KV native (same type as q) / fp8 e4m3 (instantiate_native.cu,
//            instantiate_fp8.cu), q e4m3 x KV fp8 e4m3 / bf16 (instantiate_fp8q.cu; KV::native
//            means bf16 KV there), q bf16 / f16 / e4m3 x KV nvfp4 (instantiate_nvfp4.cu);
//   D = 64:  q bf16 / f16 x KV native (instantiate_native_d64.cu), q e4m3 x bf16 KV
//            (instantiate_fp8q_d64.cu); FP8 and NVFP4 KV are refused (api/decode.cpp);
//   D = 256: as D = 128 without NVFP4 KV (instantiate_{native,fp8,fp8q}_d256.cu);
//   token ids (kv_block_size 1, the kTokens kernels): every pair above but NVFP4 KV, whose block
//            kernels take token ids: instantiate_tokens_{native,fp8}.cu (D = 128, FP8 q with the
//            KV kind), instantiate_tokens_d64.cu, instantiate_tokens_{native,fp8}_d256.cu.
#pragma once

#include <cuda.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "cuda/sm90/decode/params.h"
#include "cuda/sm90/decode/traits.h"

namespace msa::cuda::decode {

// Raises the kernel's dynamic shared-memory limit (plan time; not a stream operation).
template <typename TQ, KV kKV, int kD>
void set_smem_limit();

// The main kernel (or, with no items, the status kernel); no allocation, no sync. tm_k / tm_v:
// the pools' TMA maps (launch.cu; boxes of 2^p.box_shift slots).
template <typename TQ, KV kKV, int kD>
void launch(const DecodeParams& p, const CUtensorMap& tm_k, const CUtensorMap& tm_v,
            cudaStream_t stream);

// The same for the token kernels (launch_tokens.cuh; native and FP8 KV): set_smem_limit and launch
// above call them, for plans of token ids with a non-empty grid (launch checks the launch).
template <typename TQ, KV kKV, int kD>
void set_smem_limit_tokens();
template <typename TQ, KV kKV, int kD>
void launch_tokens(const DecodeParams& p, const CUtensorMap& tm_k, const CUtensorMap& tm_v,
                   unsigned grid, cudaStream_t stream);

}  // namespace msa::cuda::decode
