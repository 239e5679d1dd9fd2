// The sm_90a indexer kernel: block scores (max over a block's visible keys of q . k) for every
// (query head, block, token), written to `scores` or reduced on the fly to top-K block ids
// (fused: scores never reach memory). Roles: producer warp (TMA: Q once, then K blocks through a
// kStages ring; flat K by lane 0, paged K one box per lane), consumer warpgroups (wgmma
// S = Q K^T, mask, row max, then the score store or, fused, the group max into the selector
// ring: two, or four in the wide (fused) kernels, Cfg); fused, the selectors (producer warps 1
// and 2, one thread per token: run_selector); unfused, the -inf stores past each segment's blocks
// (producer warps 1-3: fill_tail).
// FP4 inputs (fp4.cuh): no TMA; the producer warpgroup converts Q and each K block to bf16 in
// shared memory (4 warps narrow, warps 0 and 3 wide) and the consumers multiply bf16.
// Barriers: q_full (producer arrive + TMA bytes; FP4: each converter's arrival), k_full[s] (same, plus each producer lane's
// cp.async arrival for FP8 per-key scales), k_empty[s] (lane 0 of each consumer warp; every
// consumer thread when it reads staged key scales), sel_full[s] / sel_empty[s] (the fused
// path's ring of group maxima: consumer threads that run epilogues / the 64 selector threads);
// NamedBarrier::kSelectorsDone holds the consumers until the selectors' last offers (fused).
// Each narrow consumer warpgroup pipelines its two row groups' wgmmas under its own epilogues
// (mma.cuh).
#pragma once

#include "cuda/sm90/block_scores/fp4.cuh"
#include "cuda/sm90/block_scores/load.cuh"
#include "cuda/sm90/block_scores/mma.cuh"

namespace msa::cuda::indexer_sm90 {

// kBlk: keys per score block, 128 or 64 (traits.h: a 128-key K tile is one block or two).
// kShard: an ICP rank's shard (Params::shard; paged, no FP4, 4 row groups: launch.cu); wide, it
// writes the rank's lists (mma.cuh, run_consumer). kD: the head dim (traits.h kHeadDimOk).
template <Elem kElem, int kBlk, int kRowGroups, bool kWide, bool kShard = false, int kD = kHeadDim>
__global__ void __launch_bounds__(Cfg<kWide>::kThreads, 1)
    block_scores_kernel(const __grid_constant__ CUtensorMap tm_q,
                        const __grid_constant__ CUtensorMap tm_k, const Params p) {
  static_assert(!kShard || kElem != Elem::fp4, "shards: no FP4 (launch.cu)");
  static_assert(kHeadDimOk<kElem, kD> && (kD == kHeadDim || !kShard),
                "head dims: 16-bit 64 / 128, e4m3 128 / 256, FP4 and shards 128 (traits.h)");
  extern __shared__ uint8_t smem_raw[];
  const uint32_t pad = (1024 - (sm90::smem_addr(smem_raw) & 1023)) & 1023;
  SharedStorage& sh = *reinterpret_cast<SharedStorage*>(smem_raw + pad);
  // Latest tiles first: under causal masking they see the most blocks.
  const int64_t tile = int64_t(gridDim.x) - 1 - blockIdx.x, h = blockIdx.y;
  int64_t t0 = tile * p.tokens_per_cta;
  int64_t t1 = t0 + p.tokens_per_cta < p.total_q ? t0 + p.tokens_per_cta : p.total_q;
  if (p.seg_groups > 1) {
    group_tokens(p, int(blockIdx.z / p.item_splits), t0, t1);
    if (t0 >= t1) return;  // the whole CTA: no barrier is set up yet
  }
  const bool first_split = blockIdx.z % p.item_splits == 0;  // writes the -inf tail (unfused)
  const int active = active_row_groups(p, t0, t1);
  const int wg = threadIdx.x / 128;
  constexpr int kC = Cfg<kWide>::kConsumers;
  // FP4: the converters (fp4.cuh) arrive on q_full and k_full, one arrival each.
  constexpr int kConverters = kWide ? 64 : 128;
  constexpr bool kFp4 = kElem == Elem::fp4;
  if (threadIdx.x == 0) {
    sm90::mbar_init(&sh.q_full, kFp4 ? kConverters : 1);
    for (int s = 0; s < kStages; ++s) {
      sm90::mbar_init(&sh.k_full[s], kFp4 ? kConverters : k_full_arrivals(per_key_scales<kElem>(p)));
      sm90::mbar_init(&sh.k_empty[s], per_key_scales<kElem>(p) ? kC * 128 : kC * 4);
    }
    for (int s = 0; s < kSelRing; ++s) {  // fused: consumers running epilogues / selectors
      sm90::mbar_init(&sh.sel_full[s], (active < kC ? active : kC) * 128);
      sm90::mbar_init(&sh.sel_empty[s], kSelectors);
    }
    sm90::fence_barrier_init();
    if constexpr (!kFp4) {
      sm90::prefetch_tensor_map(&tm_q);
      sm90::prefetch_tensor_map(&tm_k);
    }
  }
  __syncthreads();
  if (wg == 0) {
    sm90::regs_dealloc<kFp4 ? Cfg<kWide>::kFp4ProducerRegs : Cfg<kWide>::kProducerRegs>();
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    if constexpr (kFp4) {  // no TMA: the converters load (fp4.cuh)
      if constexpr (kWide) {  // warps 0 and 3 convert, 1 and 2 select
        if (warp == 0 || warp == 3) run_fp4_converter<kConverters, kBlk, false>(p, sh, h, t0, t1, warp == 0 ? lane : 32 + lane);
        else run_selector<kC, kBlk>(p, sh, h, t0, t1, threadIdx.x - 32);
      } else {  // all four convert, then write the -inf tail
        run_fp4_converter<kConverters, kBlk, true>(p, sh, h, t0, t1, threadIdx.x);
        if (first_split) fill_tail<kBlk>(p, h, t0, t1, warp, 4, lane);
      }
    } else if (threadIdx.x < 32) run_producer<kElem, kBlk, !kWide, kShard, kD>(p, &tm_q, &tm_k, sh, h, t0, t1,
                                                                 threadIdx.x);
    else if constexpr (kWide) {  // fused (launch.cu)
      if (threadIdx.x < 32 + kSelectors) run_selector<kC, kBlk, kShard>(p, sh, h, t0, t1, threadIdx.x - 32);
    } else if (first_split) {  // one split writes the tail (cta_items)
      fill_tail<kBlk, kShard>(p, h, t0, t1, warp - 1, 3, lane);
    }
  } else {
    sm90::regs_alloc<kFp4 ? Cfg<kWide>::kFp4ConsumerRegs : Cfg<kWide>::kConsumerRegs>();
    run_consumer<kElem, kBlk, kRowGroups, kWide, kShard, kD>(p, sh, h, t0, t1, wg - 1,
                                                             threadIdx.x - 128 * wg, active);
  }
}

}  // namespace msa::cuda::indexer_sm90
