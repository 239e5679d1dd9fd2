// Consumer math of the decode kernel, per warp and 16 query rows: Q fragments in registers,
// S = Q K^T over a run of key slots of a pipeline stage, masking by select (-inf, never 0 * x),
// online softmax in log2 units with the (-inf) - (-inf) guard, O += P V. mma.sync m16n8k16:
// decode's 16-row tiles are too small for wgmma's 64. Used by kernel.cuh.
//
// FP8 KV runs f16 MMAs on the e4m3 values converted exactly in registers (device/sm80.cuh, one
// cvt per pair, reading either half of a register: 2 instructions per 4 K bytes, 3 per 4 V bytes
// with one byte permute; the per-tensor scales apply to S and O in fp32). With the warps of a
// 16-row CTA (sparse) splitting each stage's keys, every element is converted once per CTA. Its
// contraction order over d differs from bf16's so that one ldmatrix of fp8 bytes feeds whole
// k-steps: q_dim and o_dim say which head-dim element each fragment register holds.
//
// FP8 queries (TQ = e4m3, q_scale per token and head in rs): q converts once, exactly, to the
// MMA type of the KV path (f16 over FP8 KV, bf16 over bf16 KV) and that path runs. An e4m3
// mma.sync (m16n8k32) is no faster on sm_90: ptxas unpacks both operands to f16 and issues f16
// HMMAs (448 F2FP unpacks per kernel against 416 with q converted at load; DEC-MTP-fp8q 139.7
// against 133.7 us).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <climits>
#include <cstdint>
#include <type_traits>

#include "cuda/sm90/decode/load.cuh"
#include "cuda/device/sm80.cuh"
#include "cuda/device/sm90.cuh"

namespace msa::cuda::decode {

template <typename TQ>
constexpr bool kIsE4m3 = std::is_same_v<TQ, __nv_fp8_e4m3>;
// The output type of q type TQ: q's own, bf16 for e4m3 queries.
template <typename TQ>
using OutT = std::conditional_t<kIsE4m3<TQ>, __nv_bfloat16, TQ>;

// Head-dim index of A-fragment element e of k-step ks, register half (0: k slots 2c, 2c+1;
// 1: 2c+8, 2c+9) of the thread with c = lane % 4.
template <bool kFp8>
__device__ __forceinline__ int q_dim(int ks, int half, int c, int e) {
  return kFp8 ? 16 * ks + 4 * c + 2 * half + e : 16 * ks + 8 * half + 2 * c + e;
}
// Head-dim index of accumulator o[nt][e] (and o[nt][2 + e]).
template <bool kFp8>
__device__ __forceinline__ int o_dim(int nt, int c, int e) {
  return kFp8 ? 16 * (nt >> 1) + 4 * c + 2 * e + (nt & 1) : 8 * nt + 2 * c + e;
}

template <typename TQ>
__device__ __forceinline__ float2 to_float2(uint32_t v) {
  if constexpr (std::is_same_v<TQ, __nv_bfloat16>)
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&v));
  else
    return __half22float2(*reinterpret_cast<const __half2*>(&v));
}

// One warp's 16 rows (thread rows g = lane / 4 and g + 8) at head dim kD: Q over all kD dims,
// O over the warp's kOutDims of them (its dim part, plan.h dim_parts; all kD below 256).
template <typename TQ, KV kKV, int kD>
struct WarpTile {
  using TM = std::conditional_t<kF16Math<kKV>, __half, OutT<TQ>>;  // MMA operand type
  static constexpr int kKSteps = kD / 16;
  static constexpr int kOutDims = kD / dim_parts(kD);
  static constexpr int kOutTiles = kOutDims / 8;
  uint32_t qa[kKSteps][4];  // Q A-fragments, k-steps of 16 head dims (order: q_dim)
  float o[kOutTiles][4];    // O accumulators, n-tiles of 8 head dims (order: o_dim)
  float m[2], l[2];   // running max (log2 units) and this thread's part of the row sum
  float rs[2];        // score scale per row: softmax_scale * log2(e) * K dequant / Q prescale
  int climit[2];      // last key the row may see (causal); -1 for padding rows
  uint32_t qbit[2];   // the row's query bit in the union masks; 0 for padding rows
  // Per-slot V scales (attend's kSlotScales): O holds sum P * (vs / vref) * V, vref a power of two
  // at least 16x every |vs| seen so far (warp-uniform, raised lazily); 0 before any (set by the
  // kernel). vinv = 1/vref.
  float vref, vinv;
};

// The e4m3 query scale of (token t, head hq) by p.q_scale_kind (params.h).
__device__ __forceinline__ float q_scale_at(const DecodeParams& p, int64_t t, int hq) {
  switch (p.q_scale_kind) {
    case 1: return p.q_scale[0];
    case 2: return p.q_scale[t];
    case 3: return p.q_scale[t * p.num_q_heads + hq];
    default: return 1.f;
  }
}

// Row i (0: g, 1: g + 8) of the Q A-fragments from an e4m3 row, converted exactly to the MMA
// type: f16 (quantized KV) or bf16 (bf16 KV).
template <KV kKV, int kD>
__device__ __forceinline__ void load_q_row(WarpTile<__nv_fp8_e4m3, kKV, kD>& w,
                                           const __nv_fp8_e4m3* q_row, int i, int c, bool valid) {
  const auto* row = reinterpret_cast<const uint8_t*>(q_row);
#pragma unroll
  for (int ks = 0; ks < kD / 16; ++ks)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const uint16_t pair =
          valid ? *reinterpret_cast<const uint16_t*>(row + q_dim<kByteStage<kKV>>(ks, half, c, 0)) : 0;
      w.qa[ks][i + 2 * half] =
          kF16Math<kKV> ? sm80::e4m3x2_to_f16x2(pair) : sm80::e4m3x2_to_bf16x2(pair);
    }
}
// The same from a bf16 / f16 row.
template <typename TQ, KV kKV, int kD>
__device__ __forceinline__ void load_q_row(WarpTile<TQ, kKV, kD>& w, const TQ* row, int i, int c,
                                           bool valid) {
#pragma unroll
  for (int ks = 0; ks < kD / 16; ++ks)
#pragma unroll
    for (int half = 0; half < 2; ++half)
      w.qa[ks][i + 2 * half] =
          valid ? *reinterpret_cast<const uint32_t*>(row + q_dim<kByteStage<kKV>>(ks, half, c, 0))
                : 0u;
}

// bf16 / f16 q for f16 MMAs (quantized KV): scales each row by a power of two so its largest |q|
// lands in [2^14, 2^15): no overflow for any bf16 q, full f16 precision; qscale gets the factor
// back.
template <typename TQ, KV kKV, int kD>
__device__ __forceinline__ void prescale_q_f16(WarpTile<TQ, kKV, kD>& w, float (&qscale)[2]) {
  float amax[2] = {0.f, 0.f};
#pragma unroll
  for (int ks = 0; ks < kD / 16; ++ks)
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float2 f = to_float2<TQ>(w.qa[ks][k]);
      amax[k & 1] = fmaxf(amax[k & 1], fmaxf(fabsf(f.x), fabsf(f.y)));
    }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    amax[i] = fmaxf(amax[i], __shfl_xor_sync(0xffffffffu, amax[i], 1));
    amax[i] = fmaxf(amax[i], __shfl_xor_sync(0xffffffffu, amax[i], 2));
  }
  int shift[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    int ex = 0;
    if (amax[i] > 0.f && amax[i] <= 3.0e38f) frexpf(amax[i], &ex);
    shift[i] = amax[i] > 0.f ? min(120, max(-120, 15 - ex)) : 0;
    qscale[i] = ldexpf(1.f, -shift[i]);
  }
#pragma unroll
  for (int ks = 0; ks < kD / 16; ++ks)
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float2 f = to_float2<TQ>(w.qa[ks][k]);
      w.qa[ks][k] = sm80::pack2<__half>(ldexpf(f.x, shift[k & 1]), ldexpf(f.y, shift[k & 1]));
    }
}

// Loads Q rows [16 rt, 16 rt + 16) of a CTA serving `rows` rows (row r is row hbase + r of
// query_of: query qi of token t0 + qi, head h * G + (hbase + r) % G; hbase > 0 only for a chunk
// of a query's heads, plan.h head_chunks). k_mult: K dequant factor (fp8: k_scale, nvfp4: its
// global scale). An e4m3 row's q scale joins its score scale.
template <typename TQ, KV kKV, int kD>
__device__ __forceinline__ void load_q(WarpTile<TQ, kKV, kD>& w, const DecodeParams& p, int rt,
                                       int rows, int hbase, int64_t t0, int h, int q0, int lq,
                                       int lk, float k_mult) {
  const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  float qscale[2] = {1.f, 1.f};
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = rt * 16 + g + 8 * i;
    const bool valid = r < rows;
    const int qi = query_of(p, hbase + r), hq = h * p.group + (hbase + r - qi * p.group);
    w.climit[i] = !valid ? -1 : p.causal ? q0 + qi + lk - lq : INT_MAX;
    w.qbit[i] = valid ? 1u << qi : 0u;
    const int64_t off = (t0 + qi) * p.q_stride_t + int64_t(hq) * p.q_stride_h;
    load_q_row(w, static_cast<const TQ*>(p.q) + off, i, c, valid);
    if constexpr (kIsE4m3<TQ>)
      if (valid) qscale[i] = q_scale_at(p, t0 + qi, hq);
  }
  if constexpr (kF16Math<kKV> && !kIsE4m3<TQ>) prescale_q_f16(w, qscale);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    w.rs[i] = p.scale_log2 * k_mult * qscale[i];
    w.m[i] = -INFINITY;
    w.l[i] = 0.f;
  }
#pragma unroll
  for (int nt = 0; nt < w.kOutTiles; ++nt)
#pragma unroll
    for (int k = 0; k < 4; ++k) w.o[nt][k] = 0.f;
}

// Attends the warp's rows to key slots [kb, kb + 8 nn) of one stage of kS slots (nn in {2, 4, 8},
// at most kTiles: traits.h kWindowKeys / 8):
// S over all kD head dims from the K region at k_stage, O over the warp's kOutDims from the V
// region at v_stage (the first line of its dim part). sel0 / sel1: whether the thread's rows
// selected these slots' block (always true for dense).
// whole (warp-uniform): every slot of the window holds a key that every row of the warp sees and
// selected, so the masks are skipped (the same values as the masked path: only the selects go).
// kSlotScales (FP8 with per-slot scales, load.cuh): slot_scale[slot] multiplies the slot's scores
// (in f32, before the softmax) and slot_scale[kS + slot] its probability in the P V product. P
// enters the f16 MMA as P * vs / vref <= 256 (WarpTile::vref), so no V scale can overflow it.
template <int kS, int kTiles, bool kSlotScales, typename TQ, KV kKV, int kD>
__device__ __forceinline__ void attend(WarpTile<TQ, kKV, kD>& w, uint32_t k_stage,
                                       uint32_t v_stage, const int* slot_key,
                                       const float* slot_scale, int kb, int nn, bool sel0,
                                       bool sel1, bool whole) {
  using WT = WarpTile<TQ, kKV, kD>;
  using TM = typename WT::TM;
  constexpr bool kFp8 = kByteStage<kKV>;  // e4m3 bytes in the stage
  constexpr int kKLines = kRowLines<kKV, kD>;                 // lines of a K row
  constexpr int kVLines = kKLines / dim_parts(kD);            // lines of the warp's V part
  const int lane = threadIdx.x & 31, c = lane & 3;
  float s[kTiles][4];
#pragma unroll
  for (int nt = 0; nt < kTiles; ++nt)
#pragma unroll
    for (int k = 0; k < 4; ++k) s[nt][k] = 0.f;

  // S = Q K^T: ldmatrix rows are keys, so each register is a B fragment.
#pragma unroll
  for (int nt = 0; nt < kTiles; ++nt) {
    if (nt >= nn) break;
    const int row = kb + 8 * nt + (lane & 7);
    if constexpr (!kFp8) {
#pragma unroll
      for (int pp = 0; pp < kD / 32; ++pp) {
        uint32_t r[4];
        sm80::ldmatrix_x4(r, k_stage + tile_offset<kKLines, kS>(row, 4 * pp + (lane >> 3)));
        sm80::mma_16816<TM>(s[nt], w.qa[2 * pp], r[0], r[1]);
        sm80::mma_16816<TM>(s[nt], w.qa[2 * pp + 1], r[2], r[3]);
      }
    } else {
#pragma unroll
      for (int pp = 0; pp < kD / 64; ++pp) {
        uint32_t r[4];
        sm80::ldmatrix_x4(r, k_stage + tile_offset<kKLines, kS>(row, 4 * pp + (lane >> 3)));
#pragma unroll
        for (int mi = 0; mi < 4; ++mi) {
          uint32_t b0, b1;
          sm80::e4m3x4_pairs_01_23(r[mi], b0, b1);
          sm80::mma_16816<TM>(s[nt], w.qa[4 * pp + mi], b0, b1);
        }
      }
    }
  }

  if constexpr (kSlotScales) {
#pragma unroll
    for (int nt = 0; nt < kTiles; ++nt) {
      if (nt >= nn) break;
      const float2 ks = *reinterpret_cast<const float2*>(slot_scale + kb + 8 * nt + 2 * c);
      s[nt][0] *= ks.x;
      s[nt][1] *= ks.y;
      s[nt][2] *= ks.x;
      s[nt][3] *= ks.y;
    }
  }

  // Mask by select: a slot without a key, past the row's causal limit or in a block the row did
  // not select becomes -inf (its V row is zero-filled or real data, never garbage).
  float mx[2] = {-INFINITY, -INFINITY};
  if (whole) {
#pragma unroll
    for (int nt = 0; nt < kTiles; ++nt) {
      if (nt >= nn) break;
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        s[nt][e] *= w.rs[0];
        s[nt][2 + e] *= w.rs[1];
        mx[0] = fmaxf(mx[0], s[nt][e]);
        mx[1] = fmaxf(mx[1], s[nt][2 + e]);
      }
    }
  } else {
#pragma unroll
    for (int nt = 0; nt < kTiles; ++nt) {
      if (nt >= nn) break;
      const int2 jj = *reinterpret_cast<const int2*>(slot_key + kb + 8 * nt + 2 * c);
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int j = e ? jj.y : jj.x;
        s[nt][e] = (j >= 0 && j <= w.climit[0] && sel0) ? s[nt][e] * w.rs[0] : -INFINITY;
        s[nt][2 + e] = (j >= 0 && j <= w.climit[1] && sel1) ? s[nt][2 + e] * w.rs[1] : -INFINITY;
        mx[0] = fmaxf(mx[0], s[nt][e]);
        mx[1] = fmaxf(mx[1], s[nt][2 + e]);
      }
    }
  }
  // Lazy rescaling: a row's reference max w.m moves only when the new max passes it by more than
  // kSlack (log2 units), so most steps skip the multiplies of O (64 at D = 128). Exact: any
  // reference works as long as the terms stay finite, and exp2(s - w.m) <= 2^kSlack = 256 here
  // (f16 / bf16 P keep their relative precision; l and O are f32). A row whose keys were all masked so far keeps
  // w.m = -inf, and its terms use 0 as the reference: exp2(-inf - 0) = 0, no NaN.
  constexpr float kSlack = 8.f;
  bool grow[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
    mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
    grow[i] = mx[i] > w.m[i] + kSlack;  // false while both are -inf
  }
  if (__any_sync(0xffffffffu, grow[0] || grow[1])) {
    float alpha[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      alpha[i] = grow[i] ? sm90::fast_exp2(w.m[i] - mx[i]) : 1.f;  // -inf - x: 0 (O and l are 0 then)
      if (grow[i]) w.m[i] = mx[i];
      w.l[i] *= alpha[i];
    }
#pragma unroll
    for (int nt = 0; nt < WT::kOutTiles; ++nt)
#pragma unroll
      for (int k = 0; k < 4; ++k) w.o[nt][k] *= alpha[k >> 1];
  }
  const float mu[2] = {w.m[0] == -INFINITY ? 0.f : w.m[0], w.m[1] == -INFINITY ? 0.f : w.m[1]};
  float sum[2] = {0.f, 0.f};
#pragma unroll
  for (int nt = 0; nt < kTiles; ++nt) {
    if (nt >= nn) break;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      s[nt][k] = sm90::fast_exp2(s[nt][k] - mu[k >> 1]);
      sum[k >> 1] += s[nt][k];
    }
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) w.l[i] += sum[i];
  if constexpr (kSlotScales) {
    // The window's V scales; the reference rises (O rescaled by an exact power of two) when one
    // passes it. NaN scales never raise it (fmaxf) and reach O through their P as NaN.
    float2 vs[kTiles];
    float amax = 0.f;
#pragma unroll
    for (int nt = 0; nt < kTiles; ++nt) {
      if (nt >= nn) break;
      vs[nt] = *reinterpret_cast<const float2*>(slot_scale + kS + kb + 8 * nt + 2 * c);
      amax = fmaxf(amax, fmaxf(fabsf(vs[nt].x), fabsf(vs[nt].y)));
    }
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));  // every quad holds the same slots
    if (amax > w.vref) {  // warp-uniform
      int ex = 0;
      frexpf(amax, &ex);  // amax < 2^ex
      const float ref = ldexpf(1.f, min(ex + 4, 127));
      const float alpha = w.vref / ref;  // 0 from the start (O is 0), else 2^-k
#pragma unroll
      for (int nt = 0; nt < WT::kOutTiles; ++nt)
#pragma unroll
        for (int k = 0; k < 4; ++k) w.o[nt][k] *= alpha;
      w.vref = ref;
      w.vinv = 1.f / ref;
    }
#pragma unroll
    for (int nt = 0; nt < kTiles; ++nt) {
      if (nt >= nn) break;
      const float vx = vs[nt].x * w.vinv, vy = vs[nt].y * w.vinv;
      s[nt][0] *= vx;
      s[nt][1] *= vy;
      s[nt][2] *= vx;
      s[nt][3] *= vy;
    }
  }

  // O += P V: P from the S accumulators (keys 16 kk + 2c.. as the A k slots), V through
  // ldmatrix.trans so each register pairs two keys of one head dim.
  const int vrow_in = ((lane >> 3) & 1) * 8 + (lane & 7);
#pragma unroll
  for (int kk = 0; kk < kTiles / 2; ++kk) {
    if (2 * kk >= nn) break;
    const uint32_t a[4] = {sm80::pack2<TM>(s[2 * kk][0], s[2 * kk][1]),
                           sm80::pack2<TM>(s[2 * kk][2], s[2 * kk][3]),
                           sm80::pack2<TM>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                           sm80::pack2<TM>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
    const int vrow = kb + 16 * kk + vrow_in;
    if constexpr (!kFp8) {
#pragma unroll
      for (int qq = 0; qq < WT::kOutDims / 16; ++qq) {
        uint32_t r[4];
        sm80::ldmatrix_x4_trans(r, v_stage + tile_offset<kVLines, kS>(vrow, 2 * qq + (lane >> 4)));
        sm80::mma_16816<TM>(w.o[2 * qq], a, r[0], r[1]);
        sm80::mma_16816<TM>(w.o[2 * qq + 1], a, r[2], r[3]);
      }
    } else {
      // A trans register of fp8 bytes holds [key 2c: d, d+1 | key 2c+1: d, d+1]: bytes 0, 2
      // pair the keys at head dim d, bytes 1, 3 at d + 1 (two n-tiles per segment).
#pragma unroll
      for (int qq = 0; qq < WT::kOutDims / 32; ++qq) {
        uint32_t r[4];
        sm80::ldmatrix_x4_trans(r, v_stage + tile_offset<kVLines, kS>(vrow, 2 * qq + (lane >> 4)));
        uint32_t e[4][2];  // e[i]: register i as its (0, 2) and (1, 3) byte pairs
#pragma unroll
        for (int i = 0; i < 4; ++i) sm80::e4m3x4_pairs_02_13(r[i], e[i][0], e[i][1]);
        sm80::mma_16816<TM>(w.o[4 * qq], a, e[0][0], e[1][0]);
        sm80::mma_16816<TM>(w.o[4 * qq + 1], a, e[0][1], e[1][1]);
        sm80::mma_16816<TM>(w.o[4 * qq + 2], a, e[2][0], e[3][0]);
        sm80::mma_16816<TM>(w.o[4 * qq + 3], a, e[2][1], e[3][1]);
      }
    }
  }
}

}  // namespace msa::cuda::decode
