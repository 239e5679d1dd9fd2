// Consumer warpgroups of the sm_90a indexer: S = Q K^T by wgmma (both operands in shared
// memory, 128-byte swizzle), the ping-pong turn protocol between the two warpgroups, the K stage
// releases, and the fused top-K write-out. Called from kernel.cuh.
#pragma once

#include "cuda/device/sm90.cuh"
#include "cuda/device/wgmma_m64n128.cuh"
#include "cuda/sm90/block_scores/epilogue.cuh"

namespace msa::cuda::indexer_sm90 {

constexpr uint32_t kConsumerBarrier = 1;  // named barrier: both consumer warpgroups
constexpr uint32_t kTurnBarrier = 2;      // 2, 3: consumer 0's / 1's turn to issue wgmma

// Issues S = Q K^T for one row group (one commit group). K-major operands, 128-byte swizzle:
// a k-step is 32 bytes along a 128-byte row (k16 for 16-bit, k32 for e4m3); for 16-bit inputs
// D's second half is the next 64-column buffer. The first step overwrites: no zeroing.
template <Elem kElem>
__device__ __forceinline__ void issue_qk(float (&acc)[64], uint32_t q_addr, uint32_t k_addr) {
  constexpr int kHalfQ = kTileM * kRowBytes, kHalfK = kBlockN * kRowBytes;
  constexpr int kSteps = kElem == Elem::e4m3 ? kHeadDim / 32 : kHeadDim / 16;
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk) {
    const uint64_t da = sm90::wgmma_desc_sw128(q_addr + (kk >> 2) * kHalfQ + (kk & 3) * 32, 16, 1024);
    const uint64_t db = sm90::wgmma_desc_sw128(k_addr + (kk >> 2) * kHalfK + (kk & 3) * 32, 16, 1024);
    if constexpr (kElem == Elem::e4m3) sm90::wgmma_ss_e4m3(acc, da, db, kk > 0 ? 1u : 0u);
    else sm90::wgmma_ss<kElem == Elem::f16>(acc, da, db, kk > 0 ? 1u : 0u);
  }
  sm90::wgmma_commit();
}

// Pins the accumulators after a wgmma wait: plain register reads must not move above it.
__device__ __forceinline__ void fence_acc(float (&acc)[64]) {
#pragma unroll
  for (int i = 0; i < 64; ++i) sm90::reg_fence(acc[i]);
}

// Frees a K stage: lane 0 of each consumer warp after its warp's reads, or, when the epilogue
// read the stage's key scales, every consumer thread (each reader is then its own arrival).
__device__ __forceinline__ void release(SharedStorage& sh, int stage, int lane, bool per_key) {
  if (per_key) {
    sm90::mbar_arrive(&sh.k_empty[stage]);
    return;
  }
  __syncwarp();
  if (lane == 0) sm90::mbar_arrive(&sh.k_empty[stage]);
}

// The block loop of a consumer warpgroup with kAcc (0, 1 or 2) row groups. Everything that
// decides where a wgmma is issued or waited on is fixed at compile time or a loop bound, never
// a branch inside the loop, and accumulators never live across iterations: otherwise ptxas
// serializes every wgmma of the kernel (C7514 / C7518 / C7520).
template <Elem kElem, int kAcc>
__device__ void consume_blocks(const Params& p, SharedStorage& sh, int64_t h, int64_t t0,
                               int64_t t1, int consumer, int warp, int lane) {
  const int64_t n = count_items(p, t0, t1);
  const bool per_key = per_key_scales<kElem>(p);  // the epilogue reads the stage's key scales
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
      release(sh, int(it % kStages), lane, per_key);
    }
  } else if constexpr (kAcc == 1) {
    const uint32_t q0 = sm90::smem_addr(sh.q[consumer]);
    float acc0[64];
    for (int64_t it = 0; it < n; ++it) {
      const int stage = int(it % kStages);
      const uint32_t k = k_ready(it);
      sm90::wgmma_fence();
      issue_qk<kElem>(acc0, q0, k);
      sm90::wgmma_wait<0>();
      fence_acc(acc0);
      if (!per_key) release(sh, stage, lane, false);
      iter.next(seg, kb);
      epilogue<kElem>(p, sh, acc0, seg, h, t0, consumer, kb, warp, lane, sh.k_scale[stage]);
      if (per_key) release(sh, stage, lane, true);
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
      issue_qk<kElem>(acc0, q0, k);
      issue_qk<kElem>(acc1, q1, k);
      if (consumer == 0 || it + 1 < n) sm90::named_arrive(other_turn, kConsumers * 128);
      const int stage = int(it % kStages);
      sm90::wgmma_wait<1>();
      fence_acc(acc0);
      epilogue<kElem>(p, sh, acc0, seg, h, t0, r0, kb, warp, lane, sh.k_scale[stage]);
      sm90::wgmma_wait<0>();
      fence_acc(acc1);
      if (!per_key) release(sh, stage, lane, false);
      epilogue<kElem>(p, sh, acc1, seg, h, t0, r1, kb, warp, lane, sh.k_scale[stage]);
      if (per_key) release(sh, stage, lane, true);
    }
  }
}

template <Elem kElem, int kRowGroups>
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
  if constexpr (kRowGroups == 4) consume_blocks<kElem, 2>(p, sh, h, t0, t1, consumer, warp, lane);
  else if constexpr (kRowGroups == 2) consume_blocks<kElem, 1>(p, sh, h, t0, t1, consumer, warp, lane);
  else if (consumer == 0) consume_blocks<kElem, 1>(p, sh, h, t0, t1, consumer, warp, lane);
  else consume_blocks<kElem, 0>(p, sh, h, t0, t1, consumer, warp, lane);
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

}  // namespace msa::cuda::indexer_sm90
