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

__device__ __forceinline__ uint32_t pick4(const uint32_t (&a)[4], int i) {
  return i == 0 ? a[0] : i == 1 ? a[1] : i == 2 ? a[2] : a[3];
}

// Writes one accumulator row: `o` holds this thread's 32 values of the row in the wgmma D layout
// (pairs at columns 8 * n + col_base + {0, 1}); `lead` threads (lane % 4 == 0) also write the
// LSE. The four lanes of a quad share the row (and the branch that calls this). bf16: a 4 x 4
// transpose of packed pairs inside the quad gives each lane 8 consecutive columns, so every
// store is 16 bytes and a quad writes whole 32-byte sectors (4-byte stores wrote half sectors
// and doubled L2 write traffic).
template <int kOff>
__device__ __forceinline__ void store_partial_row(const MainParams& p, const float (&o)[64],
                                                  int64_t idx, int col_base, bool lead,
                                                  const RowStats& st) {
  const bool empty = st.max_log2 == -INFINITY;
  const float inv = empty ? 0.f : 1.f / st.sum;
  if (p.part_bf16) {
    const int q = col_base >> 1;
    const int lane = threadIdx.x & 31;
    const unsigned quad = 0xfu << (lane & ~3);
    auto* dst = static_cast<uint4*>(p.part_o) + idx * (kHeadDim / 8);
#pragma unroll
    for (int g4 = 0; g4 < 4; ++g4) {
      uint32_t mine[4], got[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int n = 4 * g4 + k;
        const __nv_bfloat162 v =
            __floats2bfloat162_rn(o[n * 4 + kOff] * inv, o[n * 4 + kOff + 1] * inv);
        mine[k] = *reinterpret_cast<const uint32_t*>(&v);
      }
      // got[r]: lane (q ^ r)'s pair for column group 4 g4 + q (got[0] is our own).
      got[0] = pick4(mine, q);
#pragma unroll
      for (int r = 1; r < 4; ++r) got[r] = __shfl_xor_sync(quad, pick4(mine, q ^ r), r);
      dst[4 * g4 + q] = make_uint4(pick4(got, q), pick4(got, 1 ^ q), pick4(got, 2 ^ q),
                                   pick4(got, 3 ^ q));
    }
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
