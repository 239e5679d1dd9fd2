// The sm_90a indexer kernel: block scores (max over a block's visible keys of q . k) for every
// (query head, block, token), written to `scores` or reduced on the fly to top-K block ids
// (fused: scores never reach memory). Roles: producer warp (TMA: Q once, then K blocks through a
// kStages ring) and two consumer warpgroups (wgmma S = Q K^T, mask, row max, write or select).
// Barriers: q_full (producer arrive + TMA bytes), k_full[s] (same), k_empty[s] (lane 0 of each
// of the 8 consumer warps); named barrier 1 orders the fused top-K state among consumers.
#pragma once

#include "cuda/device/sm90.cuh"
#include "cuda/device/wgmma_m64n128.cuh"
#include "cuda/sm90/block_scores/params.h"
#include "cuda/sm90/block_scores/traits.h"

namespace msa::cuda::indexer_sm90 {

constexpr uint32_t kConsumerBarrier = 1;  // named barrier: both consumer warpgroups

// The part of the CTA's token tile [t0, t1) that falls in batch b, and what K it reads.
struct Segment {
  int64_t q0, lq, k0, lk;  // batch offsets and lengths
  int64_t t_begin, t_end;  // global tokens of the tile in this batch
  int64_t nblocks;         // blocks visible to the segment's last token (loop bound)
};

// Advances `b` to the next non-empty batch overlapping [t0, t1); false when there is none.
__device__ __forceinline__ bool next_segment(const Params& p, int64_t t0, int64_t t1, int64_t& b,
                                             Segment& s) {
  for (; b < p.batch; ++b) {
    const int64_t q0 = p.cu_seqlens_q[b], q1 = p.cu_seqlens_q[b + 1];
    if (q0 >= t1) return false;
    if (q1 <= q0 || q1 <= t0) continue;
    s.q0 = q0;
    s.lq = q1 - q0;
    s.k0 = p.keys.cu_seqlens_k[b];
    s.lk = batch_keys(p.keys, b);
    s.t_begin = q0 > t0 ? q0 : t0;
    s.t_end = q1 < t1 ? q1 : t1;
    if (s.lk < 0 || s.k0 < 0 || s.k0 + s.lk > p.total_k) {  // corrupt cu_seqlens_k: read nothing
      if (threadIdx.x == 0) flag_status(p.status, int32_t(StatusCode::bad_cu_seqlens), 1, b, 0);
      s.lk = 0;
    }
    const int64_t last = s.t_end - 1 - q0;
    int64_t end = p.causal ? last + s.lk - s.lq + 1 : s.lk;
    end = end < 0 ? 0 : (end > s.lk ? s.lk : end);
    s.nblocks = (end + kBlockN - 1) / kBlockN;
    if (s.nblocks > p.nblk_max) {
      if (threadIdx.x == 0)
        flag_status(p.status, int32_t(StatusCode::shape_mismatch), b, s.nblocks, p.nblk_max);
      s.nblocks = p.nblk_max;
    }
    ++b;
    return true;
  }
  return false;
}

// Visible block count of global token t of segment s.
__device__ __forceinline__ int64_t token_blocks(const Params& p, const Segment& s, int64_t t) {
  int64_t end = p.causal ? t - s.q0 + s.lk - s.lq + 1 : s.lk;
  end = end < 0 ? 0 : (end > s.lk ? s.lk : end);
  return (end + kBlockN - 1) / kBlockN;
}

// ---- producer ---------------------------------------------------------------------------
template <bool kFp8>
__device__ void run_producer(const Params& p, const CUtensorMap* tm_q, const CUtensorMap* tm_k,
                             SharedStorage& sh, int64_t h, int64_t t0, int64_t t1) {
  constexpr int kHalves = kFp8 ? 1 : 2;
  constexpr int kHalfQ = kTileM * kRowBytes, kHalfK = kBlockN * kRowBytes;
  const int tokens_per_group = kTileM / p.group;
  sm90::mbar_arrive_expect_tx(&sh.q_full, uint32_t(p.row_groups * kHalves * kHalfQ));
  for (int r = 0; r < p.row_groups; ++r)
    for (int half = 0; half < kHalves; ++half)
      sm90::tma_load_3d(sh.q[r] + half * kHalfQ, tm_q, &sh.q_full, half * 64,
                        int32_t(h * p.group), int32_t(t0 + r * tokens_per_group));
  int64_t b = find_batch(p.cu_seqlens_q, p.batch, t0), it = 0;
  Segment seg;
  while (next_segment(p, t0, t1, b, seg)) {
    for (int64_t kb = 0; kb < seg.nblocks; ++kb, ++it) {
      const int stage = int(it % kStages);
      if (it >= kStages) sm90::mbar_wait(&sh.k_empty[stage], uint32_t(((it / kStages) + 1) & 1));
      sm90::mbar_arrive_expect_tx(&sh.k_full[stage], uint32_t(kHalves * kHalfK));
      for (int half = 0; half < kHalves; ++half)
        sm90::tma_load_3d(sh.k[stage] + half * kHalfK, tm_k, &sh.k_full[stage], half * 64,
                          int32_t(h), int32_t(seg.k0 + kb * kBlockN));
    }
  }
}

// ---- consumers --------------------------------------------------------------------------
__device__ __forceinline__ float nan_max(float a, float b) {
  return (a != a || b != b) ? __int_as_float(0x7fc00000) : fmaxf(a, b);
}

// Max over this thread's columns <= lim of one accumulator row (kOff 0: row lane/4, 2: +8),
// reduced over the quad that shares the row. NaN in a visible column propagates (as on the CPU).
template <int kOff>
__device__ __forceinline__ float row_max(const float (&s)[64], int64_t lim, int lane) {
  float m = -INFINITY;
#pragma unroll
  for (int n = 0; n < 16; ++n)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int col = n * 8 + 2 * (lane & 3) + e;
      if (col <= lim) m = nan_max(m, s[n * 4 + kOff + e]);
    }
  m = nan_max(m, __shfl_xor_sync(0xffffffffu, m, 1));
  return nan_max(m, __shfl_xor_sync(0xffffffffu, m, 2));
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

// Epilogue of one row group's S tile for block kb of segment `seg`.
__device__ __forceinline__ void epilogue(const Params& p, SharedStorage& sh, const float (&s)[64],
                                         const Segment& seg, int64_t h, int64_t t0, int r,
                                         int64_t kb, int warp, int lane) {
  const int row0 = warp * 16 + (lane >> 2);
  const RowInfo ri[2] = {row_info(p, t0, r, row0), row_info(p, t0, r, row0 + 8)};
  float m[2];
#pragma unroll
  for (int u = 0; u < 2; ++u) {
    // Last visible key of the row's token (batch-local), in this block's columns; the block's
    // keys past lk belong to the next batch (or are TMA zeros) and are never visible.
    const int64_t last = p.causal ? ri[u].t - seg.q0 + seg.lk - seg.lq : seg.lk - 1;
    const int64_t lim = (last < seg.lk - 1 ? last : seg.lk - 1) - kb * kBlockN;
    m[u] = u == 0 ? row_max<0>(s, lim, lane) : row_max<2>(s, lim, lane);
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

template <bool kF16>
__device__ __forceinline__ void issue_qk(float (&acc)[64], uint32_t q_addr, uint32_t k_addr) {
  constexpr int kHalfQ = kTileM * kRowBytes, kHalfK = kBlockN * kRowBytes;
#pragma unroll
  for (int kk = 0; kk < kHeadDim / 16; ++kk) {
    // K-major, 128-byte swizzle: a k16 step is 32 bytes along a 128-byte row; D's second half
    // is the next 64-column buffer.
    const uint64_t da = sm90::wgmma_desc_sw128(q_addr + (kk >> 2) * kHalfQ + (kk & 3) * 32, 16, 1024);
    const uint64_t db = sm90::wgmma_desc_sw128(k_addr + (kk >> 2) * kHalfK + (kk & 3) * 32, 16, 1024);
    sm90::wgmma_ss<kF16>(acc, da, db, kk > 0 ? 1u : 0u);  // kk = 0 overwrites: no zeroing
  }
  sm90::wgmma_commit();
}

// Pins the accumulators after a wgmma wait: plain register reads must not move above it.
__device__ __forceinline__ void fence_acc(float (&acc)[64]) {
#pragma unroll
  for (int i = 0; i < 64; ++i) sm90::reg_fence(acc[i]);
}

template <bool kF16>
__device__ void run_consumer(const Params& p, SharedStorage& sh, int64_t h, int64_t t0, int64_t t1,
                             int consumer, int tid) {
  const int warp = tid >> 5, lane = tid & 31;
  const bool fused = p.scores == nullptr;
  const int r0 = consumer, r1 = consumer + kConsumers;
  const bool has0 = r0 < p.row_groups, has1 = r1 < p.row_groups;
  sm90::mbar_wait(&sh.q_full, 0);
  int64_t b = find_batch(p.cu_seqlens_q, p.batch, t0), it = 0;
  Segment seg;
  while (next_segment(p, t0, t1, b, seg)) {
    if (fused) {
      for (int64_t t = seg.t_begin + consumer * 128 + tid; t < seg.t_end; t += 256) {
        TokenPicks& tp = sh.picks[t - t0];
        tp.nvis = int32_t(token_blocks(p, seg, t));
        tp.want = p.rule.topk - forced_count(p.rule, tp.nvis);
        tp.count = 0;
      }
      sm90::named_sync(kConsumerBarrier, kConsumers * 128);
    }
    for (int64_t kb = 0; kb < seg.nblocks; ++kb, ++it) {
      const int stage = int(it % kStages);
      sm90::mbar_wait(&sh.k_full[stage], uint32_t((it / kStages) & 1));
      const uint32_t k_addr = sm90::smem_addr(sh.k[stage]);
      float acc0[64], acc1[64];
      sm90::wgmma_fence();
      if (has0) issue_qk<kF16>(acc0, sm90::smem_addr(sh.q[r0]), k_addr);
      if (has1) issue_qk<kF16>(acc1, sm90::smem_addr(sh.q[r1]), k_addr);
      if (has1) {
        sm90::wgmma_wait<1>();
        fence_acc(acc0);
        epilogue(p, sh, acc0, seg, h, t0, r0, kb, warp, lane);
        sm90::wgmma_wait<0>();
        fence_acc(acc1);
        epilogue(p, sh, acc1, seg, h, t0, r1, kb, warp, lane);
      } else if (has0) {
        sm90::wgmma_wait<0>();
        fence_acc(acc0);
        epilogue(p, sh, acc0, seg, h, t0, r0, kb, warp, lane);
      }
      __syncwarp();
      if (lane == 0) sm90::mbar_arrive(&sh.k_empty[stage]);
    }
    if (!fused && (lane & 3) == 0) {  // blocks past the segment's loop: no visible key
      for (int r = r0; r < p.row_groups; r += kConsumers) {
        for (int u = 0; u < 2; ++u) {
          const RowInfo ri = row_info(p, t0, r, warp * 16 + (lane >> 2) + 8 * u);
          if (ri.t < seg.t_begin || ri.t >= seg.t_end) continue;
          for (int64_t kb = seg.nblocks; kb < p.nblk_max; ++kb)
            p.scores[((h * p.group + ri.g) * p.nblk_max + kb) * p.total_q + ri.t] = -INFINITY;
        }
      }
    }
  }
  if (!fused) return;
  sm90::named_sync(kConsumerBarrier, kConsumers * 128);
  const int cw = consumer * 4 + warp;  // 0..7 over both consumers
  for (int tok = cw; tok < p.tokens_per_cta; tok += 2 * 4) {
    const int64_t t = t0 + tok;
    if (t >= p.total_q) break;
    const TokenPicks& tp = sh.picks[tok];
    write_q2k_row(p.q2k + (h * p.total_q + t) * p.rule.topk, tp.key, tp.count, tp.nvis, p.rule, lane);
  }
}

template <bool kF16>
__global__ void __launch_bounds__(kThreads, 1)
    block_scores_kernel(const __grid_constant__ CUtensorMap tm_q,
                        const __grid_constant__ CUtensorMap tm_k, const Params p) {
  extern __shared__ uint8_t smem_raw[];
  const uint32_t pad = (1024 - (sm90::smem_addr(smem_raw) & 1023)) & 1023;
  SharedStorage& sh = *reinterpret_cast<SharedStorage*>(smem_raw + pad);
  // Latest tiles first: under causal masking they see the most blocks.
  const int64_t tile = int64_t(gridDim.x) - 1 - blockIdx.x, h = blockIdx.y;
  const int64_t t0 = tile * p.tokens_per_cta;
  const int64_t t1 = t0 + p.tokens_per_cta < p.total_q ? t0 + p.tokens_per_cta : p.total_q;
  const int wg = threadIdx.x / 128;
  if (threadIdx.x == 0) {
    sm90::mbar_init(&sh.q_full, 1);
    for (int s = 0; s < kStages; ++s) {
      sm90::mbar_init(&sh.k_full[s], 1);
      sm90::mbar_init(&sh.k_empty[s], kConsumers * 4);
    }
    sm90::fence_barrier_init();
    sm90::prefetch_tensor_map(&tm_q);
    sm90::prefetch_tensor_map(&tm_k);
  }
  __syncthreads();
  if (wg == 0) {
    sm90::regs_dealloc<kProducerRegs>();
    if (threadIdx.x == 0) run_producer<false>(p, &tm_q, &tm_k, sh, h, t0, t1);
  } else {
    sm90::regs_alloc<kConsumerRegs>();
    run_consumer<kF16>(p, sh, h, t0, t1, wg - 1, threadIdx.x - 128 * wg);
  }
}

}  // namespace msa::cuda::indexer_sm90
