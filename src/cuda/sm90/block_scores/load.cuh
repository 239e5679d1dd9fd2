// Producer of the sm_90a indexer: one thread issues the TMA loads, Q once (q_full), then each
// work item's K block through the kStages ring (k_full / k_empty). Called from kernel.cuh.
#pragma once

#include "cuda/device/sm90.cuh"
#include "cuda/sm90/block_scores/work.cuh"

namespace msa::cuda::indexer_sm90 {

template <Elem kElem>
__device__ void run_producer(const Params& p, const CUtensorMap* tm_q, const CUtensorMap* tm_k,
                             SharedStorage& sh, int64_t h, int64_t t0, int64_t t1) {
  constexpr int kHalves = kElem == Elem::e4m3 ? 1 : 2;  // 128-byte rows per D = 128
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

}  // namespace msa::cuda::indexer_sm90
