// The sm_90a indexer kernel: block scores (max over a block's visible keys of q . k) for every
// (query head, block, token), written to `scores` or reduced on the fly to top-K block ids
// (fused: scores never reach memory). Roles: producer warp (TMA: Q once, then K blocks through a
// kStages ring) and two consumer warpgroups (wgmma S = Q K^T, mask, row max, write or select).
// Barriers: q_full (producer arrive + TMA bytes), k_full[s] (same), k_empty[s] (lane 0 of each
// of the 8 consumer warps); named barrier 1 orders the fused top-K state among consumers, 2 and
// 3 pass the turn to issue wgmma between the consumer warpgroups (ping-pong).
#pragma once

#include "cuda/device/sm90.cuh"
#include "cuda/device/wgmma_m64n128.cuh"
#include "cuda/sm90/block_scores/params.h"
#include "cuda/sm90/block_scores/traits.h"

namespace msa::cuda::indexer_sm90 {

constexpr uint32_t kConsumerBarrier = 1;  // named barrier: both consumer warpgroups
constexpr uint32_t kTurnBarrier = 2;      // 2, 3: consumer 0's / 1's turn to issue wgmma

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

// The CTA's (segment, block) work items in order, as both roles walk them.
class ItemIter {
 public:
  __device__ ItemIter(const Params& p, int64_t t0, int64_t t1)
      : p_(p), t0_(t0), t1_(t1), b_(p.batch > 0 ? find_batch(p.cu_seqlens_q, p.batch, t0) : 0) {}
  // Next item; false when the tile has no more.
  __device__ bool next(Segment& seg, int64_t& kb) {
    while (kb_ + 1 >= cur_.nblocks) {
      if (!next_segment(p_, t0_, t1_, b_, cur_)) return false;
      kb_ = -1;
    }
    ++kb_;
    seg = cur_;
    kb = kb_;
    return true;
  }

 private:
  const Params& p_;
  int64_t t0_, t1_, b_;
  Segment cur_{0, 0, 0, 0, 0, 0, 0};
  int64_t kb_ = -1;
};

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
  ItemIter iter(p, t0, t1);
  Segment seg;
  int64_t kb;
  for (int64_t it = 0; iter.next(seg, kb); ++it) {
    const int stage = int(it % kStages);
    if (it >= kStages) sm90::mbar_wait(&sh.k_empty[stage], uint32_t(((it / kStages) + 1) & 1));
    sm90::mbar_arrive_expect_tx(&sh.k_full[stage], uint32_t(kHalves * kHalfK));
    for (int half = 0; half < kHalves; ++half)
      sm90::tma_load_3d(sh.k[stage] + half * kHalfK, tm_k, &sh.k_full[stage], half * 64,
                        int32_t(h), int32_t(seg.k0 + kb * kBlockN));
  }
}

// ---- consumers --------------------------------------------------------------------------
// max that propagates NaN (PTX max.NaN, sm_80+): one instruction, as the CPU's NaN rule needs.
__device__ __forceinline__ float nan_max(float a, float b) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

// Max over this thread's columns <= lim (in [-1, 127]) of one accumulator row (kOff 0: row
// lane/4, 2: row lane/4 + 8), reduced over the quad that shares the row. Blocks wholly visible
// to the row (every block but the diagonal and the batch tail) take the unmasked path: this
// epilogue runs for every S element, and instruction issue, not the tensor cores, bounded the
// first version (ncu: 36% issue-slot use, ALU busiest, tensor pipe idle).
template <int kOff>
__device__ __forceinline__ float row_max(const float (&s)[64], int lim, int lane) {
  float m[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};  // independent chains for ILP
  if (lim >= kBlockN - 1) {
#pragma unroll
    for (int n = 0; n < 16; ++n) m[n & 3] = nan_max(m[n & 3], nan_max(s[n * 4 + kOff], s[n * 4 + kOff + 1]));
  } else {
    const int c0 = 2 * (lane & 3);
#pragma unroll
    for (int n = 0; n < 16; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e)
        m[n & 3] = nan_max(m[n & 3], n * 8 + c0 + e <= lim ? s[n * 4 + kOff + e] : -INFINITY);
  }
  float r = nan_max(nan_max(m[0], m[1]), nan_max(m[2], m[3]));
  r = nan_max(r, __shfl_xor_sync(0xffffffffu, r, 1));
  return nan_max(r, __shfl_xor_sync(0xffffffffu, r, 2));
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
    int64_t lim = (last < seg.lk - 1 ? last : seg.lk - 1) - kb * kBlockN;
    lim = lim < -1 ? -1 : (lim > kBlockN - 1 ? kBlockN - 1 : lim);
    m[u] = u == 0 ? row_max<0>(s, int(lim), lane) : row_max<2>(s, int(lim), lane);
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

__device__ __forceinline__ void release(SharedStorage& sh, int stage, int lane) {
  __syncwarp();
  if (lane == 0) sm90::mbar_arrive(&sh.k_empty[stage]);
}

// Number of (segment, block) items of the tile.
__device__ __forceinline__ int64_t count_items(const Params& p, int64_t t0, int64_t t1) {
  int64_t n = 0, b = p.batch > 0 ? find_batch(p.cu_seqlens_q, p.batch, t0) : 0;
  Segment seg;
  while (next_segment(p, t0, t1, b, seg)) n += seg.nblocks;
  return n;
}

// The block loop of a consumer warpgroup with kAcc (0, 1 or 2) row groups. Everything that
// decides where a wgmma is issued or waited on is fixed at compile time or a loop bound, never
// a branch inside the loop, and accumulators never live across iterations: otherwise ptxas
// serializes every wgmma of the kernel (C7514 / C7518 / C7520).
template <bool kF16, int kAcc>
__device__ void consume_blocks(const Params& p, SharedStorage& sh, int64_t h, int64_t t0,
                               int64_t t1, int consumer, int warp, int lane) {
  const int64_t n = count_items(p, t0, t1);
  ItemIter iter(p, t0, t1);
  Segment seg;
  int64_t kb;
  auto k_ready = [&](int64_t it) {
    const int stage = int(it % kStages);
    sm90::mbar_wait(&sh.k_full[stage], uint32_t((it / kStages) & 1));
    return sm90::smem_addr(sh.k[stage]);
  };
  if constexpr (kAcc == 0) {
    for (int64_t it = 0; it < n; ++it) {
      k_ready(it);
      release(sh, int(it % kStages), lane);
    }
  } else if constexpr (kAcc == 1) {
    const uint32_t q0 = sm90::smem_addr(sh.q[consumer]);
    float acc0[64];
    for (int64_t it = 0; it < n; ++it) {
      const uint32_t k = k_ready(it);
      sm90::wgmma_fence();
      issue_qk<kF16>(acc0, q0, k);
      sm90::wgmma_wait<0>();
      fence_acc(acc0);
      release(sh, int(it % kStages), lane);
      iter.next(seg, kb);
      epilogue(p, sh, acc0, seg, h, t0, consumer, kb, warp, lane);
    }
  } else {
    // Ping-pong: the warpgroups take turns issuing their two S tiles (named barriers
    // kTurnBarrier + consumer), so one warpgroup's epilogue runs under the other's wgmma.
    const int r0 = consumer, r1 = consumer + kConsumers;
    const uint32_t q0 = sm90::smem_addr(sh.q[r0]), q1 = sm90::smem_addr(sh.q[r1]);
    const uint32_t my_turn = kTurnBarrier + consumer, other_turn = kTurnBarrier + 1 - consumer;
    if (consumer == 1 && n > 0) sm90::named_arrive(kTurnBarrier, kConsumers * 128);
    for (int64_t it = 0; it < n; ++it) {
      iter.next(seg, kb);
      const uint32_t k = k_ready(it);
      float acc0[64], acc1[64];
      sm90::named_sync(my_turn, kConsumers * 128);
      sm90::wgmma_fence();
      issue_qk<kF16>(acc0, q0, k);
      issue_qk<kF16>(acc1, q1, k);
      if (consumer == 0 || it + 1 < n) sm90::named_arrive(other_turn, kConsumers * 128);
      sm90::wgmma_wait<1>();
      fence_acc(acc0);
      epilogue(p, sh, acc0, seg, h, t0, r0, kb, warp, lane);
      sm90::wgmma_wait<0>();
      fence_acc(acc1);
      release(sh, int(it % kStages), lane);
      epilogue(p, sh, acc1, seg, h, t0, r1, kb, warp, lane);
    }
  }
}

template <bool kF16, int kRowGroups>
__device__ void run_consumer(const Params& p, SharedStorage& sh, int64_t h, int64_t t0, int64_t t1,
                             int consumer, int tid) {
  const int warp = tid >> 5, lane = tid & 31;
  const bool fused = p.scores == nullptr;
  if (fused) {
    init_picks(p, sh, t0, t1, consumer * 128 + tid);
    sm90::named_sync(kConsumerBarrier, kConsumers * 128);
  }
  sm90::mbar_wait(&sh.q_full, 0);
  // Row groups per consumer: 2 for R = 4, 1 for R = 2, 1 / 0 for R = 1 (compile time).
  if constexpr (kRowGroups == 4) consume_blocks<kF16, 2>(p, sh, h, t0, t1, consumer, warp, lane);
  else if constexpr (kRowGroups == 2) consume_blocks<kF16, 1>(p, sh, h, t0, t1, consumer, warp, lane);
  else if (consumer == 0) consume_blocks<kF16, 1>(p, sh, h, t0, t1, consumer, warp, lane);
  else consume_blocks<kF16, 0>(p, sh, h, t0, t1, consumer, warp, lane);
  if (!fused) {
    fill_tail(p, h, t0, t1, consumer, warp, lane);
    return;
  }
  sm90::named_sync(kConsumerBarrier, kConsumers * 128);
  const int cw = consumer * 4 + warp;  // 0..7 over both consumers
  for (int tok = cw; tok < p.tokens_per_cta; tok += kConsumers * 4) {
    const int64_t t = t0 + tok;
    if (t >= p.total_q) break;
    const TokenPicks& tp = sh.picks[tok];
    write_q2k_row(p.q2k + (h * p.total_q + t) * p.rule.topk, tp.key, tp.count, tp.nvis, p.rule, lane);
  }
}

template <bool kF16, int kRowGroups>
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
    run_consumer<kF16, kRowGroups>(p, sh, h, t0, t1, wg - 1, threadIdx.x - 128 * wg);
  }
}

}  // namespace msa::cuda::indexer_sm90
