// Epilogue of the sm_90a indexer's consumers: the masked row max of an S tile, then either the
// score store or (fused) the group max over the G heads streamed into each token's top-K
// candidates; plus the fused-path setup and the unfused -inf tail. Called from mma.cuh.
#pragma once

#include "cuda/sm90/block_scores/work.cuh"

namespace msa::cuda::indexer_sm90 {

// max that propagates NaN (PTX max.NaN, sm_80+): one instruction, as the CPU's NaN rule needs.
__device__ __forceinline__ float nan_max(float a, float b) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

// Max over this thread's columns <= lim (in [-1, 127]) of one accumulator row (kOff 0: row
// lane/4, 2: row lane/4 + 8), reduced over the quad that shares the row. With kScaled (FP8 with
// per-key scales), each value is first multiplied by its column's key scale, read from the
// stage's shared-memory copy (ks: the stage's 128 scales). Blocks
// wholly visible to the row (every block but the diagonal and the batch tail) take the unmasked
// path: this epilogue runs for every S element, and instruction issue, not the tensor cores,
// bounded the first version (ncu: 36% issue-slot use, ALU busiest, tensor pipe idle).
template <int kOff, bool kScaled>
__device__ __forceinline__ float row_max(const float (&s)[64], int lim, int lane, const float* ks) {
  const int c0 = 2 * (lane & 3);
  auto value = [&](int n, int e) { return kScaled ? s[n * 4 + kOff + e] * ks[n * 8 + c0 + e] : s[n * 4 + kOff + e]; };
  float m[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};  // independent chains for ILP
  if (lim >= kBlockN - 1) {
#pragma unroll
    for (int n = 0; n < 16; ++n) m[n & 3] = nan_max(m[n & 3], nan_max(value(n, 0), value(n, 1)));
  } else {
#pragma unroll
    for (int n = 0; n < 16; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e)
        m[n & 3] = nan_max(m[n & 3], n * 8 + c0 + e <= lim ? value(n, e) : -INFINITY);
  }
  float r = nan_max(nan_max(m[0], m[1]), nan_max(m[2], m[3]));
  r = nan_max(r, __shfl_xor_sync(0xffffffffu, r, 1));
  return nan_max(r, __shfl_xor_sync(0xffffffffu, r, 2));
}

// FP8 scales (Params: 0 none, 1 per tensor, 2 per token, 3 per token and head).
__device__ __forceinline__ float scale_at(const float* scale, int kind, int64_t token, int64_t head,
                                          int64_t heads) {
  switch (kind) {
    case 1: return scale[0];
    case 2: return scale[token];
    case 3: return scale[token * heads + head];
    default: return 1.f;
  }
}

// Group max over the G heads of one token (rows tok*G .. tok*G+G-1 are adjacent): lane bits 2-4
// index rows lane/4 within an 8-row half. NaN heads are skipped (CPU: fmax), like top-K's rule.
__device__ __forceinline__ float group_max_half(float m, int group) {
  if (group >= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 4));
  if (group >= 4) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 8));
  if (group >= 8) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 16));
  return m;
}

// Streams candidate block kb of a token into its best-`want` list (one thread per token).
__device__ __forceinline__ void offer(TokenPicks& tp, const SelectRule& rule, int64_t kb, float v) {
  if (kb >= tp.nvis || is_forced(rule, kb, tp.nvis) || tp.want <= 0) return;
  const uint64_t key = rank_key(v, kb);
  if (tp.count < tp.want) {
    tp.key[tp.count++] = key;
    if (tp.count < tp.want) return;
  } else {
    if (key <= tp.min_key) return;
    tp.key[tp.min_pos] = key;
  }
  uint64_t mk = ~0ull;
  int mp = 0;
  for (int i = 0; i < tp.want; ++i)
    if (tp.key[i] < mk) { mk = tp.key[i]; mp = i; }
  tp.min_key = mk;
  tp.min_pos = mp;
}

struct RowInfo {  // one accumulator row of a row group
  int64_t t;      // global token
  int g;          // head within the group
  int cta_tok;    // token index within the CTA
};

__device__ __forceinline__ RowInfo row_info(const Params& p, int64_t t0, int r, int row) {
  const int tok = row / p.group;
  return RowInfo{t0 + r * (kTileM / p.group) + tok, row - tok * p.group, r * (kTileM / p.group) + tok};
}

// Epilogue of one row group's S tile for block kb of segment `seg`; ks: the block's staged key
// scales (read only with FP8 per-key scales, so its K stage must still be held).
template <Elem kElem>
__device__ __forceinline__ void epilogue(const Params& p, SharedStorage& sh, const float (&s)[64],
                                         const Segment& seg, int64_t h, int64_t t0, int r,
                                         int64_t kb, int warp, int lane, const float* ks) {
  const int row0 = warp * 16 + (lane >> 2);
  const RowInfo ri[2] = {row_info(p, t0, r, row0), row_info(p, t0, r, row0 + 8)};
  // FP8: score = qs * max_j(dot_j * ks_j) for scales >= 0; per-key scales multiply each value,
  // a per-tensor key scale joins the query scale after the max.
  const bool per_key = per_key_scales<kElem>(p);
  const float k_const = per_key ? 1.f : scale_at(p.k_scale, p.k_scale_kind, 0, 0, 0);
  float m[2];
#pragma unroll
  for (int u = 0; u < 2; ++u) {
    // Last visible key of the row's token (batch-local), in this block's columns; the block's
    // keys past lk belong to the next batch (or are TMA zeros) and are never visible.
    const int64_t last = p.causal ? ri[u].t - seg.q0 + seg.lk - seg.lq : seg.lk - 1;
    int64_t lim = (last < seg.lk - 1 ? last : seg.lk - 1) - kb * kBlockN;
    lim = lim < -1 ? -1 : (lim > kBlockN - 1 ? kBlockN - 1 : lim);
    if (per_key) m[u] = u == 0 ? row_max<0, true>(s, int(lim), lane, ks) : row_max<2, true>(s, int(lim), lane, ks);
    else m[u] = u == 0 ? row_max<0, false>(s, int(lim), lane, ks) : row_max<2, false>(s, int(lim), lane, ks);
    if constexpr (kElem == Elem::e4m3) {
      const int64_t t = ri[u].t < p.total_q ? ri[u].t : 0;  // rows past total_q are never stored
      const float qs = scale_at(p.q_scale, p.q_scale_kind, t, h * p.group + ri[u].g, p.num_q_heads);
      if (qs < 0.f || k_const < 0.f)
        flag_status(p.status, int32_t(StatusCode::negative_scale), 0, t, h * p.group + ri[u].g);
      if (m[u] != -INFINITY) m[u] *= qs * k_const;  // no visible key stays -inf, even at scale 0
    }
  }
  const bool in0 = ri[0].t >= seg.t_begin && ri[0].t < seg.t_end;
  const bool in1 = ri[1].t >= seg.t_begin && ri[1].t < seg.t_end;
  if (p.scores != nullptr) {
    if ((lane & 3) == 0) {
#pragma unroll
      for (int u = 0; u < 2; ++u)
        if (u == 0 ? in0 : in1)
          p.scores[((h * p.group + ri[u].g) * p.nblk_max + kb) * p.total_q + ri[u].t] = m[u];
    }
    return;
  }
  float g0 = group_max_half(m[0], p.group), g1 = group_max_half(m[1], p.group);
  if (p.group == 16) g0 = g1 = fmaxf(g0, g1);  // one token spans both 8-row halves
  if ((lane & 3) == 0) {
    if (in0 && ri[0].g == 0) offer(sh.picks[ri[0].cta_tok], p.rule, kb, g0);
    if (in1 && ri[1].g == 0) offer(sh.picks[ri[1].cta_tok], p.rule, kb, g1);
  }
}

// Fused top-K: every token of the tile gets its visibility and pick budget before any block.
__device__ void init_picks(const Params& p, SharedStorage& sh, int64_t t0, int64_t t1, int tid) {
  for (int64_t t = t0 + tid; t < t1; t += kConsumers * 128) {
    TokenPicks& tp = sh.picks[t - t0];
    const int64_t b = find_batch(p.cu_seqlens_q, p.batch, t);
    Segment seg;
    int64_t cursor = b;
    tp.nvis = next_segment(p, t, t + 1, cursor, seg) ? int32_t(token_blocks(p, seg, t)) : 0;
    tp.want = p.rule.topk - forced_count(p.rule, tp.nvis);
    tp.count = 0;
  }
}

// Unfused: blocks past each segment's loop bound have no visible key for any row of it.
__device__ void fill_tail(const Params& p, int64_t h, int64_t t0, int64_t t1, int consumer,
                          int warp, int lane) {
  if ((lane & 3) != 0) return;
  Segment seg;
  int64_t kb;
  int64_t b = p.batch > 0 ? find_batch(p.cu_seqlens_q, p.batch, t0) : 0;
  while (next_segment(p, t0, t1, b, seg))
    for (int r = consumer; r < p.row_groups; r += kConsumers)
      for (int u = 0; u < 2; ++u) {
        const RowInfo ri = row_info(p, t0, r, warp * 16 + (lane >> 2) + 8 * u);
        if (ri.t < seg.t_begin || ri.t >= seg.t_end) continue;
        for (kb = seg.nblocks; kb < p.nblk_max; ++kb)
          p.scores[((h * p.group + ri.g) * p.nblk_max + kb) * p.total_q + ri.t] = -INFINITY;
      }
}

}  // namespace msa::cuda::indexer_sm90
