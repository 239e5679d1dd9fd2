// Consumer epilogue of the sparse forward: normalised partial O (bf16 or f32) and its LSE (and
// temperature LSE) for one (token, kv head, slot), later merged by the combine kernel.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/sm90/sparse_fwd/params.h"
#include "cuda/sm90/sparse_fwd/traits.h"

namespace msa::cuda::sparse_fwd {

// Row statistics of one accumulator row after the block softmax (log2 domain inputs).
struct RowStats {
  float max_log2;  // -inf: no visible key in the block
  float sum;       // sum of exp2(x - max) over visible keys
  float tsum;      // sum of exp2((x - max) / T), temperature LSE only
};

// Writes one accumulator row: `o` holds this thread's 32 values of the row in the wgmma D layout
// (pairs at columns 8 * n + col_base + {0, 1}); `lead` threads (lane % 4 == 0) also write the
// LSE. Rows whose token is -1 (padding) are skipped by the caller.
template <int kOff>
__device__ __forceinline__ void store_partial_row(const MainParams& p, const float (&o)[64],
                                                  int64_t idx, int col_base, bool lead,
                                                  const RowStats& st) {
  const bool empty = st.max_log2 == -INFINITY;
  const float inv = empty ? 0.f : 1.f / st.sum;
  if (p.part_bf16) {
    auto* dst = static_cast<__nv_bfloat162*>(p.part_o) + idx * (kHeadDim / 2);
#pragma unroll
    for (int n = 0; n < 16; ++n)
      dst[(n * 8 + col_base) / 2] =
          __floats2bfloat162_rn(o[n * 4 + kOff] * inv, o[n * 4 + kOff + 1] * inv);
  } else {
    auto* dst = static_cast<float2*>(p.part_o) + idx * (kHeadDim / 2);
#pragma unroll
    for (int n = 0; n < 16; ++n)
      dst[(n * 8 + col_base) / 2] = make_float2(o[n * 4 + kOff] * inv, o[n * 4 + kOff + 1] * inv);
  }
  if (lead) {
    constexpr float kLn2 = 0.69314718055994530942f;
    p.part_lse[idx] = empty ? -INFINITY : (st.max_log2 + __log2f(st.sum)) * kLn2;
    if (p.part_tlse)
      p.part_tlse[idx] =
          empty ? -INFINITY : (st.max_log2 * p.inv_temperature + __log2f(st.tsum)) * kLn2;
  }
}

}  // namespace msa::cuda::sparse_fwd
