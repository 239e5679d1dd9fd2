// Consumer warpgroups of the sparse forward: per Q tile, S = Q K^T (wgmma, both operands in
// shared memory), the causal / tail mask and the softmax of one kv block (128 or 64 keys) in
// registers, then
// O = P V (wgmma, P from registers), then the partial epilogue. Called from kernel.cuh.
//
// Thread layout (wgmma m64nN D fragment): warp w of the warpgroup owns rows 16w + lane/4 and
// +8; in each 8-column group n it holds columns 8n + 2 (lane % 4) + {0, 1}. The same registers,
// rounded to 16 bits, are the A fragment of the P V product (k16 step kk = groups 2kk, 2kk+1).
// Numerics: scores in the log2 domain (x = s * scale * log2 e), masked entries are replaced by
// -inf (never multiplied, so NaN in masked K rows cannot leak), a row with no visible key keeps
// max = -inf and uses 0 as its exponent base so that exp2(-inf - base) = 0, never NaN.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "cuda/device/sm90.cuh"
#include "cuda/device/wgmma_m64n128.cuh"
#include "cuda/device/wgmma_m64n256.cuh"
#include "cuda/device/wgmma_m64n64.cuh"
#include "cuda/sm90/sparse_fwd/epilogue.cuh"
#include "cuda/sm90/sparse_fwd/key_mask.h"
#include "cuda/sm90/sparse_fwd/params.h"
#include "cuda/sm90/sparse_fwd/traits.h"

namespace msa::cuda::sparse_fwd {

__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}
// The quad's sums of two values (a thread's shares of its two rows), shuffles interleaved.
__device__ __forceinline__ void quad_sum2(float (&v)[2]) {
  v[0] += __shfl_xor_sync(0xffffffffu, v[0], 1);
  v[1] += __shfl_xor_sync(0xffffffffu, v[1], 1);
  v[0] += __shfl_xor_sync(0xffffffffu, v[0], 2);
  v[1] += __shfl_xor_sync(0xffffffffu, v[1], 2);
}

// The tokens whose rows consumer warp `warp` holds (tile rows 16 warp .. 16 warp + 15, row r of
// token r / G), among the tile's tpt = 64 / G: the first and how many (G = 16: 1; G = 1: 16). With
// a G that does not divide 16 (dense attention takes any G up to 64) a token's rows may straddle
// two warps, which then both read its metadata; rows past tpt G hold no token.
struct WarpTokens {
  int first, count;
};
__device__ __forceinline__ WarpTokens warp_tokens(int group, int tpt, int warp) {
  const int first = (16 * warp) / group;
  const int last = min((16 * warp + 15) / group, tpt - 1);
  return WarpTokens{first, max(0, last - first + 1)};
}

// Arrivals that free a Q buffer. Its metadata readers (each warp's warp_tokens count of lanes)
// when the buffer is released as soon as S is done; every consumer thread when the KV-major path
// stages its bf16 partial tile in the buffer (each writer is then its own arrival, after the TMA
// stores' reads of the tile: consume_tile, release_q_buffer).
__device__ __forceinline__ int q_empty_arrivals(int group, int tpt, bool staged_partials) {
  if (staged_partials) return 128;
  int n = 0;
  for (int w = 0; w < 4; ++w) n += warp_tokens(group, tpt, w).count;
  return n;
}

// Arrivals that free a K/V stage: lane 0 of every consumer warp (wgmma reads the tiles, and the
// lane's arrive follows its warp's wgmma wait), or with FP8 QK every consumer thread, each having
// read key scales of the stage itself (scale_key_columns).
__device__ __forceinline__ uint32_t kv_empty_arrivals(bool fp8, int consumers) {
  return consumers * (fp8 ? 128 : 4);
}

// Metadata of this thread's two rows. Only the lanes that own one of the warp's tokens read shared
// memory (and later arrive on the buffer's q_empty themselves, so each read precedes the release
// as both the memory model and racecheck see it); the others get the values by shuffle.
struct RowMeta {
  int32_t tok0, slot0, lim0, tok1, slot1, lim1;
};
// Rows past the tile's tokens (j >= tpt) get a lane that read nothing: token -1, limit -1.
// wt: warp_tokens of the thread's warp.
__device__ __forceinline__ RowMeta read_row_meta(const TileMeta& meta, const WarpTokens& wt,
                                                 int lane, int j0, int j1) {
  const int first = wt.first;
  int32_t t = -1, sl = -1, li = -1;
  if (lane < wt.count) {
    t = meta.token[first + lane];
    sl = meta.slot[first + lane];
    li = meta.limit[first + lane];
  }
  const unsigned all = 0xffffffffu;
  return RowMeta{__shfl_sync(all, t, j0 - first), __shfl_sync(all, sl, j0 - first),
                 __shfl_sync(all, li, j0 - first), __shfl_sync(all, t, j1 - first),
                 __shfl_sync(all, sl, j1 - first), __shfl_sync(all, li, j1 - first)};
}

// A stage's info struct (a few int32), read by lane 0 of each consumer warp and broadcast; lane 0
// is then the warp's one arrive on kv_empty (with FP8 QK every lane arrives: kv_empty_arrivals).
template <class Info>
__device__ __forceinline__ Info read_info(const Info& src, int lane) {
  static_assert(sizeof(Info) % 4 == 0 && sizeof(Info) <= 16, "info structs are <= 4 int32");
  int32_t v[sizeof(Info) / 4];
#pragma unroll
  for (int i = 0; i < int(sizeof(Info) / 4); ++i) {
    v[i] = lane == 0 ? reinterpret_cast<const int32_t*>(&src)[i] : 0;
    v[i] = __shfl_sync(0xffffffffu, v[i], 0);
  }
  Info out;
  memcpy(&out, v, sizeof(Info));
  return out;
}

// Rows [valid, 128) of a tail block hold the next batch's keys (or zeros past the tensor):
// P is 0 there, but 0 * NaN = NaN, so V's rows are zeroed before any P V product reads them.
// Consumer 0 writes, every consumer warpgroup meets it at the stage's named barrier.
template <int kHalves, int kKeys, int kQSt, int kKVSt, int kCons, int kVSt>
__device__ __forceinline__ void zero_v_tail(
    SharedStorageT<kHalves, kKeys, kQSt, kKVSt, kCons, kVSt>& sh, int stage, int valid,
    int consumer, int tid) {
  if (consumer == 0) {
    const int per_half = (kKeys - valid) * 8;  // 16-byte chunks per 64-column half
    for (int i = tid; i < kHalves * per_half; i += 128) {
      const int half = i / per_half, rem = i - half * per_half;
      uint8_t* dst = sh.v[stage][half] + (valid + rem / 8) * 128 + (rem % 8) * 16;
      *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
    }
    sm90::fence_proxy_async_smem();
  }
  sm90::named_sync(uint32_t(NamedBarrier::kVTailStage0) + stage, kCons * 128);
}

// The block softmax works on both accumulator rows of a thread (kOff 0 and 2) in one straight-line
// pass: the rows' max chains, quad shuffles and exponentials then overlap, where a branch per row
// and per option (temperature, key limit) kept them serial on the consumer's critical path.
// Columns of row kOff past its last visible one set to -inf; called only when a row does not see
// the whole block (the diagonal and batch tails). The 2 kS columns are two halves, the first
// masked past la, the second past lb, each in its own coordinates: the two blocks of a 64-key
// pair (uniform_mma.cuh), or one block of 2 kS keys masked past la (lb = la - kS).
template <int kOff, int kS>
__device__ __forceinline__ void mask_past_limit(float (&s)[kS], int la, int lb, int col_base) {
#pragma unroll
  for (int n = 0; n < kS / 4; ++n) {
    const int lim = n < kS / 8 ? la : lb + kS;
#pragma unroll
    for (int e = 0; e < 2; ++e)
      if (n * 8 + col_base + e > lim) s[n * 4 + kOff + e] = -INFINITY;
  }
}
// Both rows masked to [0, lim]: S of a block of 2 kS keys (kS floats per thread).
template <int kS>
__device__ __forceinline__ void mask_rows_past_limit(float (&s)[kS], int lim0, int lim1,
                                                     int col_base) {
  if (min(lim0, lim1) < 2 * kS - 1) {
    mask_past_limit<0>(s, lim0, lim0 - kS, col_base);
    mask_past_limit<2>(s, lim1, lim1 - kS, col_base);
  }
}
// Both rows of a 64-key pair, each half to its own block's limit (block coordinates).
template <int kS>
__device__ __forceinline__ void mask_rows_past_limits2(float (&s)[kS], int la0, int lb0, int la1,
                                                       int lb1, int col_base) {
  if (min(min(la0, la1), min(lb0, lb1)) < kS - 1) {
    mask_past_limit<0>(s, la0, lb0, col_base);
    mask_past_limit<2>(s, la1, lb1, col_base);
  }
}
// This thread's max of row kOff, four chains.
template <int kOff, int kS>
__device__ __forceinline__ float row_max_local(const float (&s)[kS]) {
  static_assert(kS % 8 == 0, "two column pairs per chain step");
  float m[4] = {s[kOff], s[kOff + 1], s[4 + kOff], s[4 + kOff + 1]};
#pragma unroll
  for (int n = 2; n < kS / 4; n += 2) {
    m[0] = fmaxf(m[0], s[n * 4 + kOff]);
    m[1] = fmaxf(m[1], s[n * 4 + kOff + 1]);
    m[2] = fmaxf(m[2], s[n * 4 + 4 + kOff]);
    m[3] = fmaxf(m[3], s[n * 4 + 4 + kOff + 1]);
  }
  return fmaxf(fmaxf(m[0], m[1]), fmaxf(m[2], m[3]));
}
// The quad's max of both rows' raw scores, shuffles interleaved. The max of the scaled scores is
// the scaled max of the raw ones (scale > 0, rounding is monotone).
template <int kS>
__device__ __forceinline__ void rows_max(const float (&s)[kS], float& m0, float& m1) {
  m0 = row_max_local<0>(s);
  m1 = row_max_local<2>(s);
  m0 = fmaxf(m0, __shfl_xor_sync(0xffffffffu, m0, 1));
  m1 = fmaxf(m1, __shfl_xor_sync(0xffffffffu, m1, 1));
  m0 = fmaxf(m0, __shfl_xor_sync(0xffffffffu, m0, 2));
  m1 = fmaxf(m1, __shfl_xor_sync(0xffffffffu, m1, 2));
}
// p = exp2(s * sl - base) in place for both rows (one FFMA and one EX2 per element), with this
// thread's shares (its columns) of each row's sum of p and (kTemp) of exp2((s * sl - base) / T).
template <bool kTemp, int kS>
__device__ __forceinline__ void exp_rows_local(float (&s)[kS], float sl0, float sl1, float base0,
                                               float base1, float inv_temp, float (&sum)[2],
                                               float (&tsum)[2]) {
  float l0[2] = {0.f, 0.f}, l1[2] = {0.f, 0.f}, t0 = 0.f, t1 = 0.f;
#pragma unroll
  for (int n = 0; n < kS / 4; ++n)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float& x0 = s[n * 4 + e];
      float& x1 = s[n * 4 + 2 + e];
      const float d0 = fmaf(x0, sl0, -base0), d1 = fmaf(x1, sl1, -base1);
      x0 = sm90::fast_exp2(d0);
      x1 = sm90::fast_exp2(d1);
      l0[e] += x0;
      l1[e] += x1;
      if constexpr (kTemp) {
        t0 += sm90::fast_exp2(d0 * inv_temp);
        t1 += sm90::fast_exp2(d1 * inv_temp);
      }
    }
  sum[0] = l0[0] + l0[1];
  sum[1] = l1[0] + l1[1];
  tsum[0] = t0;
  tsum[1] = t1;
}

// Soft-cap (docs/semantics.md, Dense attention): a row's log2-domain score y = s * scale_log2 (the
// row's scale, FP8 q scale included) becomes C tanh(y / C), C = soft_cap * log2(e), in place; the
// row's scale is then 1 (returned). tanh(u) = 1 - 2 / (exp(2u) + 1), exp by ex2.approx: relative
// error ~1e-6 against the CPU's tanh, and exactly +-C where exp(2u) overflows or underflows.
// Columns past the row's limit are transformed too and masked afterwards as usual.
template <int kOff, int kS>
__device__ __forceinline__ float soft_cap_row(float (&s)[kS], float scale_log2, float cap_log2) {
  const float k = scale_log2 / cap_log2 * 2.8853900817779268f;  // 2 log2(e) / C per raw unit
  const float c2 = 2.f * cap_log2;
#pragma unroll
  for (int n = 0; n < kS / 4; ++n)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float& x = s[n * 4 + kOff + e];
      x = cap_log2 - __fdividef(c2, sm90::fast_exp2(x * k) + 1.f);
    }
  return 1.f;
}

// Both rows masked to their visible columns and exponentiated (values replaced by
// p = exp2(x - max), x = s * sl the log2-domain score; base 0 for a row without a visible key),
// with the rows' statistics.
template <bool kTemp, int kS>
__device__ __forceinline__ void softmax_rows(float (&s)[kS], int lim0, int lim1, int col_base,
                                             float sl0, float sl1, float inv_temp, RowStats& st0,
                                             RowStats& st1) {
  mask_rows_past_limit(s, lim0, lim1, col_base);
  float m0, m1;
  rows_max(s, m0, m1);
  const float mx0 = m0 * sl0, mx1 = m1 * sl1;
  float sum[2], tsum[2];
  exp_rows_local<kTemp>(s, sl0, sl1, mx0 == -INFINITY ? 0.f : mx0, mx1 == -INFINITY ? 0.f : mx1,
                        inv_temp, sum, tsum);
  quad_sum2(sum);
  if constexpr (kTemp) quad_sum2(tsum);
  st0 = RowStats{mx0, sum[0], tsum[0]};
  st1 = RowStats{mx1, sum[1], tsum[1]};
}

// Key masks (key_mask.h, the kMask kernels): the packed row of query token `tok` (null for a
// padding row, whose values are never stored), a block's words of it (all visible for a null row;
// none for a block past the mask's Lk_max, a request the pack kernel reported as key_mask_short),
// and S's invisible columns set to -inf. Applied after the soft-cap (which would map -inf to -cap)
// and before the causal mask and the max.
__device__ __forceinline__ const uint32_t* mask_row(const AttnProblem& p, int32_t tok) {
  if (tok < 0) return nullptr;
  const int64_t r = p.mask_token_row != nullptr ? p.mask_token_row[tok] : tok;
  return p.mask_bits + r * p.mask_words;
}
// kKeys: keys per block of kb, 128 (4 words) or 64 (2 words: the head-dim-256 stages).
template <int kKeys>
__device__ __forceinline__ uint4 mask_block(const AttnProblem& p, const uint32_t* row,
                                            int32_t kb) {
  if (row == nullptr) return make_uint4(~0u, ~0u, ~0u, ~0u);
  constexpr int kWords = kKeys / 32;
  const int64_t w = int64_t(kb) * kWords;
  if (w >= p.mask_words) return make_uint4(0u, 0u, 0u, 0u);
  if constexpr (kWords == 2) {
    const uint2 m = __ldg(reinterpret_cast<const uint2*>(row + w));
    return make_uint4(m.x, m.y, 0u, 0u);
  } else {
    return __ldg(reinterpret_cast<const uint4*>(row + w));
  }
}
// Column 8 n + col_base + e of the block is bit 8 (n % 4) + col_base + e of word n / 4.
template <int kOff, int kS>
__device__ __forceinline__ void apply_key_mask(float (&s)[kS], uint4 m, int col_base) {
  const uint32_t w[4] = {m.x >> col_base, m.y >> col_base, m.z >> col_base, m.w >> col_base};
#pragma unroll
  for (int n = 0; n < kS / 4; ++n)
#pragma unroll
    for (int e = 0; e < 2; ++e)
      if ((w[n >> 2] & (1u << (8 * (n & 3) + e))) == 0) s[n * 4 + kOff + e] = -INFINITY;
}

// P (the S accumulator after softmax) as the A operand of P V: 16-bit pairs per k16 step (kS / 8
// steps over the 2 kS keys).
template <bool kF16, int kS>
__device__ __forceinline__ void pack_probs(const float (&sc)[kS], uint32_t (&pa)[kS / 8][4]) {
#pragma unroll
  for (int kk = 0; kk < kS / 8; ++kk) {
    pa[kk][0] = pack_pair<kF16>(sc[(2 * kk) * 4 + 0], sc[(2 * kk) * 4 + 1]);
    pa[kk][1] = pack_pair<kF16>(sc[(2 * kk) * 4 + 2], sc[(2 * kk) * 4 + 3]);
    pa[kk][2] = pack_pair<kF16>(sc[(2 * kk + 1) * 4 + 0], sc[(2 * kk + 1) * 4 + 1]);
    pa[kk][3] = pack_pair<kF16>(sc[(2 * kk + 1) * 4 + 2], sc[(2 * kk + 1) * 4 + 3]);
  }
}

// S = Q K^T for a 64-row tile, issued (not committed): 16-bit operands in kD / 64 64-column
// halves (a k16 step is 32 bytes inside a 128-byte row; half h of D is the h-th buffer), or with
// kFp8 e4m3 operands (D = 128), one 128-byte row per token or key (four k32 steps of 32 bytes).
// K-major, 128-byte swizzle; the first step overwrites S.
// kS: S's floats per thread, 64 for a 128-key K tile (m64n128), 32 for 64 keys (m64n64: D = 256,
// or a 64-key block), whose 16-bit halves are then 8 KB apart.
template <bool kF16, bool kFp8, int kD = kHeadDim, int kS>
__device__ __forceinline__ void issue_qk(float (&s)[kS], uint32_t q_addr, uint32_t k_addr) {
  static_assert(!kFp8 || (kD == kHeadDim && (kS == 64 || kS == 32)),
                "FP8 Q K^T reads 128-byte rows: D = 128, 128 or 64 keys");
  constexpr uint32_t kKHalfBytes = uint32_t(kS) * 2 * 128;  // 2 kS keys of 128 bytes
  // Each operand's descriptor is encoded once and offset per k-step (sm90::desc_offset): encoding
  // it per wgmma took five uniform instructions each, ~60 of a block's ~640 consumer instructions
  // on the path that the other warpgroup's turn waits for (ncu, P32K-blk).
  const uint64_t dq = sm90::wgmma_desc_sw128(q_addr, 16, 1024);
  const uint64_t dk = sm90::wgmma_desc_sw128(k_addr, 16, 1024);
  // At D = 64 each k-step's descriptors are the encoded ones plus the offset in one 64-bit add
  // (UIADD3.64), not desc_offset's 32-bit add with a move of the constant high word per wgmma:
  // the dense loop's UMOV 25 -> 9; DENSE-16K-D64 5.00-5.16 -> 4.89-4.91 ms (H100). At D = 128
  // the 64-bit adds measured slower (docs, Tried and dropped).
  if constexpr (kD == 64 && !kFp8) {  // one 64-column half: k-step kk is 32 bytes in
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk)
      sm90::wgmma_ss<kF16>(s, dq + kk * 32 / 16, dk + kk * 32 / 16, kk > 0 ? 1u : 0u);
  } else if constexpr (kFp8) {
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 32; ++kk)
      sm90::wgmma_ss_e4m3(s, sm90::desc_offset(dq, kk * 32), sm90::desc_offset(dk, kk * 32),
                          kk > 0 ? 1u : 0u);
  } else {
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk)
      sm90::wgmma_ss<kF16>(s, sm90::desc_offset(dq, (kk >> 2) * kQHalfBytes + (kk & 3) * 32),
                           sm90::desc_offset(dk, (kk >> 2) * kKHalfBytes + (kk & 3) * 32),
                           kk > 0 ? 1u : 0u);
  }
}

// O (+)= P V, P from registers, issued (not committed). MN-major V: 16 keys are two 8-row groups
// (SBO 1024 B); the two 64-column halves of D = 128 are LBO = 16 KB apart (D = 64: one half, the
// m64n64 form, picked by O's 32 floats; D = 256: m64n256, 128 floats). kSteps k16 steps: 8 for a
// 128-key V tile, 4 for 64 keys (halves 8 KB apart). Without accumulate the first step overwrites O.
template <bool kF16, int kN, int kSteps>
__device__ __forceinline__ void issue_pv(float (&o)[kN], const uint32_t (&pa)[kSteps][4],
                                         uint32_t v_addr, bool accumulate) {
  const uint64_t dv = sm90::wgmma_desc_sw128(v_addr, kSteps * 16 * 128, 1024);
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk)
    sm90::wgmma_rs_tb<kF16>(o, pa[kk],  // D = 64 (kN 32): a 64-bit add, as issue_qk
                            kN == 32 ? dv + kk * 2048 / 16 : sm90::desc_offset(dv, kk * 2048),
                            (accumulate || kk > 0) ? 1u : 0u);
}

// FP8 QK: the K scales of this thread's columns (8n + col_base + {0, 1}) of a stage of 2 kS keys
// (kS: S's floats per thread) from the stage's kscale row (consume_tile reads them while its S
// product is in flight); S takes them before the mask, which replaces invisible entries whatever
// they hold.
template <int kS>
struct KeyScales {
  float2 v[kS / 4];
};
template <int kS>
__device__ __forceinline__ KeyScales<kS> load_key_columns(const float* kscale, int col_base) {
  KeyScales<kS> k;
#pragma unroll
  for (int n = 0; n < kS / 4; ++n)
    k.v[n] = *reinterpret_cast<const float2*>(kscale + 8 * n + col_base);
  return k;
}
// One K scale for every key, as a factor of the rows' score scales: a zero scale becomes 1e-30,
// as q's (params.h row_scale_log2: -inf * 0 would be NaN for a row without a visible key).
__device__ __forceinline__ float uniform_key_scale(const float* kscale) {
  const float k = kscale[0];
  return k == 0.f ? 1e-30f : k;
}
template <int kS>
__device__ __forceinline__ void scale_key_columns(float (&s)[kS], const KeyScales<kS>& k) {
#pragma unroll
  for (int n = 0; n < kS / 4; ++n) {
    s[n * 4 + 0] *= k.v[n].x;
    s[n * 4 + 1] *= k.v[n].y;
    s[n * 4 + 2] *= k.v[n].x;
    s[n * 4 + 3] *= k.v[n].y;
  }
}

// A consumer thread's place in every Q tile, fixed for the kernel (computed once: recomputed per
// tile, the divisions by the group were ~60 of a tile's ~870 instructions per warp, ncu P8K-tok).
// Rows r0 = 16 warp + lane / 4 and r1 = r0 + 8 are heads g0 / g1 of the tile's tokens j0 / j1.
struct TileRows {
  int warp, lane, j0, g0, j1, g1, col_base;
  WarpTokens wt;
};
__device__ __forceinline__ TileRows tile_rows(const MainParams& p, int tid) {
  TileRows t;
  t.warp = tid >> 5;
  t.lane = tid & 31;
  const int r0 = t.warp * 16 + (t.lane >> 2), r1 = r0 + 8;
  t.j0 = r0 / p.group;
  t.g0 = r0 - t.j0 * p.group;
  t.j1 = r1 / p.group;
  t.g1 = r1 - t.j1 * p.group;
  t.col_base = 2 * (t.lane & 3);
  t.wt = warp_tokens(p.group, p.tokens_per_tile, t.warp);
  return t;
}

// kBlk: keys per kv block, 128 (S m64n128) or 64 (S m64n64, P V k64; FP8 Q K^T m64n64k32).
// kD: the head dim, 64, 128 or 256 (S in D / 16 k16 steps, O m64nD: D / 2 floats per thread;
// KVMajorTraits).
// v_parity: the chunk's phase of v_full[0] where V has a ring of its own (KVMajorTraits::kSplitV:
// V is waited for before P V), else unused (V landed with K).
// kMerge (the merging kernel, merge.cuh): the staged tile goes to its store warp through
// ma->staged instead of this consumer's TMA stores.
template <bool kF16, bool kFp8, bool kMask, int kBlk, int kD, bool kMerge = false>
__device__ __forceinline__ void consume_tile(const MainParams& p,
                                             KVMajorStorage<kBlk, kD>& sh,
                                             const ChunkInfo& info, int kv_stage, int consumer,
                                             int q_stage, const TileRows& tr, uint32_t v_parity,
                                             MergeArea* ma = nullptr) {
  using KT = KVMajorTraits<kBlk, kD>;
  constexpr int kS = kBlk / 2;  // S floats per thread
  constexpr int kO = kD / 2;    // O floats per thread
  const int warp = tr.warp, lane = tr.lane;
  const int j0 = tr.j0, g0 = tr.g0, j1 = tr.j1, g1 = tr.g1;
  const int col_base = tr.col_base;
  const RowMeta rm =
      read_row_meta(sh.meta[consumer][q_stage], tr.wt, lane, j0, j1);
  const int32_t tok0 = rm.tok0, slot0 = rm.slot0, lim0 = rm.lim0;
  const int32_t tok1 = rm.tok1, slot1 = rm.slot1, lim1 = rm.lim1;

  float s[kS];
#pragma unroll
  for (int i = 0; i < kS; ++i) s[i] = 0.f;
  const uint32_t q_addr = sm90::smem_addr(sh.q[consumer][q_stage][0]);
  const uint32_t k_addr = sm90::smem_addr(sh.k[kv_stage][0]);
  sm90::wgmma_fence();
  issue_qk<kF16, kFp8, kD>(s, q_addr, k_addr);
  sm90::wgmma_commit();
  KeyScales<kS> ks;
  float kmul = 1.f;  // FP8 QK with one K scale: it joins the row scales below
  if constexpr (kFp8) {
    if (p.kscale_uniform) kmul = uniform_key_scale(sh.kscale[kv_stage]);
    else ks = load_key_columns<kS>(sh.kscale[kv_stage], col_base);
  }
  sm90::wgmma_wait<0>();
  if constexpr (kFp8) {
    if (!p.kscale_uniform) scale_key_columns(s, ks);
  }
  // f32 partials (and any at D = 256): the Q buffer and metadata are free once every warp's share
  // of the product has completed; the metadata readers of each warp arrive (q_empty_arrivals).
  // Staged bf16 partials: the buffer stages the partial tile first and is freed later
  // (release_q_buffer).
  const WarpTokens wt = tr.wt;
  constexpr bool kStaged = KT::kStagedPartials;
  if (!(kStaged && p.part_bf16) && lane < wt.count)
    sm90::mbar_arrive(&sh.q_empty[consumer][q_stage]);

  float sl0 = row_scale_log2(p, tok0, info.head * p.group + g0) * kmul;
  float sl1 = row_scale_log2(p, tok1, info.head * p.group + g1) * kmul;
  if (p.soft_cap_log2 > 0.f) {
    sl0 = soft_cap_row<0>(s, sl0, p.soft_cap_log2);
    sl1 = soft_cap_row<2>(s, sl1, p.soft_cap_log2);
  }
  if constexpr (kMask) {  // the rows' mask words of this block (read after S: few registers live)
    apply_key_mask<0>(s, mask_block<kBlk>(p, mask_row(p, tok0), info.kb), col_base);
    apply_key_mask<2>(s, mask_block<kBlk>(p, mask_row(p, tok1), info.kb), col_base);
  }
  RowStats st0, st1;
  if (p.inv_temperature > 0.f)
    softmax_rows<true>(s, lim0, lim1, col_base, sl0, sl1, p.inv_temperature, st0, st1);
  else
    softmax_rows<false>(s, lim0, lim1, col_base, sl0, sl1, 0.f, st0, st1);

  uint32_t pa[kS / 8][4];
  pack_probs<kF16>(s, pa);

  float o[kO];
#pragma unroll
  for (int i = 0; i < kO; ++i) o[i] = 0.f;
  if constexpr (KT::kSplitV) sm90::mbar_wait(&sh.v_full[0], v_parity);
  const uint32_t v_addr = sm90::smem_addr(sh.v[KT::kSplitV ? 0 : kv_stage][0]);
  sm90::wgmma_fence();
  issue_pv<kF16>(o, pa, v_addr, false);
  sm90::wgmma_commit();
  sm90::wgmma_wait<0>();

  const bool lead = (lane & 3) == 0;
  // Entries (token, kv head, slot) number Hkv * total_q * topk < 2^31 (plan.cpp): int32 index
  // math, the partial rows' int64 index only at the end.
  const int32_t head_base = info.head * int32_t(p.total_q);
  if (kStaged && p.part_bf16) {
    // Unnormalised bf16 rows into this tile's Q buffer (the wgmma layout: D / 64 64-column
    // halves, 128-byte swizzle), then one TMA store per half for each of the warp's tokens (G
    // rows, a contiguous [G, D] block of part_o): full-line L2 writes instead of half-sector ones.
    uint8_t* buf = sh.q[consumer][q_stage][0];
    stage_partial_tile(buf, o, warp, lane);  // rows without a token are never stored
    sm90::fence_proxy_async_smem();
    if constexpr (kMerge) {
      // The LSE rows before `staged`: its store warp counts the tile's arrivals after it.
      if (lead && tok0 >= 0)
        store_partial_lse(p, int64_t((head_base + tok0) * p.topk + slot0) * p.group + g0, st0);
      if (lead && tok1 >= 0)
        store_partial_lse(p, int64_t((head_base + tok1) * p.topk + slot1) * p.group + g1, st1);
      sm90::mbar_arrive(&ma->staged[consumer][q_stage]);
      sm90::mbar_arrive(&sh.q_empty[consumer][q_stage]);  // with the store warp's 32 (merge.cuh)
      return;
    }
    __syncwarp();
    if (lane < wt.count) {  // the KV-major kernel runs G in {1, 2, 4, 8, 16}: whole tokens
      const TileMeta& meta = sh.meta[consumer][q_stage];
      const int first = wt.first;
      const int32_t t = meta.token[first + lane], sl = meta.slot[first + lane];
      if (t >= 0) {
        const int32_t entry = (head_base + t) * p.topk + sl;
        const int row = (first + lane) * p.group;  // the token's first row in the tile
#pragma unroll
        for (int half = 0; half < kD / kHalfCols; ++half)
          sm90::tma_store_3d(&p.tm_part, buf + half * kQHalfBytes + row * 128, half * kHalfCols,
                             0, entry);
      }
      sm90::bulk_commit();
    }
    if (lead && tok0 >= 0)
      store_partial_lse(p, int64_t((head_base + tok0) * p.topk + slot0) * p.group + g0, st0);
    if (lead && tok1 >= 0)
      store_partial_lse(p, int64_t((head_base + tok1) * p.topk + slot1) * p.group + g1, st1);
    return;
  }
  if (tok0 >= 0)
    store_partial_row<0, !kStaged>(
        p, o, int64_t((head_base + tok0) * p.topk + slot0) * p.group + g0, col_base, lead, st0);
  if (tok1 >= 0)
    store_partial_row<2, !kStaged>(
        p, o, int64_t((head_base + tok1) * p.topk + slot1) * p.group + g1, col_base, lead, st1);
}

// Frees a Q buffer whose tile staged its bf16 partials: every consumer thread arrives, the lanes
// that issued TMA stores once those have read the buffer.
template <class Storage>
__device__ __forceinline__ void release_q_buffer(Storage& sh, int consumer, int stage) {
  sm90::bulk_wait_read<0>();
  sm90::mbar_arrive(&sh.q_empty[consumer][stage]);
}

template <bool kF16, bool kFp8, bool kMask, int kBlk, int kD, bool kMerge = false>
__device__ __forceinline__ void run_consumer(const MainParams& p,
                                             KVMajorStorage<kBlk, kD>& sh, int consumer_in,
                                             int tid, MergeArea* ma = nullptr) {
  // Warp-uniform for ptxas (lane-0 broadcast): the wgmma descriptors derived from it stay in
  // uniform registers instead of being moved there (R2UR) before every wgmma.
  const int consumer = __shfl_sync(0xffffffffu, consumer_in, 0);
  const TileRows tr = tile_rows(p, tid);
  using KT = KVMajorTraits<kBlk, kD>;
  using KVRingT = sm90::Ring<KT::kKVSt>;
  using QRingT = sm90::Ring<KT::kQSt>;
  constexpr int kCons = KT::kCons;
  int32_t kv_iter = 0;
  // Tiles this consumer has taken: its use of its ring of Q stages (two consumers: T / 2 of the
  // 64-bit tile counter).
  std::conditional_t<KT::kSplitV, uint32_t, uint64_t> q_use = 0;
  // Two counters where one would do, so that the two-consumer kernels keep the SASS they were
  // measured with: three consumers count their tiles of earlier chunks mod 3 (rot), two the
  // global tile counter T at the start of the chunk (tile_base).
  int rot = 0;
  int64_t tile_base = 0;
  int pending = -1;  // staged partials: Q stage of this consumer's previous tile, not yet freed
  uint32_t my_tiles = 0;  // kMerge: tiles this consumer has staged
  while (true) {
    const int s = KVRingT::stage(kv_iter);
    sm90::mbar_wait(&sh.kv_full[s], KVRingT::full_parity(kv_iter));
    const ChunkInfo info = read_info(sh.info[s], tid & 31);
    if (info.n_tiles < 0) break;
    const uint32_t v_parity = sm90::Ring<1>::full_parity(kv_iter);  // kSplitV
    if (info.valid_keys < kBlk) {
      if constexpr (KT::kSplitV) {
        sm90::mbar_wait(&sh.v_full[0], v_parity);
        zero_v_tail(sh, 0, info.valid_keys, consumer, tid);
      } else {
        zero_v_tail(sh, s, info.valid_keys, consumer, tid);
      }
    }
    // My tiles: T = (tiles of earlier chunks) + j with T % kCons == consumer, each the next use
    // of this consumer's ring of Q stages (two consumers: use T / 2).
    int j;
    if constexpr (KT::kSplitV) {
      j = consumer - rot;
      if (j < 0) j += kCons;
    } else {
      j = int((consumer - tile_base) & 1);
    }
    for (; j < info.n_tiles; j += kCons) {
      if constexpr (!KT::kSplitV) q_use = uint64_t(tile_base + j) >> 1;
      const int q_stage = QRingT::stage(q_use);
      // The previous tile's buffer (the other stage) is freed here, a tile after its TMA stores
      // were issued, so their reads are long done and nothing waits.
      if (!kMerge && pending >= 0) release_q_buffer(sh, consumer, pending);
      sm90::mbar_wait(&sh.q_full[consumer][q_stage], QRingT::full_parity(q_use));
      consume_tile<kF16, kFp8, kMask, kBlk, kD, kMerge>(p, sh, info, s, consumer, q_stage, tr,
                                                       v_parity, ma);
      if constexpr (kMerge) ++my_tiles;
      else pending = KT::kStagedPartials && p.part_bf16 ? q_stage : -1;
      if constexpr (KT::kSplitV) ++q_use;
    }
    if constexpr (KT::kSplitV) {
      rot = (rot + info.n_tiles) % kCons;
      // V's stage is released only after it landed: a consumer without tiles here would
      // otherwise arrive for this chunk while the others still hold the previous one's.
      sm90::mbar_wait(&sh.v_full[0], v_parity);
      if ((tid & 31) == 0) sm90::mbar_arrive(&sh.v_empty[0]);
    } else {
      tile_base += info.n_tiles;
    }
    if (kFp8 || (tid & 31) == 0) sm90::mbar_arrive(&sh.kv_empty[s]);  // kv_empty_arrivals
    ++kv_iter;
  }
  if constexpr (kMerge) {
    // The end for the store warp: its next wait on `staged` (buffer s) finds cons_done[s] set.
    // First the store warp must have taken this buffer's previous tile (that tile's q_empty
    // phase), the last read of the flag before this write: `staged` may run at most one phase
    // ahead of its waits, which tiles ensure by needing their Q. The other buffer's flag stays
    // clear, as the store warp may read it for the last tile after this write.
    const int s = QRingT::stage(my_tiles);
    sm90::mbar_wait(&sh.q_empty[consumer][s], sm90::Ring<1>::empty_parity(my_tiles / kQStages));
    if (tid == 0) ma->cons_done[consumer][s] = 1;
    sm90::mbar_arrive(&ma->staged[consumer][s]);
    return;
  }
  if (pending >= 0) release_q_buffer(sh, consumer, pending);
  sm90::bulk_wait<0>();  // the partial stores are complete before the CTA exits
}

}  // namespace msa::cuda::sparse_fwd
