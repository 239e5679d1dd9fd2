// Consumers of the uniform (Q-major) path: each warpgroup keeps one 64-row Q tile of the unit in
// shared memory and its O accumulator in registers while the unit's K/V blocks stream by: per
// block S = Q K^T, mask, online softmax (running max / sum in the log2 domain, O rescaled), then
// O += P V; at the unit's last block O / l, lse and tlse go straight to the outputs. kernel.cuh.
// Numerics: as mma.cuh; the rescale factor exp2(m_old - base) is 0 while no key has been seen
// (m_old = -inf), never NaN, and rows with no visible key end with out = 0, lse = -inf.
#pragma once

#include "cuda/sm90/sparse_fwd/mma.cuh"

namespace msa::cuda::sparse_fwd {

struct OnlineRow {
  float m = -INFINITY;  // running max, log2 domain
  float l = 0.f;        // running sum of exp2(x - m)
  float t = 0.f;        // running sum of exp2((x - m) / T)
};

// One row of the block: mask to [0, limit], scale, fold into the running statistics, rescale the
// row of O, leave p = exp2(x - base) in s.
template <int kOff>
__device__ __forceinline__ void online_softmax_row(float (&s)[64], float (&o)[64], int limit,
                                                   int col_base, float scale_log2,
                                                   float inv_temp, OnlineRow& r) {
  float mx = -INFINITY;
#pragma unroll
  for (int n = 0; n < 16; ++n) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int col = n * 8 + col_base + e;
      const float x = col <= limit ? s[n * 4 + kOff + e] * scale_log2 : -INFINITY;
      s[n * 4 + kOff + e] = x;
      mx = fmaxf(mx, x);
    }
  }
  const float m_new = fmaxf(r.m, quad_max(mx));
  const float base = m_new == -INFINITY ? 0.f : m_new;
  const float alpha = fast_exp2(r.m - base);
  float sum = 0.f, tsum = 0.f;
#pragma unroll
  for (int n = 0; n < 16; ++n) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const float d = s[n * 4 + kOff + e] - base;
      const float pv = fast_exp2(d);
      if (inv_temp > 0.f) tsum += fast_exp2(d * inv_temp);
      s[n * 4 + kOff + e] = pv;
      sum += pv;
    }
    o[n * 4 + kOff] *= alpha;
    o[n * 4 + kOff + 1] *= alpha;
  }
  r.l = r.l * alpha + quad_sum(sum);
  if (inv_temp > 0.f) r.t = r.t * fast_exp2((r.m - base) * inv_temp) + quad_sum(tsum);
  r.m = m_new;
}

template <typename T, int kOff>
__device__ __forceinline__ void store_out_row(const UniformParams& p, const float (&o)[64],
                                              int32_t tok, int32_t hq, const OnlineRow& r,
                                              int col_base, bool lead) {
  const float inv = r.m == -INFINITY ? 0.f : 1.f / r.l;
  T* row = static_cast<T*>(p.out) + int64_t(tok) * p.out_stride_t + int64_t(hq) * p.out_stride_h;
  store_row_16b<T, kOff>(row, o, inv, col_base);
  if (lead) {
    if (p.lse) p.lse[int64_t(hq) * p.total_q + tok] = row_lse(r.m, r.l);
    if (p.tlse) p.tlse[int64_t(hq) * p.total_q + tok] = row_tlse(r.m, r.t, p.inv_temperature);
  }
}

template <bool kF16>
__device__ __forceinline__ void run_uniform_consumer(const UniformParams& p, SharedStorage& sh,
                                                     int consumer, int tid) {
  using T = std::conditional_t<kF16, __half, __nv_bfloat16>;
  const int warp = tid >> 5, lane = tid & 31;
  const int r0 = warp * 16 + (lane >> 2), r1 = r0 + 8;
  const int j0 = r0 / p.group, g0 = r0 - j0 * p.group;
  const int j1 = r1 / p.group, g1 = r1 - j1 * p.group;
  const int col_base = 2 * (lane & 3);
  int32_t kv_iter = 0, unit_iter = 0, q_stage = 0;
  int32_t tok0 = -1, tok1 = -1, last0 = -1, last1 = -1, head = 0;
  OnlineRow st0, st1;
  float o[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i] = 0.f;
  while (true) {
    const int s = kv_iter % kKVStages;
    sm90::mbar_wait(&sh.kv_full[s], (kv_iter / kKVStages) & 1);
    const UniformInfo info = read_info(sh.uinfo[s], lane);
    if (info.kb == -2) break;
    if (info.first) {
      q_stage = unit_iter & 1;
      sm90::mbar_wait(&sh.q_full[consumer][q_stage], (unit_iter >> 1) & 1);
      const RowMeta rm = read_row_meta(sh.meta[consumer][q_stage], p.group, warp, lane, j0, j1);
      tok0 = rm.tok0;
      last0 = rm.lim0;
      tok1 = rm.tok1;
      last1 = rm.lim1;
      head = rm.slot0;  // the uniform producer stores the kv head in the slot field
      st0 = OnlineRow{};
      st1 = OnlineRow{};
#pragma unroll
      for (int i = 0; i < 64; ++i) o[i] = 0.f;
    }
    if (info.kb >= 0) {
      if (info.valid_keys < kBlockN) zero_v_tail(sh, s, info.valid_keys, consumer, tid);
      float sc[64];
#pragma unroll
      for (int i = 0; i < 64; ++i) sc[i] = 0.f;
      const uint32_t q_addr = sm90::smem_addr(sh.q[consumer][q_stage][0]);
      const uint32_t k_addr = sm90::smem_addr(sh.k[s][0]);
      sm90::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kHeadDim / 16; ++kk) {
        const uint64_t da = sm90::wgmma_desc_sw128(
            q_addr + (kk >> 2) * kQHalfBytes + (kk & 3) * 32, 16, 1024);
        const uint64_t db = sm90::wgmma_desc_sw128(
            k_addr + (kk >> 2) * kKVHalfBytes + (kk & 3) * 32, 16, 1024);
        sm90::wgmma_ss<kF16>(sc, da, db, kk > 0 ? 1u : 0u);
      }
      sm90::wgmma_commit();
      sm90::wgmma_wait<0>();
      const int base_col = info.kb * kBlockN;
      const int lim0 = max(-1, min(last0 - base_col, info.valid_keys - 1));
      const int lim1 = max(-1, min(last1 - base_col, info.valid_keys - 1));
      online_softmax_row<0>(sc, o, lim0, col_base, p.scale_log2, p.inv_temperature, st0);
      online_softmax_row<2>(sc, o, lim1, col_base, p.scale_log2, p.inv_temperature, st1);
      uint32_t pa[kBlockN / 16][4];
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        pa[kk][0] = pack_pair<kF16>(sc[(2 * kk) * 4 + 0], sc[(2 * kk) * 4 + 1]);
        pa[kk][1] = pack_pair<kF16>(sc[(2 * kk) * 4 + 2], sc[(2 * kk) * 4 + 3]);
        pa[kk][2] = pack_pair<kF16>(sc[(2 * kk + 1) * 4 + 0], sc[(2 * kk + 1) * 4 + 1]);
        pa[kk][3] = pack_pair<kF16>(sc[(2 * kk + 1) * 4 + 2], sc[(2 * kk + 1) * 4 + 3]);
      }
      const uint32_t v_addr = sm90::smem_addr(sh.v[s][0]);
      sm90::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        const uint64_t db = sm90::wgmma_desc_sw128(v_addr + kk * 2048, kKVHalfBytes, 1024);
        sm90::wgmma_rs_tb<kF16>(o, pa[kk], db, 1u);
      }
      sm90::wgmma_commit();
      sm90::wgmma_wait<0>();
    }
    // K/V stage released by lane 0 of each warp (its info reader); at a unit's end the Q buffer
    // by the warp's metadata readers, as in the KV-major path.
    if (lane == 0) sm90::mbar_arrive(&sh.kv_empty[s]);
    ++kv_iter;
    if (info.last) {
      if (lane < warp_tokens(p.group)) sm90::mbar_arrive(&sh.q_empty[consumer][q_stage]);
      const bool lead = (lane & 3) == 0;
      if (tok0 >= 0) store_out_row<T, 0>(p, o, tok0, head * p.group + g0, st0, col_base, lead);
      if (tok1 >= 0) store_out_row<T, 2>(p, o, tok1, head * p.group + g1, st1, col_base, lead);
      ++unit_iter;
    }
  }
}

}  // namespace msa::cuda::sparse_fwd
