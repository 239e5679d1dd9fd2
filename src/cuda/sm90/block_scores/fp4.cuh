// FP4 inputs of the sm_90a indexer (NVFP4, MXFP4; docs/semantics.md, Quantized formats): Hopper has
// no FP4 MMA, so the producer warpgroup converts. Each value times its block scale is exact in bf16
// (an e2m1 value has 2 significant bits, an e4m3 scale 4, an e8m0 scale 1; bf16 holds 8 and
// every exponent either can reach), so the bf16 wgmma's products equal the CPU reference's and
// only the fp32 accumulation differs; the NVFP4 global scales multiply each score (Fp4Params).
// FP8 operands would run the MMA twice as fast but round value * scale (NVFP4 products need 5
// significant bits, e4m3 holds 4), so the FP4 indexer is bf16-bound (716 TFLOP/s measured).
//
// Roles (kernel.cuh): the converters are the producer warpgroup's 4 warps in the narrow
// (unfused) kernel and its warps 0 and 3 in the wide (fused) one, where warps 1-2 select.
// - Q once: each (row, 64-value half) read from global memory, converted into the row group's
//   swizzled tile, then one arrival per converter on q_full.
// - Each K block: its 256 (key, half) units copied by cp.async (zeros past the batch's keys or
//   for a page id out of range) into a raw slot kFp4RawSlots - 1 blocks ahead; every converter
//   converts exactly the units it copied (no barrier on the raw ring: cp.async.wait_group
//   suffices), waits for the stage to be free, writes the stage's 128-byte-swizzled bf16 rows,
//   fences the generic-proxy stores for wgmma, and arrives on k_full (one arrival per converter).
// Called from kernel.cuh.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/fp4_scale_layout.h"
#include "cuda/device/sm90.cuh"
#include "cuda/sm90/block_scores/work.cuh"

namespace msa::cuda::indexer_sm90 {

using sm90::prmt;
__device__ __forceinline__ uint32_t mul_bf16x2(uint32_t a, uint32_t b) {
  uint32_t r;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}

// Four e2m1 values (the nibbles of w's low 16 bits, element i at bits 4i..4i+3) as two bf16x2
// words, by byte tables (prmt) instead of arithmetic: the bf16 patterns of the magnitudes
// 0, 0.5, 1, 1.5, 2, 3, 4, 6 have high bytes 00 3F 3F 3F 40 40 40 40 and low bytes
// 00 00 80 C0 00 40 80 C0. The signs (nibble bit 3) go to bit 7 of each high byte: bytes
// [b0, b0, b1, b1] of w put elements 1 and 3's at bits 15 and 31 and elements 0 and 2's four
// bits below 7 and 23.
__device__ __forceinline__ void e2m1x4_to_bf16x2(uint32_t w, uint32_t& o0, uint32_t& o1) {
  const uint32_t mag = w & 0x7777u;
  const uint32_t hi = prmt(0x3F3F3F00u, 0x40404040u, mag), lo = prmt(0xC0800000u, 0xC0804000u, mag);
  const uint32_t d = prmt(w, 0u, 0x1100u);
  const uint32_t hs = hi | ((d << 4) & 0x00800080u) | (d & 0x80008000u);
  o0 = prmt(lo, hs, 0x5140u);  // [lo0, hi0, lo1, hi1]: elements 0, 1
  o1 = prmt(lo, hs, 0x7362u);  // elements 2, 3
}

// Scale bytes as bf16x2 pairs (both halves the scale; exact: e4m3 and e8m0 values are bf16
// values). NVFP4: two e4m3 bytes (b0 | b1 << 8) at once by the hardware's e4m3x2 -> f16x2
// conversion (subnormals and NaN included), widened to f32 and packed to bf16 (exact); the
// codec's branchy decoder was a tenth of the converters' instructions. MXFP4: 2^(x - 127) is
// the bf16 pattern x << 7, but for 0 (2^-127, the subnormal 0x0040) and 0xff (NaN).
__device__ __forceinline__ void e4m3x2_scales(uint32_t two, uint32_t& s0, uint32_t& s1) {
  uint32_t h;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"(uint16_t(two)));
  const float f0 = __half2float(__ushort_as_half(uint16_t(h))), f1 = __half2float(__ushort_as_half(uint16_t(h >> 16)));
  const __nv_bfloat162 v = __floats2bfloat162_rn(f0, f1);  // [f0, f1]
  uint32_t b;
  memcpy(&b, &v, 4);
  s0 = prmt(b, 0u, 0x1010u);
  s1 = prmt(b, 0u, 0x3232u);
}
__device__ __forceinline__ uint32_t e8m0_scale(uint32_t x) {
  const uint32_t b = x == 0u ? 0x0040u : x == 0xffu ? 0x7fc0u : x << 7;
  return b | (b << 16);
}

// One unit: 64 values (32 packed bytes v0, v1) with their scales (sc: NVFP4, the unit's four
// e4m3 bytes; MXFP4, the row's four e8m0 bytes, of which this half's two are used) into the
// 128-byte row `row` of a 128-byte-swizzled tile (16-byte chunk c at c ^ (r & 7), r = the row's
// index in the tile).
__device__ __forceinline__ void convert_unit(const uint4& v0, const uint4& v1, uint32_t sc,
                                             bool nvfp4, int half, uint32_t row, int r) {
  const uint32_t w[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
  // NVFP4: chunk c's scale is the unit's byte c / 2; MXFP4: the row's byte 2 half + c / 4.
  uint32_t s4[4];
  if (nvfp4) {
    e4m3x2_scales(sc & 0xffffu, s4[0], s4[1]);
    e4m3x2_scales(sc >> 16, s4[2], s4[3]);
  } else {
    s4[0] = s4[1] = e8m0_scale((sc >> (16 * half)) & 0xffu);
    s4[2] = s4[3] = e8m0_scale((sc >> (16 * half + 8)) & 0xffu);
  }
#pragma unroll
  for (int c = 0; c < 8; ++c) {  // chunk c: values 8c .. 8c + 7 of the half
    const uint32_t s2 = s4[c >> 1];
    uint4 o;
    e2m1x4_to_bf16x2(w[c], o.x, o.y);
    e2m1x4_to_bf16x2(w[c] >> 16, o.z, o.w);
    o.x = mul_bf16x2(o.x, s2);
    o.y = mul_bf16x2(o.y, s2);
    o.z = mul_bf16x2(o.z, s2);
    o.w = mul_bf16x2(o.w, s2);
    sm90::st_shared_u32x4(row + (uint32_t(c ^ (r & 7)) << 4), o);
  }
}

// Byte offsets of row (a, b, head) of x (Fp4Rows).
__device__ __forceinline__ int64_t value_off(const Fp4Rows& x, int64_t a, int64_t b, int64_t head) {
  return a * x.v_stride[0] + b * x.v_stride[1] + head * x.v_stride[2];
}
// The 4 scale bytes a unit reads: NVFP4, the half's four (groups 4 half .. 4 half + 3); MXFP4,
// the row's four. In the preordered layout both are one tile's 4 contiguous bytes of the row.
__device__ __forceinline__ int64_t scale_off(const Fp4Rows& x, int64_t a, int64_t b, int64_t head, int half) {
  if (x.preordered) {
    const int64_t l = x.pool ? a * x.heads + head : head, m = x.pool ? b : a;
    return fp4_layout::row_offset(l, m, x.rest_m, x.rest_g) + (x.nvfp4 ? half * fp4_layout::kTileBytes : 0);
  }
  return a * x.s_stride[0] + b * x.s_stride[1] + head * x.s_stride[2] + (x.nvfp4 ? 4 * half : 0);
}

// Q: the CTA's R row groups (row i of group r: token t0 + r * 64 / G + i / G, head h G + i % G),
// zeros for tokens past total_q, as the TMA path's fill.
template <int kConv>
__device__ void convert_q(const Params& p, SharedStorage& sh, int64_t h, int64_t t0, int tid) {
  constexpr int kHalfQ = kTileM * kRowBytes;
  const Fp4Rows& q = p.fp4.q;
  const bool nv = q.nvfp4 != 0;
  const int units = p.row_groups * kTileM * 2;
  for (int u = tid; u < units; u += kConv) {
    const int half = u & 1, i = (u >> 1) & (kTileM - 1), r = u / (2 * kTileM);
    const int64_t t = t0 + r * (kTileM / p.group) + i / p.group, hq = h * p.group + i % p.group;
    uint4 v0{}, v1{};
    uint32_t sc = 0;
    if (t < p.total_q) {
      const uint4* src = reinterpret_cast<const uint4*>(q.values + value_off(q, t, 0, hq) + 32 * half);
      v0 = src[0];
      v1 = src[1];
      sc = *reinterpret_cast<const uint32_t*>(q.scales + scale_off(q, t, 0, hq, half));
    }
    convert_unit(v0, v1, sc, nv, half, sm90::smem_addr(sh.q[r] + half * kHalfQ + i * kRowBytes), i);
  }
}

static_assert(kFp4Units % 128 == 0 && kFp4Units % 64 == 0, "every converter owns whole units");

// Issues this converter's cp.async copies of block kb of segment seg into raw slot `raw`.
template <int kConv>
__device__ __forceinline__ void copy_raw(const Params& p, uint8_t* raw, const Segment& seg, int kb,
                                         int64_t h, int tid) {
  const Fp4Rows& k = p.fp4.k;
  const bool paged = p.paged.page_table != nullptr;
#pragma unroll
  for (int i = 0; i < kFp4Units / kConv; ++i) {
    const int u = tid + i * kConv;
    const int key = u >> 1, half = u & 1;
    const int32_t j = kb * kBlockN + key;  // batch-local, < 2^31 (launch.cu)
    bool in = j < seg.lk;
    int64_t a = seg.k0 + j, b = 0;  // flat: the key's token
    if (paged) {  // the pool slot (docs/semantics.md, Paged KV); a bad page id reads nothing
      const int32_t id = in ? p.paged.page_table[seg.k0 * p.paged.page_table_stride + (j >> p.paged.page_shift)] : -1;
      in = in && id >= 0 && id < p.paged.num_pages;
      a = id;
      b = j & ((1 << p.paged.page_shift) - 1);
    }
    const uint8_t* vsrc = in ? k.values + value_off(k, a, b, h) + 32 * half : k.values;
    const uint8_t* ssrc = in ? k.scales + scale_off(k, a, b, h, half) : k.scales;
    const uint32_t dst = sm90::smem_addr(raw + u * 32);
    sm90::cp_async_16(dst, vsrc, in ? 16u : 0u);
    sm90::cp_async_16(dst + 16, vsrc + 16, in ? 16u : 0u);
    sm90::cp_async_4(sm90::smem_addr(raw + kFp4Units * 32 + u * 4), ssrc, in ? 4u : 0u);
  }
}

// Converts this converter's units of raw slot `raw` into K stage `kst`.
template <int kConv>
__device__ __forceinline__ void convert_raw(const Params& p, const uint8_t* raw, uint8_t* kst, int tid) {
  constexpr int kHalfK = kBlockN * kRowBytes;
  const bool nv = p.fp4.k.nvfp4 != 0;
  // Both (narrow) or all four (wide) units of this thread unrolled, so that their independent
  // chains interleave: the converters are latency-bound (ncu: a warp instruction issued every
  // ~5 cycles, most stalls on fixed-latency dependencies).
#pragma unroll
  for (int i = 0; i < kFp4Units / kConv; ++i) {
    const int u = tid + i * kConv;
    const int key = u >> 1, half = u & 1;
    const uint32_t src = sm90::smem_addr(raw + u * 32);
    const uint4 v0 = sm90::ld_shared_u32x4(src), v1 = sm90::ld_shared_u32x4(src + 16);
    const uint32_t sc = sm90::ld_shared_u32(sm90::smem_addr(raw + kFp4Units * 32 + u * 4));
    convert_unit(v0, v1, sc, nv, half, sm90::smem_addr(kst + half * kHalfK + key * kRowBytes), key);
  }
}

// The converter role: Q, then every K block of the CTA's items (kConv converter threads, tid in
// [0, kConv); kBlk: the items' count, work.cuh).
template <int kConv, int kBlk, bool kSplit>
__device__ void run_fp4_converter(const Params& p, SharedStorage& sh, int64_t h, int64_t t0,
                                  int64_t t1, int tid) {
  convert_q<kConv>(p, sh, h, t0, tid);
  sm90::fence_proxy_async_smem();
  sm90::mbar_arrive(&sh.q_full);
  const ItemRange range = cta_items<kBlk, kSplit>(p, t0, t1);
  const int n = range.count;
  ItemCursor<kBlk, kSplit> ahead(p, t0, t1, range.first);
  Segment seg;
  int kb;
  bool fresh;
  // Copies item `it` into raw slot it % kFp4RawSlots (nothing past the last item); one commit
  // group per call either way, so wait_group counts items.
  auto prefetch = [&](int it) {
    if (it < n && ahead.next(kb, fresh, seg)) copy_raw<kConv>(p, sh.fp4_raw[it % kFp4RawSlots], seg, kb, h, tid);
    sm90::cp_async_commit();
  };
  for (int it = 0; it < kFp4RawSlots - 1; ++it) prefetch(it);
  for (int it = 0; it < n; ++it) {
    prefetch(it + kFp4RawSlots - 1);  // into the slot item it - 1 left
    sm90::cp_async_wait<kFp4RawSlots - 1>();  // item it's copies have landed
    const int stage = KRing::stage(it);
    if (it >= kStages) sm90::mbar_wait(&sh.k_empty[stage], KRing::empty_parity(it));
    convert_raw<kConv>(p, sh.fp4_raw[it % kFp4RawSlots], sh.k[stage], tid);
    sm90::fence_proxy_async_smem();
    sm90::mbar_arrive(&sh.k_full[stage]);
  }
  sm90::cp_async_wait<0>();
}

}  // namespace msa::cuda::indexer_sm90
