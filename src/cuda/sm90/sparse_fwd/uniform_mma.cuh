// Consumers of the uniform (Q-major) path: each warpgroup keeps one 64-row Q tile of the unit in
// shared memory and its O accumulator in registers while the unit's K/V blocks stream by: per
// block S = Q K^T, mask, online softmax (running base / sum in the log2 domain, O rescaled; the
// block max only where the lazy softmax cannot take the block: kLazySumMax), then
// O += P V; at the unit's last block O / l, lse and tlse go straight to the outputs. kernel.cuh.
// Numerics: as mma.cuh; the rescale factor is 1 while a row keeps its base, exp2(m_old - base)
// when the base rises (0 at the first visible key, m_old = -inf), never NaN, and rows with no
// visible key end with out = 0, lse = -inf.
#pragma once

#include "cuda/device/sm80.cuh"
#include "cuda/sm90/sparse_fwd/mma.cuh"

namespace msa::cuda::sparse_fwd {

// Running statistics of one row. l and t are this thread's shares (its 32 columns of the row):
// the quad's alpha is common (m is quad-reduced), so they are summed once, at the unit's end.
struct OnlineRow {
  float m = -INFINITY;  // running base, log2 domain
  float l = 0.f;        // running sum of exp2(x - m), this thread's share
  float t = 0.f;        // running sum of exp2((x - m) / T), this thread's share
};

// A row keeps its base m while a block's max exceeds it by at most kRescaleSlack (log2 domain):
// then p = exp2(x - m) <= 2^8 (exact in fp32; bf16 keeps its relative precision for P V), alpha is
// 1 and O needs no rescale; the result is the same softmax, the base being any value. With a
// warp vote the rescale of O (64 FMULs on the path from P V's end to the next issue) runs only
// when a row of the warp raised its base: after the first blocks, rarely.
constexpr float kRescaleSlack = 8.f;

// The running base of a row after a block whose (scaled, quad-reduced) max is bmax; returns
// the rescale factor of the row's O and l.
// slack: kRescaleSlack, or 0 (the token kernel) for a base that is always the running max.
__device__ __forceinline__ float raise_base(float bmax, OnlineRow& r, float& base, bool& raise,
                                           float slack = kRescaleSlack) {
  raise = bmax > r.m + slack;  // always while m = -inf and bmax is finite
  const float m_new = raise ? bmax : r.m;
  base = m_new == -INFINITY ? 0.f : m_new;
  const float alpha = raise ? sm90::fast_exp2(r.m - base) : 1.f;
  return alpha;
}
// Online softmax of both rows of the thread's block (mma.cuh, softmax_rows): columns past a row's
// limit masked, p = exp2(x - base) left in s, the running statistics updated. a0 / a1: the factor
// exp2(m_old - base) that the row of O must take once the P V product still in flight on it has
// completed (1: none). kTemp: the temperature sums too.
template <bool kTemp, int kS>
__device__ __forceinline__ void online_softmax_rows(float (&s)[kS], int lim0, int lim1,
                                                    int col_base, float sl0, float sl1,
                                                    float inv_temp, OnlineRow& r0, OnlineRow& r1,
                                                    float& a0, float& a1,
                                                    float slack = kRescaleSlack) {
  mask_rows_past_limit(s, lim0, lim1, col_base);
  float m0, m1;
  rows_max(s, m0, m1);
  float base0, base1;
  bool raise0, raise1;
  a0 = raise_base(m0 * sl0, r0, base0, raise0, slack);
  a1 = raise_base(m1 * sl1, r1, base1, raise1, slack);
  float sum[2], tsum[2];
  exp_rows_local<kTemp>(s, sl0, sl1, base0, base1, inv_temp, sum, tsum);
  r0.l = r0.l * a0 + sum[0];
  r1.l = r1.l * a1 + sum[1];
  if constexpr (kTemp) {
    r0.t = r0.t * (raise0 ? sm90::fast_exp2((r0.m - base0) * inv_temp) : 1.f) + tsum[0];
    r1.t = r1.t * (raise1 ? sm90::fast_exp2((r1.m - base1) * inv_temp) : 1.f) + tsum[1];
  }
  r0.m = raise0 ? base0 : r0.m;
  r1.m = raise1 ? base1 : r1.m;
}

// Lazy row max. After a unit's first block a row's softmax keeps its base and computes no block
// max: p = exp2(x - base) directly, and the block is accepted when each thread's share of a row's
// sum is at most kLazySumMax (so every p <= 2^16: no inf, no NaN, O and l in fp32 as with any
// base) and a row without a base yet (m = -inf) sees no key of the block. Otherwise the warpgroup
// recomputes S (its K stage is still held) and runs online_softmax_rows, max included. The base
// is always a max of the row's earlier scores, so a p that underflows is one below 2^-126 of that
// key's. The max's 64 FMNMX, 4 shuffles and the base logic a thread and block were ~7% of
// DENSE-8K / DENSE-32K and 12% of DENSE-16K-D64 (H100, without the check: docs).
constexpr float kLazySumMax = 65536.f;

// The lazy softmax of both rows: columns past a row's limit masked, p = exp2(x * sl - base) in s,
// this thread's shares of the rows' sums in sum. none0 / none1: the row sees no key of the block
// by its limits. Returns whether both rows may take the block this way (the caller's vote).
template <int kS>
__device__ __forceinline__ bool lazy_softmax_rows(float (&s)[kS], int lim0, int lim1, int col_base,
                                                  float sl0, float sl1, bool none0, bool none1,
                                                  const OnlineRow& r0, const OnlineRow& r1,
                                                  float (&sum)[2]) {
  mask_rows_past_limit(s, lim0, lim1, col_base);
  const bool based0 = r0.m != -INFINITY, based1 = r1.m != -INFINITY;
  float tsum[2];
  exp_rows_local<false>(s, sl0, sl1, based0 ? r0.m : 0.f, based1 ? r1.m : 0.f, 0.f, sum, tsum);
  const bool ok0 = based0 ? sum[0] <= kLazySumMax : none0;  // false for a NaN sum
  const bool ok1 = based1 ? sum[1] <= kLazySumMax : none1;
  return ok0 && ok1;
}

// The 4 bytes at byte `off` of 16-byte chunk `chunk` of row r of a 128-byte-swizzled tile (or
// 64-column half): the chunk is stored at chunk XOR r % 8 (TMA's 128B swizzle, as wgmma reads
// it). warp_qk's and warp_qk_e4m3's fragments.
__device__ __forceinline__ uint32_t swizzled_word(const uint8_t* tile, int r, int chunk, int off) {
  return *reinterpret_cast<const uint32_t*>(tile + r * 128 + ((chunk ^ (r & 7)) << 4) + off);
}

// S of one warp's 16 rows of a 64-row tile (rows 16 warp .. + 15) against a K stage, by
// mma.sync m16n8k16 from the 128-byte-swizzled tiles (16-bit q and K): the lazy softmax's way
// back when that warp alone rejects a block, with no warpgroup vote and no wgmma. The mma's C
// fragment is the wgmma accumulator's per warp (rows g, g + 8; columns 8 j + 2 t, + 1 of n8 group
// j), so s takes the same layout. kD / 16 k-steps (D = 32: its first two, of D = 64's tiles);
// q_tile / k_tile: half 0 of the Q buffer and the K stage, halves kQHalfBytes / k_half apart.
template <bool kF16, int kD, int kS>
__device__ __forceinline__ void warp_qk(float (&s)[kS], const uint8_t* q_tile,
                                        const uint8_t* k_tile, int k_half, int warp, int lane) {
  const int g = lane >> 2, t = lane & 3;
  // Column c of a 64-column half of 16-bit values: 8 a chunk.
  auto at = [](const uint8_t* half, int r, int c) {
    return swizzled_word(half, r, c >> 3, (c & 7) * 2);
  };
#pragma unroll
  for (int i = 0; i < kS; ++i) s[i] = 0.f;
  const int ra = warp * 16 + g, rb = ra + 8;
#pragma unroll 1
  for (int ks = 0; ks < kD / 16; ++ks) {
    const int h = ks >> 2, c0 = (ks & 3) * 16 + 2 * t;
    const uint8_t* qh = q_tile + h * kQHalfBytes;
    const uint8_t* kh = k_tile + h * k_half;
    const uint32_t a[4] = {at(qh, ra, c0), at(qh, rb, c0), at(qh, ra, c0 + 8), at(qh, rb, c0 + 8)};
#pragma unroll
    for (int j = 0; j < kS / 4; ++j)
      sm80::mma_16816<std::conditional_t<kF16, __half, __nv_bfloat16>>(
          *reinterpret_cast<float(*)[4]>(s + 4 * j), a, at(kh, 8 * j + g, c0),
          at(kh, 8 * j + g, c0 + 8));
  }
}

// warp_qk for FP8 Q K^T (D = 128, e4m3 q and K: one 128-byte swizzled row per tile row): the
// warp's 16 rows of S by mma.sync m16n8k32 e4m3, whose A / B / C fragments are m16n8k16's with 4
// values per register; S holds Q K^T before the K scales, as the wgmma leaves it.
template <int kS>
__device__ __forceinline__ void warp_qk_e4m3(float (&s)[kS], const uint8_t* q_tile,
                                             const uint8_t* k_tile, int warp, int lane) {
  const int g = lane >> 2, t = lane & 3;
  // Column c of 128 e4m3 values: 16 a chunk.
  auto at = [](const uint8_t* tile, int r, int c) {
    return swizzled_word(tile, r, c >> 4, c & 15);
  };
#pragma unroll
  for (int i = 0; i < kS; ++i) s[i] = 0.f;
  const int ra = warp * 16 + g, rb = ra + 8;
#pragma unroll 1
  for (int ks = 0; ks < 4; ++ks) {
    const int c0 = ks * 32 + 4 * t;
    const uint32_t a0 = at(q_tile, ra, c0), a1 = at(q_tile, rb, c0);
    const uint32_t a2 = at(q_tile, ra, c0 + 16), a3 = at(q_tile, rb, c0 + 16);
#pragma unroll
    for (int j = 0; j < kS / 4; ++j) {
      const uint32_t b0 = at(k_tile, 8 * j + g, c0), b1 = at(k_tile, 8 * j + g, c0 + 16);
      float* d = s + 4 * j;
      asm volatile(
          "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, "
          "%7}, {%8, %9}, {%0, %1, %2, %3};"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
          : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    }
  }
}

// The quad's shares of l and t added (the whole warp calls it, before any branch on the row).
__device__ __forceinline__ void finish_row(OnlineRow& r, float inv_temp) {
  r.l = quad_sum(r.l);
  if (inv_temp > 0.f) r.t = quad_sum(r.t);
}

template <typename T, int kOff, int kCols, int kN>
__device__ __forceinline__ void store_out_row(const UniformParams& p, const float (&o)[kN],
                                              int32_t tok, int32_t hq, const OnlineRow& r,
                                              int col_base, bool lead) {
  const float inv = r.m == -INFINITY ? 0.f : 1.f / r.l;
  T* row = static_cast<T*>(p.out) + int64_t(tok) * p.out_stride_t + int64_t(hq) * p.out_stride_h;
  store_row<T, kOff, kN, kCols>(row, o, inv, col_base);
  if (lead) {
    if (p.lse) p.lse[int64_t(hq) * p.total_q + tok] = row_lse(r.m, r.l);
    if (p.tlse) p.tlse[int64_t(hq) * p.total_q + tok] = row_tlse(r.m, r.t, p.inv_temperature);
  }
}

// S = Q K^T for the 64-row tile (mma.cuh issue_qk), committed as its own group.
template <bool kF16, bool kFp8, int kD, int kS>
__device__ __forceinline__ void issue_uniform_qk(float (&sc)[kS], uint32_t q_addr,
                                                 uint32_t k_addr) {
  issue_qk<kF16, kFp8, kD>(sc, q_addr, k_addr);
  sm90::wgmma_commit();
}

// O += P V with P in registers (MN-major V, as mma.cuh).
template <bool kF16, int kN, int kSteps>
__device__ __forceinline__ void issue_uniform_pv(float (&o)[kN], const uint32_t (&pa)[kSteps][4],
                                                 uint32_t v_addr) {
  issue_pv<kF16>(o, pa, v_addr, true);
  sm90::wgmma_commit();
}

// Register fences after a wgmma wait: reads of an accumulator must not move above the wait,
// and P's registers (an operand of an in-flight P V) must stay untouched until it.
template <int kN>
__device__ __forceinline__ void fence_regs(float (&a)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) sm90::reg_fence(a[i]);
}
template <int kSteps>
__device__ __forceinline__ void fence_regs(uint32_t (&pa)[kSteps][4]) {
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk)
#pragma unroll
    for (int i = 0; i < 4; ++i) asm volatile("" : "+r"(pa[kk][i])::"memory");
}

template <int kN>
__device__ __forceinline__ void rescale_rows(float (&o)[kN], float a0, float a1) {
#pragma unroll
  for (int n = 0; n < kN / 4; ++n) {
    o[n * 4 + 0] *= a0;
    o[n * 4 + 1] *= a0;
    o[n * 4 + 2] *= a1;
    o[n * 4 + 3] *= a1;
  }
}

// The unit loop of a consumer warpgroup. Per unit of n blocks: S_0, then for j = 1..n-1 one
// wgmma group {S_j = Q K_j^T, O += P_{j-1} V_{j-1}} whose softmax of S_j overlaps the P V
// product, then O += P_{n-1} V_{n-1}. Turns: the warpgroups (two, or three at D = 32 / 64) issue
// their groups in turn (named barriers kTurn0..), so one's softmax runs under the others' products.
// Every wgmma group is waited on in the same branch that issued it (ptxas serializes wgmma
// otherwise). K stage j is released once S_j's softmax is done (before it on 64-key pairs, which
// keep the max each block), V stage j - 1 once its product is.
// kMask: dense attention with a key mask (p.mask_bits; instantiated apart so that calls without
// one run the kernel as it was: one runtime branch per block cost 1.5-2% at DENSE-8K / P32K-blk).
// kD, kBlk: the head dim and keys per kv block (traits.h HeadDimTraits): O's kTileD / 2 floats per
// thread, stages of kKeys keys (S of kKeys / 2 floats), kQSt Q buffers per consumer.
template <bool kF16, bool kFp8, bool kMask, int kD, int kBlk>
__device__ __forceinline__ void run_uniform_consumer(const UniformParams& p,
                                                     typename HeadDimTraits<kD, kBlk>::Storage& sh,
                                                     int consumer_in, int tid) {
  using HT = HeadDimTraits<kD, kBlk>;
  using QR = sm90::Ring<HT::kQSt>;
  constexpr int kKeys = HT::kKeys;
  using T = std::conditional_t<kF16, __half, __nv_bfloat16>;
  // Broadcast so ptxas sees a warp-uniform value: the Q descriptors (and with them every wgmma
  // descriptor) then stay in uniform registers, instead of 33 R2UR moves per block (5.5% of
  // the kernel's instructions with the descriptor arithmetic around them, ncu).
  const int consumer = __shfl_sync(0xffffffffu, consumer_in, 0);
  const int warp = tid >> 5, lane = tid & 31;
  const int r0 = warp * 16 + (lane >> 2), r1 = r0 + 8;
  const int j0 = r0 / p.group, g0 = r0 - j0 * p.group;
  const int j1 = r1 / p.group, g1 = r1 - j1 * p.group;
  const int col_base = 2 * (lane & 3);
  // Turns: consumer c issues its wgmma group after c - 1 (mod kCons) issued its own; each turn
  // barrier has two parties, the one passing the turn (arrive) and the one taking it (sync).
  constexpr int kCons = HT::kCons;
  constexpr uint32_t kPair = 2 * 128;
  const uint32_t my_turn = uint32_t(NamedBarrier::kTurn0) + consumer;
  const uint32_t other_turn =
      uint32_t(NamedBarrier::kTurn0) + (kCons == 2 ? 1 - consumer : (consumer + 1) % kCons);
  int32_t k_iter = 0, v_iter = 0, unit_iter = 0;
  auto wait_k = [&]() {
    const int s = KVRing::stage(k_iter);
    sm90::mbar_wait(&sh.kv_full[s], KVRing::full_parity(k_iter));
    UniformInfo in = read_info(sh.uinfo[s], lane);
    if constexpr (kLastInKeys<kD>) {
      in.last = in.valid_keys & kLastStageBit;
      in.valid_keys &= kLastStageBit - 1;
    }
    return in;
  };
  auto release_k = [&]() {
    if (kFp8 || lane == 0) sm90::mbar_arrive(&sh.kv_empty[KVRing::stage(k_iter)]);  // kv_empty_arrivals
    ++k_iter;
  };
  // V of the previous block: wait for it, zero its tail rows if the block is partial.
  auto wait_v = [&](int valid_keys) {
    const int vs = KVRing::stage(v_iter);
    sm90::mbar_wait(&sh.v_full[vs], KVRing::full_parity(v_iter));
    if (valid_keys < kKeys) zero_v_tail(sh, vs, valid_keys, consumer, tid);
    return sm90::smem_addr(sh.v[vs][0]);
  };
  // FP8 QK: S of the block in K stage k_iter times its key scales (after the wait, before the
  // stage is released); with one K scale, kmul takes it and the rows' score scales absorb it.
  // (Reading the 32 scales while S is in flight spilled: S, O, P and the scales are live then.)
  float kmul = 1.f;
  auto apply_key_scales = [&](auto& s) {
    if constexpr (kFp8) {
      const float* ks = sh.kscale[KVRing::stage(k_iter)];
      if (p.kscale_uniform) kmul = uniform_key_scale(ks);
      else scale_key_columns(s, load_key_columns<HT::kS>(ks, col_base));
    }
  };
  auto release_v = [&]() {
    if (lane == 0) sm90::mbar_arrive(&sh.v_empty[KVRing::stage(v_iter)]);
    ++v_iter;
  };
  if (consumer == kCons - 1) sm90::named_arrive(uint32_t(NamedBarrier::kTurn0), kPair);  // 0 first
  float o[HT::kO], sc[HT::kS];
  uint32_t pa[HT::kS / 8][4];
  while (true) {
    UniformInfo info = wait_k();
    if (info.kb == -2) break;
    const int q_stage = QR::stage(unit_iter);
    sm90::mbar_wait(&sh.q_full[consumer][q_stage], QR::full_parity(unit_iter));
    const RowMeta rm = read_row_meta(sh.meta[consumer][q_stage],
                                     warp_tokens(p.group, p.tokens_per_tile, warp), lane, j0, j1);
    const int32_t head = rm.slot0;  // the uniform producer stores the kv head in the slot field
    // The rows' scales: the call's, or with q scales (FP8 q dequantized) per row. At D <= 64
    // (160 registers) they are re-derived each block: held across the unit they were spilled and
    // reloaded anyway, and with the stage's last flag folded into its key count (kLastStageBit)
    // the block loop's spills go from 84 to 8 bytes (5 local loads and a store a block fewer).
    constexpr bool kScalesPerBlock = kD <= 64;
    const float sl0 = kScalesPerBlock ? 0.f : row_scale_log2(p, rm.tok0, head * p.group + g0);
    const float sl1 = kScalesPerBlock ? 0.f : row_scale_log2(p, rm.tok1, head * p.group + g1);
    OnlineRow st0, st1;
#pragma unroll
    for (int i = 0; i < HT::kO; ++i) o[i] = 0.f;
    if (info.kb >= 0) {
      const uint32_t q_addr = sm90::smem_addr(sh.q[consumer][q_stage][0]);
      // Key mask words of the block in flight, loaded before its S is issued (FP8 QK: after, as
      // its consumers' registers are full then: 24 bytes spilled).
      const uint32_t* mrow0 = kMask ? mask_row(p, rm.tok0) : nullptr;
      const uint32_t* mrow1 = kMask ? mask_row(p, rm.tok1) : nullptr;
      uint4 mw0, mw1;
      // The stage's words of a row: a 64-key pair's first block's two, then its second's (none
      // past a single), or the block's.
      auto stage_words = [&](const uint32_t* row, const UniformInfo& in) {
        if constexpr (HT::kBlockPairs) {
          const uint4 a = mask_block<kBlk>(p, row, in.kb);
          const uint4 b = in.kb2 >= 0 ? mask_block<kBlk>(p, row, in.kb2) : make_uint4(0, 0, 0, 0);
          return make_uint4(a.x, a.y, b.x, b.y);
        } else {
          return mask_block<kKeys>(p, row, in.kb);
        }
      };
      auto load_mask = [&](const UniformInfo& in) {
        if constexpr (kMask && !kFp8) {
          mw0 = stage_words(mrow0, in);
          mw1 = stage_words(mrow1, in);
        }
      };
      // A block's row scales and limits, with the soft-cap and the key masks applied to S in
      // place; none0 / none1: the row sees no key of the block by its limits.
      struct BlockRows {
        float s0, s1;
        int lim0, lim1;
        bool none0, none1;
      };
      auto prepare = [&](const UniformInfo& in) {
        BlockRows b;
        if constexpr (HT::kBlockPairs) {  // the first block's limits (the second's: below)
          const int va = in.kb2 >= 0 ? kBlk : in.valid_keys;
          b.lim0 = max(-1, min(rm.lim0 - in.kb * kBlk, va - 1));
          b.lim1 = max(-1, min(rm.lim1 - in.kb * kBlk, va - 1));
        } else {
          const int base_col = in.kb * kKeys;
          b.lim0 = max(-1, min(rm.lim0 - base_col, in.valid_keys - 1));
          b.lim1 = max(-1, min(rm.lim1 - base_col, in.valid_keys - 1));
        }
        float s0 = sl0, s1 = sl1;
        if constexpr (kScalesPerBlock) {
          s0 = s1 = p.scale_log2;
          if (p.q_scale != nullptr) {
            s0 = row_scale_log2(p, rm.tok0, head * p.group + g0);
            s1 = row_scale_log2(p, rm.tok1, head * p.group + g1);
          }
        }
        s0 *= kmul;
        s1 *= kmul;
        if (p.soft_cap_log2 > 0.f) {
          s0 = soft_cap_row<0>(sc, s0, p.soft_cap_log2);
          s1 = soft_cap_row<2>(sc, s1, p.soft_cap_log2);
        }
        b.s0 = s0;
        b.s1 = s1;
        if constexpr (kMask) {
          if constexpr (kFp8) {
            mw0 = stage_words(mrow0, in);
            mw1 = stage_words(mrow1, in);
          }
          apply_key_mask<0>(sc, mw0, col_base);
          apply_key_mask<2>(sc, mw1, col_base);
        }
        b.none0 = b.lim0 < 0;
        b.none1 = b.lim1 < 0;
        if constexpr (HT::kBlockPairs) {  // each block's columns to its own limit, as the last mask
          const int vb = in.valid_keys - kBlk, b1 = in.kb2 * kBlk;
          const int lb0 = in.kb2 >= 0 ? max(-1, min(rm.lim0 - b1, vb - 1)) : -1;
          const int lb1 = in.kb2 >= 0 ? max(-1, min(rm.lim1 - b1, vb - 1)) : -1;
          mask_rows_past_limits2(sc, b.lim0, lb0, b.lim1, lb1, col_base);
          b.none0 = b.none0 && lb0 < 0;
          b.none1 = b.none1 && lb1 < 0;
          b.lim0 = b.lim1 = kKeys - 1;  // nothing left for the softmax to mask
        }
        return b;
      };
      // The block's softmax with the row max (online_softmax_rows).
      auto full_softmax = [&](const BlockRows& b, float& a0, float& a1) {
        if (p.inv_temperature > 0.f)
          online_softmax_rows<true>(sc, b.lim0, b.lim1, col_base, b.s0, b.s1, p.inv_temperature,
                                    st0, st1, a0, a1);
        else
          online_softmax_rows<false>(sc, b.lim0, b.lim1, col_base, b.s0, b.s1, 0.f, st0, st1, a0,
                                     a1);
      };
      // Not on 64-key pairs: there the lazy loop spilled 16 bytes instead of 4 and measured
      // P108K-bsr64 / P32K-blk64 0-2% slower (H100), so those kernels keep the max every block.
      constexpr bool kLazy = !HT::kBlockPairs;
      // The way back by the warpgroup (vote and wgmma) at D <= 64 (warp_qk there took the spills
      // of the 160-register consumers from 88 to 180 bytes) and for FP8 Q K^T with a key mask
      // (warp_qk_e4m3 there: spills 8 -> 104 bytes), else by the warp alone (warp_qk,
      // warp_qk_e4m3): DENSE-8K 1.592 -> 1.535 ms, DENSE-32K 26.1 -> 25.2, P32K-blk-fp8qk
      // 3.68-3.73 -> 3.67-3.68, P32K-blk-fp8qk-tensor 3.26 -> 3.19 (H100).
      constexpr bool kWgmmaWayBack = kD <= 64 || (kFp8 && kMask);
      float a0, a1;
      // Block 0: S_0 alone.
      load_mask(info);
      sm90::named_sync(my_turn, kPair);
      sm90::wgmma_fence();
      issue_uniform_qk<kF16, kFp8, kD>(sc, q_addr, sm90::smem_addr(sh.k[k_iter % kKVStages][0]));
      sm90::named_arrive(other_turn, kPair);
      sm90::wgmma_wait<0>();
      fence_regs(sc);
      apply_key_scales(sc);
      release_k();
      full_softmax(prepare(info), a0, a1);
      pack_probs<kF16>(sc, pa);
      UniformInfo prev = info;
      while (!prev.last) {
        info = wait_k();
        load_mask(info);
        const uint32_t v_addr = wait_v(prev.valid_keys);
        sm90::named_sync(my_turn, kPair);
        sm90::wgmma_fence();
        issue_uniform_qk<kF16, kFp8, kD>(sc, q_addr, sm90::smem_addr(sh.k[k_iter % kKVStages][0]));
        issue_uniform_pv<kF16>(o, pa, v_addr);
        sm90::named_arrive(other_turn, kPair);
        sm90::wgmma_wait<1>();
        fence_regs(sc);
        apply_key_scales(sc);
        if constexpr (!kLazy) {
          release_k();
          full_softmax(prepare(info), a0, a1);
        } else {
          BlockRows b = prepare(info);
          // Lazy max (kLazySumMax) unless temperature sums are asked for. The way back recomputes
          // S: by the warp alone (warp vote, warp_qk), or with kWgmmaWayBack by the warpgroup
          // (vote by bar.red, then a wgmma). These branches also keep the softmax above the P V
          // wait in the SASS: without one between them ptxas moved it below the wait, 2.4-4%
          // slower (docs/kernels/sparse_fwd.md).
          bool lazy = p.inv_temperature == 0.f;
          if (lazy) {
            float sum[2];
            const bool ok = lazy_softmax_rows(sc, b.lim0, b.lim1, col_base, b.s0, b.s1, b.none0,
                                              b.none1, st0, st1, sum);
            if constexpr (kWgmmaWayBack)
              lazy = sm90::named_all(uint32_t(NamedBarrier::kLazy0) + consumer, 128, ok);
            else
              lazy = __all_sync(0xffffffffu, ok);
            if (lazy) {
              st0.l += sum[0];
              st1.l += sum[1];
              a0 = a1 = 1.f;
            }
          }
          if (!lazy) {
            if (p.inv_temperature == 0.f) {  // S holds p of the rejected try: S again
              if constexpr (kWgmmaWayBack) {
                sm90::wgmma_fence();
                issue_uniform_qk<kF16, kFp8, kD>(sc, q_addr,
                                                 sm90::smem_addr(sh.k[k_iter % kKVStages][0]));
                sm90::wgmma_wait<0>();
                fence_regs(sc);
                apply_key_scales(sc);
              } else if constexpr (kFp8) {
                warp_qk_e4m3(sc, sh.q[consumer][q_stage][0], sh.k[k_iter % kKVStages][0], warp,
                             lane);
                apply_key_scales(sc);
              } else {
                warp_qk<kF16, kD>(sc, sh.q[consumer][q_stage][0], sh.k[k_iter % kKVStages][0],
                                  int(sizeof(sh.k[0][0])), warp, lane);
              }
              b = prepare(info);
            }
            full_softmax(b, a0, a1);
          }
          release_k();  // after the softmax: its way back reads K again
        }
        sm90::wgmma_wait<0>();
        fence_regs(o);
        fence_regs(pa);
        release_v();
        if (__any_sync(0xffffffffu, a0 != 1.f || a1 != 1.f)) rescale_rows(o, a0, a1);
        pack_probs<kF16>(sc, pa);
        prev = info;
      }
      // Last block's P V.
      const uint32_t v_addr = wait_v(prev.valid_keys);
      sm90::named_sync(my_turn, kPair);
      sm90::wgmma_fence();
      issue_uniform_pv<kF16>(o, pa, v_addr);
      sm90::named_arrive(other_turn, kPair);
      sm90::wgmma_wait<0>();
      fence_regs(o);
      fence_regs(pa);
      release_v();
    } else {
      release_k();  // a unit without a usable block: zeros and -inf out
    }
    // Q buffer released by the warp's metadata readers, as in the KV-major path.
    if (lane < warp_tokens(p.group, p.tokens_per_tile, warp).count)
      sm90::mbar_arrive(&sh.q_empty[consumer][q_stage]);
    finish_row(st0, p.inv_temperature);
    finish_row(st1, p.inv_temperature);
    const bool lead = (lane & 3) == 0;
    if (rm.tok0 >= 0)
      store_out_row<T, 0, HT::kOutCols>(p, o, rm.tok0, head * p.group + g0, st0, col_base, lead);
    if (rm.tok1 >= 0)
      store_out_row<T, 2, HT::kOutCols>(p, o, rm.tok1, head * p.group + g1, st1, col_base, lead);
    ++unit_iter;
  }
  // The last consumer's last arrive (every consumer issues as many groups: a unit's tiles
  // stream the same blocks).
  if (consumer == 0) sm90::named_sync(uint32_t(NamedBarrier::kTurn0), kPair);
}

}  // namespace msa::cuda::sparse_fwd
