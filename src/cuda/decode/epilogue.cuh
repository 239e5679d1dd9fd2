// Epilogue of the decode kernel: the warps that split a tile's keys leave (m, l, O) in shared
// memory, then the CTA merges them in fixed warp order and writes either the final out / lse
// (the request's only split) or an f32 partial (normalised O, log2 LSE) for combine.cuh.
// Used by kernel.cuh; write_out4 also by combine.cuh.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/decode/attend.cuh"

namespace msa::cuda::decode {

constexpr float kLn2 = 0.69314718055994530942f;

// Four consecutive head dims of out row (t, hq), rounded once to TQ (8-byte store).
template <typename TQ>
__device__ __forceinline__ void write_out4(const DecodeParams& p, int64_t t, int hq, int d,
                                           float4 v) {
  TQ* dst = static_cast<TQ*>(p.out) + t * p.out_stride_t + int64_t(hq) * p.out_stride_h + d;
  uint2 packed;
  packed.x = pack2<TQ>(v.x, v.y);
  packed.y = pack2<TQ>(v.z, v.w);
  *reinterpret_cast<uint2*>(dst) = packed;
}

// Scratch layout in the (drained) pipeline smem: O rows [max_rows][kOutStride] f32, then m, l.
struct MergeSmem {
  float* o;
  float* m;
  float* l;
};
__device__ __forceinline__ MergeSmem merge_smem(void* base, int max_rows) {
  MergeSmem s;
  s.o = static_cast<float*>(base);
  s.m = s.o + max_rows * kOutStride;
  s.l = s.m + max_rows;
  return s;
}

// The warp's rows g and g + 8 go to scratch rows srow and srow + 8. Whole warp.
template <typename TQ, bool kFp8>
__device__ __forceinline__ void store_warp(const WarpTile<TQ, kFp8>& w, const MergeSmem& s,
                                           int srow) {
  const int lane = threadIdx.x & 31, c = lane & 3;
  float l[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l[i] = w.l[i] + __shfl_xor_sync(0xffffffffu, w.l[i], 1);
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
  }
  // 8-byte stores of head-dim pairs (d, d + 1): bf16 holds them in o[nt][e = 0, 1], fp8 (o_dim)
  // in o[nt][e] and o[nt + 1][e] for even nt.
  const auto store2 = [&](int d, float2 lo, float2 hi) {
    *reinterpret_cast<float2*>(s.o + srow * kOutStride + d) = lo;
    *reinterpret_cast<float2*>(s.o + (srow + 8) * kOutStride + d) = hi;
  };
#pragma unroll
  for (int nt = 0; nt < 16; ++nt) {
    if constexpr (!kFp8) {
      store2(o_dim<kFp8>(nt, c, 0), make_float2(w.o[nt][0], w.o[nt][1]),
             make_float2(w.o[nt][2], w.o[nt][3]));
    } else if (nt % 2 == 0) {
#pragma unroll
      for (int e = 0; e < 2; ++e)
        store2(o_dim<kFp8>(nt, c, e), make_float2(w.o[nt][e], w.o[nt + 1][e]),
               make_float2(w.o[nt][2 + e], w.o[nt + 1][2 + e]));
    }
  }
  if (c == 0) {
    s.m[srow] = w.m[0];
    s.l[srow] = l[0];
    s.m[srow + 8] = w.m[1];
    s.l[srow + 8] = l[1];
  }
}

// Merges the kp key partitions (scratch rows k * 16 nrt + r) of each of the `rows` rows and
// writes them: out / lse when partial < 0, else partial slot `partial`. v_mult: V dequant factor.
// kThreads threads, this one number tid of them.
template <typename TQ, int kThreads>
__device__ __forceinline__ void merge_and_write(const DecodeParams& p, const MergeSmem& s, int rows,
                                                int nrt, int kp, int partial, int h, int64_t t0,
                                                float v_mult, int tid) {
  for (int idx = tid; idx < rows * 32; idx += kThreads) {
    const int r = idx >> 5, d = (idx & 31) * 4;
    float m = -INFINITY;
    for (int k = 0; k < kp; ++k) m = fmaxf(m, s.m[k * 16 * nrt + r]);
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    float l = 0.f;
    if (m != -INFINITY) {
      for (int k = 0; k < kp; ++k) {
        const int sr = k * 16 * nrt + r;
        const float wgt = exp2f(s.m[sr] - m);
        const float4 o = *reinterpret_cast<const float4*>(s.o + sr * kOutStride + d);
        l += wgt * s.l[sr];
        acc.x += wgt * o.x;
        acc.y += wgt * o.y;
        acc.z += wgt * o.z;
        acc.w += wgt * o.w;
      }
    }
    const float inv = l > 0.f ? v_mult / l : 0.f;
    acc = make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
    const float lse2 = l > 0.f ? m + log2f(l) : -INFINITY;
    if (partial < 0) {
      const int64_t t = t0 + (r >> p.group_shift);
      const int hq = h * p.group + (r & (p.group - 1));
      write_out4<TQ>(p, t, hq, d, acc);
      if (d == 0 && p.lse) p.lse[int64_t(hq) * p.total_q + t] = lse2 * kLn2;
    } else {
      const int64_t row = (int64_t(partial) * p.num_kv_heads + h) * p.rows_max + r;
      *reinterpret_cast<float4*>(p.part_o + row * kHeadDim + d) = acc;
      if (d == 0) p.part_lse[row] = lse2;
    }
  }
}

}  // namespace msa::cuda::decode
