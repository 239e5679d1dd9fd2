// Launchers of the decode kernels for one (q type, KV kind, head dim): the main kernel over
// items x Hkv CTAs, which also combines split requests and finalizes the status; with no items, a
// one-thread status kernel instead. Sparse plans of token ids (kv_block_size 1) run the token
// kernels (kernel.cuh kTokens), whose launchers are in launch_tokens.cuh and compile in
// instantiate_tokens*.cu, so that the block kernels' compile units hold only the block kernels.
// Included by the instantiate_*.cu files; declared in launch_kernels.h.
#pragma once

#include "cuda/sm90/decode/kernel.cuh"
#include "cuda/sm90/decode/launch_kernels.h"
#include "cuda/device/check.h"

namespace msa::cuda::decode {

// The largest plan's need, so a later plan never lowers the limit under an earlier one's.
template <typename TQ, KV kKV, int kW, int kD, bool kSlotScales, bool kTokens>
void set_smem_limit_of() {
  static_assert(smem_bytes<kKV, kW, kD>(kMaxBitmapWords) <= 227 * 1024,
                "decode: shared memory of the largest sparse plan exceeds 227 KB");
  MSA_CUDA_CHECK(cudaFuncSetAttribute(decode_kernel<TQ, kKV, kW, kD, kSlotScales, kTokens>,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      int(smem_bytes<kKV, kW, kD>(kMaxBitmapWords))));
}

template <typename TQ, KV kKV, int kD>
void set_smem_limit() {
  set_smem_limit_of<TQ, kKV, 4, kD, false, false>();
  set_smem_limit_of<TQ, kKV, 8, kD, false, false>();
  if constexpr (kKV == KV::fp8) {
    set_smem_limit_of<TQ, kKV, 4, kD, true, false>();
    set_smem_limit_of<TQ, kKV, 8, kD, true, false>();
  }
  if constexpr (kKV != KV::nvfp4) set_smem_limit_tokens<TQ, kKV, kD>();
}

// The main kernel of one CTA width, with or without per-slot FP8 scales (FP8 only), of blocks or
// token ids (kTokens).
template <typename TQ, KV kKV, int kW, int kD, bool kTokens>
void launch_main(const DecodeParams& p, const CUtensorMap& tm_k, const CUtensorMap& tm_v,
                 unsigned grid, cudaStream_t stream) {
  const size_t smem = smem_bytes<kKV, kW, kD>(p.bitmap_words);
  constexpr int kThreads = Traits<kKV, kW, kD>::kThreads;
  if constexpr (kKV == KV::fp8) {
    if (p.slot_scales) {
      decode_kernel<TQ, kKV, kW, kD, true, kTokens>
          <<<grid, kThreads, smem, stream>>>(p, tm_k, tm_v);
      return;
    }
  }
  decode_kernel<TQ, kKV, kW, kD, false, kTokens><<<grid, kThreads, smem, stream>>>(p, tm_k, tm_v);
}

template <typename TQ, KV kKV, int kD>
void launch(const DecodeParams& p, const CUtensorMap& tm_k, const CUtensorMap& tm_v,
            cudaStream_t stream) {
  const unsigned grid = unsigned(p.num_items * p.num_kv_heads);
  // NVFP4 producers copy per slot, so its block kernels take token ids as they are.
  const bool tokens = kKV != KV::nvfp4 && p.q2k != nullptr && p.kv_block_size == 1;
  if (grid == 0) {
    status_kernel<TQ><<<1, 32, 0, stream>>>(p);
  } else if (tokens) {
    if constexpr (kKV != KV::nvfp4) launch_tokens<TQ, kKV, kD>(p, tm_k, tm_v, grid, stream);
  } else if (p.warps == 4) {
    launch_main<TQ, kKV, 4, kD, false>(p, tm_k, tm_v, grid, stream);
  } else {
    launch_main<TQ, kKV, 8, kD, false>(p, tm_k, tm_v, grid, stream);
  }
  MSA_CUDA_CHECK_LAUNCH();
}

}  // namespace msa::cuda::decode

// The launchers of q type TQ over KV kind KIND (native, fp8, nvfp4) at head dim D: one line per
// (q type, kind, D) in the instantiate_*.cu files.
#define MSA_DECODE_INSTANTIATE(TQ, KIND, D)                                                 \
  namespace msa::cuda::decode {                                                             \
  template void set_smem_limit<TQ, KV::KIND, D>();                                          \
  template void launch<TQ, KV::KIND, D>(const DecodeParams&, const CUtensorMap&,            \
                                        const CUtensorMap&, cudaStream_t);                  \
  }
