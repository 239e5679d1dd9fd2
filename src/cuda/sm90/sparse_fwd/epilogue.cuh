// Consumer epilogues of the sparse forward: unnormalised partial O (bf16 or f32), its LSE and
// 1 / sum (and temperature LSE) for one (token, kv head, slot), later merged by the combine
// kernel; and the 16-byte row store the uniform path uses for final outputs.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include <cstdint>

#include "cuda/device/sm90.cuh"
#include "cuda/sm90/sparse_fwd/params.h"
#include "cuda/sm90/sparse_fwd/traits.h"

namespace msa::cuda::sparse_fwd {

// Row statistics of one accumulator row after the block softmax (log2 domain inputs).
struct RowStats {
  float max_log2;  // -inf: no visible key in the block
  float sum;       // sum of exp2(x - max) over visible keys
  float tsum;      // sum of exp2((x - max) / T), temperature LSE only
};

// Two floats as one 16-bit pair (fp16 when kF16, else bf16), lo in the low half.
template <bool kF16>
__device__ __forceinline__ uint32_t pack_pair(float lo, float hi) {
  uint32_t r;
  if constexpr (kF16) {
    const __half2 h = __floats2half2_rn(lo, hi);
    r = *reinterpret_cast<const uint32_t*>(&h);
  } else {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    r = *reinterpret_cast<const uint32_t*>(&h);
  }
  return r;
}

// Stores one accumulator row (x inv) as 16-bit T: `o` holds this thread's kN / 2 values of the
// row in the wgmma D layout (pairs at columns 8 n + col_base + {0, 1}, kOff 0 for the upper row
// of the thread, 2 for the lower; kN = D / 2), one 4-byte store per pair. Used for the uniform
// path's final outputs. kCols: the row's columns stored, the first kCols of the accumulator's
// (D = 32 on D = 64's tiles: the first 16 of 32 floats).
// Its first version transposed pairs inside the quad for 16-byte stores, with shuffles under the
// quad's mask: the caller's branch on the row's token made ptxas wrap every shuffle in a
// convergence loop (MATCH.ANY / BRA.DIV), 734 instructions per warp per unit, 8% of the uniform
// kernel's warp samples at P32K-blk (ncu source view).
template <typename T, int kOff, int kN, int kCols = kN * 2>
__device__ __forceinline__ void store_row(T* row, const float (&o)[kN], float inv, int col_base) {
  static_assert(kCols % 8 == 0 && kCols <= kN * 2, "whole 8-column groups of the accumulator");
  auto* dst = reinterpret_cast<uint32_t*>(row);
#pragma unroll
  for (int n = 0; n < kCols / 8; ++n)
    dst[(n * 8 + col_base) / 2] = pack_pair<std::is_same_v<T, __half>>(o[n * 4 + kOff] * inv,
                                                                       o[n * 4 + kOff + 1] * inv);
}

// Natural-log LSE (and temperature LSE) of a row from log2-domain statistics. A row with a
// visible key has sum, tsum >= 1 (its max term is 1), so the SFU's log2 needs no subnormal fix-up
// (sm90::fast_log2: the same bits as __log2f there).
__device__ __forceinline__ float row_lse(float max_log2, float sum) {
  constexpr float kLn2 = 0.69314718055994530942f;
  return max_log2 == -INFINITY ? -INFINITY : (max_log2 + sm90::fast_log2(sum)) * kLn2;
}
__device__ __forceinline__ float row_tlse(float max_log2, float tsum, float inv_temp) {
  constexpr float kLn2 = 0.69314718055994530942f;
  return max_log2 == -INFINITY ? -INFINITY : (max_log2 * inv_temp + sm90::fast_log2(tsum)) * kLn2;
}

// The 1 / sum of a partial row: 0 for a row with no visible key, else the SFU's reciprocal (sum
// >= 1: no subnormal fix-up; IEEE 1.f / sum is a call to a slow path).
__device__ __forceinline__ float partial_inv(const RowStats& st) {
  return st.max_log2 == -INFINITY ? 0.f : sm90::fast_rcp(st.sum);
}

// LSE, 1 / sum (and temperature LSE) of one partial row.
__device__ __forceinline__ void store_partial_lse(const MainParams& p, int64_t idx,
                                                  const RowStats& st) {
  p.part_lse[idx] = row_lse(st.max_log2, st.sum);
  p.part_rl[idx] = partial_inv(st);
  if (p.part_tlse) p.part_tlse[idx] = row_tlse(st.max_log2, st.tsum, p.inv_temperature);
}

// A warp's 16 rows (16 warp .. 16 warp + 15) of an unnormalised bf16 partial tile (the combine
// applies 1 / sum: 64 multiplies a tile fewer on the consumer's chain) into a Q buffer
// laid out as wgmma and TMA see it: kN / 32 64-column halves (D / 64; kN = D / 2 floats of O per
// thread) of 64 rows x 128 bytes, 16-byte chunk c of row r stored at chunk c ^ (r % 8). One stmatrix.x4 per two 8-column groups: its four 8 x 8
// tiles are (rows 0-7, group n), (rows 8-15, n), (rows 0-7, n + 1), (rows 8-15, n + 1), and lane
// l addresses row l % 8 of tile l / 8; each tile row is one 16-byte chunk, so the 8 rows of a tile
// land in 8 different chunks (no bank conflict). 8 stmatrix a tile where 4-byte stores took 32.
template <int kN>
__device__ __forceinline__ void stage_partial_tile(uint8_t* buf, const float (&o)[kN], int warp,
                                                   int lane) {
  const int tile = lane >> 3;
  const int row = warp * 16 + (tile & 1) * 8 + (lane & 7);
  const uint32_t base = sm90::smem_addr(buf) + uint32_t(row) * 128;
  // chunk of group n + (tile >> 1), n even: (n % 8) ^ ((tile >> 1) ^ row % 8)
  const uint32_t x = uint32_t(((tile >> 1) ^ row) & 7) << 4;
#pragma unroll
  for (int n = 0; n < kN / 4; n += 2) {
    const uint32_t addr = base + (n >> 3) * kQHalfBytes + ((uint32_t(n & 7) << 4) ^ x);
    sm90::stmatrix_x4(addr, pack_pair<false>(o[n * 4], o[n * 4 + 1]),
                      pack_pair<false>(o[n * 4 + 2], o[n * 4 + 3]),
                      pack_pair<false>(o[n * 4 + 4], o[n * 4 + 5]),
                      pack_pair<false>(o[n * 4 + 6], o[n * 4 + 7]));
  }
}

// Partial of one row (KV-major path): unnormalised O, its LSE and 1 / sum; `lead` threads (lane %
// 4 == 0) write the LSE and 1 / sum. f32 partials, and bf16 ones at D = 256 (whose one Q buffer a
// consumer cannot wait for TMA stores: KVMajorTraits); at D = 128 and 64 bf16 partials are staged
// and stored by TMA instead (stage_partial_tile): direct 4-byte bf16 stores left half-sector L2
// writes, and a 16-byte variant (pairs transposed inside the quad by shuffles) measured slower
// still, 12.50 vs 11.05 ms at P32K-tok (H200), its shuffles and selects sitting on the consumer's
// critical path.
// kN = D / 2: the row's values are D floats, at idx * D. kBf16: the kernel may store bf16
// partials here (p.part_bf16; D = 256), else only f32 ones.
template <int kOff, bool kBf16, int kN>
__device__ __forceinline__ void store_partial_row(const MainParams& p, const float (&o)[kN],
                                                  int64_t idx, int col_base, bool lead,
                                                  const RowStats& st) {
  if (kBf16 && p.part_bf16) {
    auto* dst = static_cast<uint32_t*>(p.part_o) + idx * kN;
#pragma unroll
    for (int n = 0; n < kN / 4; ++n)
      dst[(n * 8 + col_base) / 2] = pack_pair<false>(o[n * 4 + kOff], o[n * 4 + kOff + 1]);
  } else {
    auto* dst = static_cast<float2*>(p.part_o) + idx * kN;
#pragma unroll
    for (int n = 0; n < kN / 4; ++n)
      dst[(n * 8 + col_base) / 2] = make_float2(o[n * 4 + kOff], o[n * 4 + kOff + 1]);
  }
  if (lead) store_partial_lse(p, idx, st);
}

}  // namespace msa::cuda::sparse_fwd
