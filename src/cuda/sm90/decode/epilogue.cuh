// Epilogue of the decode kernel: the warps that split a tile's keys leave (m, l, O) in shared
// memory, then the CTA merges them in fixed warp order and writes either the final out / lse
// (the request's only split) or an f32 partial (normalised O, log2 LSE) for combine.cuh.
// Used by kernel.cuh; write_out4 also by combine.cuh.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/sm90/decode/attend.cuh"
#include "cuda/device/sm80.cuh"

namespace msa::cuda::decode {

constexpr float kLn2 = 0.69314718055994530942f;

// Four consecutive head dims of out row (t, hq), rounded once to the output type (OutT<TQ>,
// attend.cuh; 8-byte store).
template <typename TQ>
__device__ __forceinline__ void write_out4(const DecodeParams& p, int64_t t, int hq, int d,
                                           float4 v) {
  using TO = OutT<TQ>;
  TO* dst = static_cast<TO*>(p.out) + t * p.out_stride_t + int64_t(hq) * p.out_stride_h + d;
  uint2 packed;
  packed.x = sm80::pack2<TO>(v.x, v.y);
  packed.y = sm80::pack2<TO>(v.z, v.w);
  *reinterpret_cast<uint2*>(dst) = packed;
}

// Scratch layout in the (drained) pipeline smem: O rows [max_rows][kOutStride<kD>] f32, then m,
// l and the merge weights, one per scratch row.
struct MergeSmem {
  float* o;
  float* m;
  float* l;
  float* w;
};
template <int kD>
__device__ __forceinline__ MergeSmem merge_smem(void* base, int max_rows) {
  MergeSmem s;
  s.o = static_cast<float*>(base);
  s.m = s.o + max_rows * kOutStride<kD>;
  s.l = s.m + max_rows;
  s.w = s.l + max_rows;
  return s;
}

// The warp's rows g and g + 8 go to scratch rows srow and srow + 8, its O to head dims
// [d0, d0 + kOutDims) of them (d0 > 0: the second dim part at D = 256). with_ml: this warp writes
// the rows' (m, l) (the first dim part; the other holds the same values). Whole warp.
template <typename TQ, KV kKV, int kD>
__device__ __forceinline__ void store_warp(const WarpTile<TQ, kKV, kD>& w, const MergeSmem& s,
                                           int srow, int d0, bool with_ml) {
  constexpr bool kFp8 = kByteStage<kKV>;  // o_dim's order of the e4m3-byte stages
  constexpr int kStride = kOutStride<kD>;
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
    *reinterpret_cast<float2*>(s.o + srow * kStride + d0 + d) = lo;
    *reinterpret_cast<float2*>(s.o + (srow + 8) * kStride + d0 + d) = hi;
  };
#pragma unroll
  for (int nt = 0; nt < w.kOutTiles; ++nt) {
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
  if (c == 0 && with_ml) {
    s.m[srow] = w.m[0];
    s.l[srow] = l[0];
    s.m[srow + 8] = w.m[1];
    s.l[srow + 8] = l[1];
  }
}

// Merges the kp key partitions (scratch rows k * 16 nrt + r) of each of the `rows` rows (row r
// is row hbase + r of query_of, as in load_q) and writes them: out / lse when partial < 0, else
// partial slot `partial`. v_mult: V dequant factor.
// kThreads threads (>= rows * kp), this one number tid of them, meeting at named barrier `bar`.
// First the kp consecutive threads of each row turn its partitions' (m, l) into normalised
// weights (one exponential each, the row sum by shuffles) and write the LSE; then every thread
// sums 4 head dims of one row over the partitions, with no exponential and no dependent chain.
// kKp > 0: one row tile (rows <= 16) whose warps split the keys kKp ways, known at compile time:
// the loops unroll and each thread issues all its shared-memory loads before its sums (with one
// warp per scheduler left in the CTA, each dependent load would otherwise cost its full latency:
// per-CTA %globaltimer stamps put this merge at 2-2.5 us per CTA).
template <typename TQ, int kD, int kThreads, int kKp = 0>
__device__ __forceinline__ void merge_and_write(const DecodeParams& p, const MergeSmem& s, int rows,
                                                int hbase, int nrt, int kp_rt, int partial, int h,
                                                int64_t t0, float v_mult, int tid, uint32_t bar) {
  constexpr int kStride = kOutStride<kD>;
  constexpr int kQuads = kD / 4, kQuadShift = kD == 64 ? 4 : kD == 128 ? 5 : 6;  // 4-dim slots
  const int kp = kKp > 0 ? kKp : kp_rt;
  const int stride = kKp > 0 ? 16 : 16 * nrt;  // scratch rows between a row's partitions
  // Thread tid < rows * kp: row tid / kp, partition tid % kp (kp a power of two <= 8, so a row's
  // threads share a warp).
  if (tid < ((rows * kp + 31) & ~31)) {
    const bool mine = tid < rows * kp;
    const int r = mine ? tid / kp : 0, k = tid % kp, sr = k * stride + r;
    float m = -INFINITY;
#pragma unroll
    for (int j = 0; j < (kKp > 0 ? kKp : 8); ++j)
      if (kKp > 0 || j < kp) m = fmaxf(m, s.m[j * stride + r]);
    const float wgt = mine && m != -INFINITY ? exp2f(s.m[sr] - m) : 0.f;
    float l = mine ? wgt * s.l[sr] : 0.f;
#pragma unroll
    for (int off = 1; off < (kKp > 0 ? kKp : 8); off <<= 1)
      if (kKp > 0 || off < kp) l += __shfl_xor_sync(0xffffffffu, l, off);
    if (mine) s.w[sr] = l > 0.f ? wgt * (v_mult / l) : 0.f;
    if (mine && k == 0) {
      const float lse2 = l > 0.f ? m + log2f(l) : -INFINITY;
      if (partial < 0) {
        const int qi = query_of(p, hbase + r);
        const int64_t t = t0 + qi;
        const int hq = h * p.group + (hbase + r - qi * p.group);
        if (p.lse) p.lse[int64_t(hq) * p.total_q + t] = lse2 * kLn2;
      } else {
        p.part_lse[(int64_t(partial) * p.num_kv_heads + h) * p.rows_max + r] = lse2;
      }
    }
  }
  sm90::named_sync(bar, kThreads);
  const auto write4 = [&](int r, int d, float4 acc) {
    if (partial < 0) {
      const int qi = query_of(p, hbase + r);
      write_out4<TQ>(p, t0 + qi, h * p.group + (hbase + r - qi * p.group), d, acc);
    } else {
      const int64_t row = (int64_t(partial) * p.num_kv_heads + h) * p.rows_max + r;
      *reinterpret_cast<float4*>(p.part_o + row * kD + d) = acc;
    }
  };
  if constexpr (kKp > 0) {
    constexpr int kIters = 16 * kQuads / kThreads;  // (row, 4 dims) slots of a row tile a thread
    static_assert(16 * kQuads % kThreads == 0, "merge_and_write: whole passes over a row tile");
    float wk[kIters][kKp];
    float4 ok[kIters][kKp];
#pragma unroll
    for (int i = 0; i < kIters; ++i) {
      const int idx = tid + i * kThreads, r = idx >> kQuadShift, d = (idx & (kQuads - 1)) * 4;
      const bool valid = r < rows;  // rows past `rows` have no weights (phase 1 wrote none)
#pragma unroll
      for (int k = 0; k < kKp; ++k) {
        wk[i][k] = valid ? s.w[k * stride + r] : 0.f;
        ok[i][k] = valid ? *reinterpret_cast<const float4*>(s.o + (k * stride + r) * kStride + d)
                         : make_float4(0.f, 0.f, 0.f, 0.f);
      }
    }
#pragma unroll
    for (int i = 0; i < kIters; ++i) {
      const int idx = tid + i * kThreads, r = idx >> kQuadShift, d = (idx & (kQuads - 1)) * 4;
      float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int k = 0; k < kKp; ++k) {
        acc.x += wk[i][k] * ok[i][k].x;
        acc.y += wk[i][k] * ok[i][k].y;
        acc.z += wk[i][k] * ok[i][k].z;
        acc.w += wk[i][k] * ok[i][k].w;
      }
      if (r < rows) write4(r, d, acc);
    }
  } else {
    for (int idx = tid; idx < rows * kQuads; idx += kThreads) {
      const int r = idx >> kQuadShift, d = (idx & (kQuads - 1)) * 4;
      float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
      for (int k = 0; k < kp; ++k) {
        const int sr = k * stride + r;
        const float wgt = s.w[sr];
        const float4 o = *reinterpret_cast<const float4*>(s.o + sr * kStride + d);
        acc.x += wgt * o.x;
        acc.y += wgt * o.y;
        acc.z += wgt * o.z;
        acc.w += wgt * o.w;
      }
      write4(r, d, acc);
    }
  }
}

}  // namespace msa::cuda::decode
