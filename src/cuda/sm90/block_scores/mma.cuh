// Consumer warpgroups of the sm_90a indexer: S = Q K^T by wgmma (both operands in shared
// memory, 128-byte swizzle), the block loops (two pipelined row groups per narrow consumer, one
// per wide one: Cfg), the K stage releases, the fused selectors and top-K write-out. Called from
// kernel.cuh.
#pragma once

#include <type_traits>

#include "cuda/device/sm90.cuh"
#include "cuda/device/wgmma_m64n128.cuh"
#include "cuda/sm90/block_scores/epilogue.cuh"

namespace msa::cuda::indexer_sm90 {

using sm90::desc_offset;
using sm90::tile_desc;

// Issues S = Q K^T for one row group (one commit group). K-major operands, 128-byte swizzle:
// a k-step is 32 bytes along a 128-byte row (k16 for 16-bit, k32 for e4m3); for 16-bit inputs
// D's second half is the next 64-column buffer. The first step overwrites: no zeroing.
// q_desc, k_desc: descriptors of the row group's Q tile and of the K stage (tile_desc). kD: the
// head dim (traits.h kRowHalves): four k-steps a 128-byte row.
template <Elem kElem, int kD>
__device__ __forceinline__ void issue_qk(float (&acc)[64], uint64_t q_desc, uint64_t k_desc) {
  constexpr int kHalfQ = kTileM * kRowBytes, kHalfK = kBlockN * kRowBytes;
  constexpr int kSteps = 4 * kRowHalves<kElem, kD>;
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk) {
    const uint64_t da = desc_offset(q_desc, (kk >> 2) * kHalfQ + (kk & 3) * 32);
    const uint64_t db = desc_offset(k_desc, (kk >> 2) * kHalfK + (kk & 3) * 32);
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

// Frees a K stage: lane 0 of each consumer warp after its warp's reads, or, when the consumers
// read the stage's key scales (load_key_scales), every consumer thread (each reader is then its
// own arrival; the arrive's release orders its scale loads before the producer's next write).
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
// a branch inside the loop, and no wgmma is in flight across an iteration's end: otherwise
// ptxas serializes every wgmma of the kernel (C7514 / C7517 / C7518 / C7520). What the
// epilogue needs of the thread's rows is computed once per batch segment (segment_rows), never
// per block; the K stage and phase are stepped (sm90::RingState). An item is a 128-key K tile:
// one block, or two of 64 keys (kBlk; the epilogue scores both).
template <Elem kElem, int kBlk, int kAcc, bool kFused, bool kShard, int kD>  // kShard: work.cuh
__device__ void consume_blocks(const Params& p, SharedStorage& sh, int64_t h, int64_t t0,
                               int64_t t1, int consumer_in, int warp, int lane) {
  // Warp-uniform by construction (redux.sync results land in uniform registers): with a uniform
  // loop bound, consumer index and stage, ptxas builds the wgmma descriptors in the uniform
  // datapath (UIADD3) instead of in vector registers moved over with R2UR per k-step.
  const ItemRange range = cta_items<kBlk, !kFused, kShard>(p, t0, t1);
  const int n = __reduce_max_sync(0xffffffffu, range.count);
  const int consumer = __reduce_max_sync(0xffffffffu, consumer_in);
  const bool per_key = per_key_scales<kElem>(p);  // the epilogue reads the stage's key scales
  ItemCursor<kBlk, !kFused, kShard> iter(p, t0, t1, range.first);
  sm90::RingState<kStages> ring;  // the K stage of the current item
  int kb = 0;
  bool fresh = false;
  const uint64_t k_desc0 = tile_desc(sh.k[0]);  // stage s: + s * kKBlockBytes
  auto k_stage = [&]() {  // descriptor of the current stage's K block
    const int s = __reduce_max_sync(0xffffffffu, ring.stage);  // uniform again (see n)
    return desc_offset(k_desc0, uint32_t(s) * kKBlockBytes);
  };
  auto k_ready = [&]() {
    sm90::mbar_wait(&sh.k_full[ring.stage], ring.phase);
    return k_stage();
  };

  float2 ksc[16];  // per-key scales of the current block (load_key_scales), only if per_key
  // Fused: item it's group maxima go to selector ring slot it % kSelRing; every thread that runs
  // epilogues waits for the slot to be free before the item's wgmma and arrives once the item's
  // epilogues have written it (run_selector reads it).
  // kFused: p.scores == nullptr (run_consumer runs a loop of its own for each).
  auto sel_acquire = [&](int it) {
    if constexpr (kFused) sm90::mbar_wait(&sh.sel_empty[SelRing::stage(it)], SelRing::empty_parity(it));
  };
  auto sel_publish = [&](int it, int blk) {
    if constexpr (!kFused) return;
    if (consumer == 0 && warp == 0 && lane == 0) sh.sel[it % kSelRing].kb = blk;
    sm90::mbar_arrive(&sh.sel_full[it % kSelRing]);
  };
  // Epilogue of item it (K tile blk) for one row group. Scores offset of the tile's first block
  // (blk, or 2 blk for 64-key blocks): total_q < 2^31 (launch.cu), one 32 x 32 -> 64-bit
  // multiply. src (a ScaleSrc tag, per_key only): kKeep, ksc as loaded; kRefill, ksc reloaded
  // meanwhile with the scales staged at `next`; kSmem, the scales read from `next` where used
  // (row_max2).
  auto epi = [&](const float(&acc)[64], const SegRows& sr, int blk, int it, auto src,
                 const float* next) {
    constexpr int kSrc = decltype(src)::value;
    const uint32_t block0 = uint32_t(blk) * uint32_t(kBlocksPerTile<kBlk>);
    const int64_t off = int64_t(uint64_t(block0) * uint32_t(p.total_q));
    const int slot = it % kSelRing;
    if (per_key) epilogue<kElem, kBlk, true, kFused, kSrc, kShard>(p, sh, acc, sr, blk, off, lane, ksc, slot, next);
    else epilogue<kElem, kBlk, false, kFused, kKeep, kShard>(p, sh, acc, sr, blk, off, lane, ksc, slot);
  };
  constexpr std::integral_constant<int, kKeep> kKeepScales{};
  constexpr std::integral_constant<int, kRefill> kRefillScales{};
  constexpr std::integral_constant<int, kSmem> kSmemScales{};
  if constexpr (kAcc == 0) {
    for (int it = 0; it < n; ++it) {
      k_ready();
      release(sh, ring.stage, lane, per_key);
      ring.advance();
    }
  } else if constexpr (kAcc == 1) {
    // One tile per block. With Cfg::kScalesFromSmem (the wide consumers) the epilogue reads the
    // stage's key scales itself, so the stage is released after it, not after the wgmma.
    constexpr bool kFromSmem = Cfg<kFused>::kScalesFromSmem;
    const uint64_t q0 = tile_desc(sh.q[consumer]);
    SegRows sr0;
    float acc0[64];
    for (int it = 0; it < n; ++it) {
      sel_acquire(it);
      const uint64_t k = k_ready();
      sm90::wgmma_fence();
      issue_qk<kElem, kD>(acc0, q0, k);
      if (per_key && !kFromSmem) load_key_scales(sh.k_scale[ring.stage], lane, ksc);
      sm90::wgmma_wait<0>();
      fence_acc(acc0);
      if (!kFromSmem) release(sh, ring.stage, lane, per_key);
      SegBounds seg;
      iter.next(kb, fresh, seg);
      if (fresh) sr0 = segment_rows<kElem, kShard>(p, seg, h, t0, consumer, warp, lane);
      if constexpr (kFromSmem) {
        epi(acc0, sr0, kb, it, kSmemScales, sh.k_scale[ring.stage]);
        release(sh, ring.stage, lane, per_key);
      } else {
        epi(acc0, sr0, kb, it, kKeepScales, nullptr);
      }
      sel_publish(it, kb);
      ring.advance();
    }
  } else {
    // Two row groups, software-pipelined across items: while the epilogue of one row group runs,
    // the wgmma of the other is in flight (item it-1's second-tile epilogue under item it's first
    // tile, item it's first-tile epilogue under its second tile), so the warpgroup's chain per
    // item is its two epilogues, not a wgmma wait plus both. The warpgroups run freely (no
    // issue turns): each keeps one tile queued on the tensor cores through each epilogue. With a
    // ping-pong instead, ncu showed the period as the wgmma wait, both epilogues and the turn
    // hand-off in series, the tensor pipe ~36% busy.
    // Every iteration ends with no wgmma in flight (ptxas serializes wgmmas in flight across the
    // back edge: C7514 / C7517): item it-1's second tile completes at the end of iteration it-1
    // and its epilogue runs in iteration it under item it's first tile. The first item is peeled
    // so that no branch inside the loop decides where a wgmma is issued or waited on (see above);
    // the last item's second epilogue drains after the loop.
    const int r0 = consumer, r1 = consumer + Cfg<kFused>::kConsumers;
    const uint64_t q0 = tile_desc(sh.q[r0]), q1 = tile_desc(sh.q[r1]);
    SegRows sr0, sr1;
    float acc0[64], acc1[64];
    int kb_prev = 0;  // item it-1's block; its stage is the one before `stage`
    auto prev_stage = [&]() { return ring.stage == 0 ? kStages - 1 : ring.stage - 1; };
    if (n > 0) {
      SegBounds seg;
      iter.next(kb, fresh, seg);  // the first item opens a segment
      sr0 = segment_rows<kElem, kShard>(p, seg, h, t0, r0, warp, lane);
      sr1 = segment_rows<kElem, kShard>(p, seg, h, t0, r1, warp, lane);
      sel_acquire(0);
      const uint64_t k = k_ready();
      if (per_key) load_key_scales(sh.k_scale[ring.stage], lane, ksc);
      sm90::wgmma_fence();
      issue_qk<kElem, kD>(acc0, q0, k);
      issue_qk<kElem, kD>(acc1, q1, k);
      sm90::wgmma_wait<1>();
      fence_acc(acc0);
      epi(acc0, sr0, kb, 0, kKeepScales, nullptr);
      sm90::wgmma_wait<0>();
      fence_acc(acc1);
      kb_prev = kb;
      ring.advance();
    }
    for (int it = 1; it < n; ++it) {
      SegBounds seg;
      iter.next(kb, fresh, seg);
      if (fresh) sr0 = segment_rows<kElem, kShard>(p, seg, h, t0, r0, warp, lane);
      sel_acquire(it);
      const uint64_t k = k_ready();
      sm90::wgmma_fence();
      issue_qk<kElem, kD>(acc0, q0, k);
      // ksc holds item it-1's scales on entry and item it's on return (read from item it's
      // stage, full since k_ready).
      epi(acc1, sr1, kb_prev, it - 1, kRefillScales, sh.k_scale[ring.stage]);
      sel_publish(it - 1, kb_prev);
      release(sh, prev_stage(), lane, per_key);  // its scales were read in iteration it-1
      if (fresh) sr1 = segment_rows<kElem, kShard>(p, seg, h, t0, r1, warp, lane);
      sm90::wgmma_fence();
      issue_qk<kElem, kD>(acc1, q1, k_stage());  // recomputed: no descriptor live across the epilogue
      sm90::wgmma_wait<1>();  // this item's first tile
      fence_acc(acc0);
      epi(acc0, sr0, kb, it, kKeepScales, nullptr);
      sm90::wgmma_wait<0>();  // the second: nothing in flight across the back edge
      fence_acc(acc1);
      kb_prev = kb;
      ring.advance();
    }
    if (n > 0) {
      epi(acc1, sr1, kb_prev, n - 1, kKeepScales, nullptr);
      sel_publish(n - 1, kb_prev);
      release(sh, prev_stage(), lane, per_key);
    }
  }
}

// Fused top-K selectors (producer warps 1 and 2). Lists sel, sel + 64, ... of the CTA (traits.h)
// belong to selector thread `sel`'s warp. Per item the selectors read each list's group max from
// the ring slot the consumers published and offer it, in block order as the consumers walk
// them, so the lists (and ids) are those of offering inside the epilogue; then free the slot.
// A block's offers run in two steps: each thread filters its lists' values against their
// thresholds (ListState::thr: most values of a long row cannot enter), the warp queues the lists
// whose value passed (sel_queue), and its lanes take one queued list each for the exact
// insertion (offer). Each thread inserting into its own lists ran the insertion code once per
// list slot whenever any lane's list took a value, at a few lanes each: at MiniMax-M3's 4 lists a
// thread (256 lists of 16 keys) the selectors bound the kernel (IDX-32K-M3-fp8 fused 1.73 ms
// against 1.08 ms for block scores + select_topk; ncu: the consumers waited on the ring's free
// slots 35% of their samples, the selectors ~630 instructions an item at ~7 active lanes).
// 64-key blocks: a slot holds its tile's two blocks, offered in order (sel_hi the second; offer
// skips one past the token's visible blocks). Every selector thread takes part in the ring
// barriers, with or without a list.
// kShard (an ICP rank's lists): the items are shard pages; each is offered as the global block
// it lies in (shard_page_block), only where the rank holds a key of it visible to the token (the
// ring flag's bits, epilogue), and a NaN group score of a block that is not forced is reported
// (icp_nan_score: the merge could not equal block_topk's selection; the reference's rule). A NaN
// always passes the filter, so every one is seen.
template <int kC, int kBlk, bool kShard = false>  // consumer warpgroups (Cfg), keys per block
__device__ void run_selector(const Params& p, SharedStorage& sh, int64_t h, int64_t t0, int64_t t1,
                             int sel) {
  const int n = int(count_items<kBlk, kShard>(p, t0, t1));
  const int lists = int(t1 - t0) << p.list_shift;  // this CTA's lists with a token
  const int stride = p.cta_lists;
  const int lane = sel & 31;
  uint8_t* const queue = sh.sel_queue[sel >> 5];
#pragma unroll 1
  for (int j = 0; j < kListsPerSelector; ++j) {
    const int l = sel + j * kSelectors;
    if (l < lists) init_list<kBlk, kShard>(p, sh.lists[l], t0 + (l >> p.list_shift));
  }
  // The exact insertion of value v of block kb (a kernel block: a shard page for kShard) into l.
  auto insert = [&](int l, int64_t kb, float v) {
    if constexpr (kShard) {
      kb = shard_page_block(p.shard, kb);
      if (v != v && !is_forced(p.rule, kb, sh.lists[l].nvis))
        flag_status(p.status, int32_t(StatusCode::icp_nan_score), t0 + (l >> p.list_shift),
                    (h << p.list_shift) + (l & ((1 << p.list_shift) - 1)), kb);
    }
    offer(sh.lists[l], sh.pick_keys + l, stride, p.rule, kb, v);
  };
  // At most one list a thread (one list a token, G >= 4: 64 or fewer): each thread inserts into
  // its own list, the queue's scan and passes would only add to it (IDX-32K-fp8 fused 11.9 ->
  // 12.5 ms through the queue).
  const bool direct = lists <= kSelectors;
  for (int it = 0; it < n; ++it) {
    const int s = SelRing::stage(it);
    sm90::mbar_wait(&sh.sel_full[s], SelRing::full_parity(it));
    const int64_t kb0 = int64_t(sh.sel[s].kb) * kBlocksPerTile<kBlk>;
#pragma unroll 1
    for (int u = 0; u < kBlocksPerTile<kBlk>; ++u) {
      const float* const vals = u == 0 ? sh.sel[s].val : sh.sel_hi[s];
      auto passes = [&](int l) {  // the filter: the block is offered to l and its value may enter
        const int ok = sh.sel[s].ok[l];
        const bool offered = kShard ? ((ok >> u) & 1) != 0 : ok != 0;
        return offered && !(vals[l] <= sh.lists[l].thr);
      };
      if (direct) {
        if (sel < lists && passes(sel)) insert(sel, kb0 + u, vals[sel]);
        continue;
      }
      // Queue this thread's passing lists (bit j: list sel + 64 j), the warp's in lane order.
      uint32_t mine = 0;
#pragma unroll
      for (int j = 0; j < kListsPerSelector; ++j) {
        const int l = sel + j * kSelectors;
        if (l >= lists) break;
        if (passes(l)) mine |= 1u << j;
      }
      const int c = __popc(mine);
      int incl = c;
#pragma unroll
      for (int d = 1; d < 32; d *= 2) {
        const int o = __shfl_up_sync(0xffffffffu, incl, d);
        if (lane >= d) incl += o;
      }
      const int total = __shfl_sync(0xffffffffu, incl, 31);
      int pos = incl - c;
      for (uint32_t m = mine; m != 0; m &= m - 1) queue[pos++] = uint8_t(sel + (__ffs(m) - 1) * kSelectors);
      __syncwarp();
      // Insert: one queued list a lane (a list is queued at most once a block).
      for (int q = lane; q < total; q += 32) {
        const int l = queue[q];
        insert(l, kb0 + u, vals[l]);
      }
      __syncwarp();  // the queue and the lists' states, before the next block's filter
    }
    sm90::mbar_arrive(&sh.sel_empty[s]);
  }
  sm90::named_arrive(uint32_t(NamedBarrier::kSelectorsDone), kC * 128 + kSelectors);
}

template <Elem kElem, int kBlk, int kRowGroups, bool kWide, bool kShard, int kD>
__device__ void run_consumer(const Params& p, SharedStorage& sh, int64_t h, int64_t t0, int64_t t1,
                             int consumer, int tid, int active) {
  const int warp = tid >> 5, lane = tid & 31;
  constexpr int kC = Cfg<kWide>::kConsumers;
  sm90::mbar_wait(&sh.q_full, 0);
  // Row groups per consumer: with 2 consumers, 2 for R = 4, 1 for R = 2, 1 / 0 for R = 1; with
  // 4, 1 for consumers below the row groups that hold a token (`active`: R but for a CTA of
  // fewer tokens, kernel.cuh), else 0 (compile time, but for the consumer index); the fused and
  // unfused loops are separate code (the unfused loop then carries no selector-ring branches).
  auto consume = [&](auto fused_tag) {
    constexpr bool kF = decltype(fused_tag)::value;
    if constexpr (kWide) {
      if (consumer < active) consume_blocks<kElem, kBlk, 1, kF, kShard, kD>(p, sh, h, t0, t1, consumer, warp, lane);
      else consume_blocks<kElem, kBlk, 0, kF, kShard, kD>(p, sh, h, t0, t1, consumer, warp, lane);
    } else if constexpr (kRowGroups == 4) consume_blocks<kElem, kBlk, 2, kF, kShard, kD>(p, sh, h, t0, t1, consumer, warp, lane);
    else if constexpr (kRowGroups == 2) consume_blocks<kElem, kBlk, 1, kF, kShard, kD>(p, sh, h, t0, t1, consumer, warp, lane);
    else if (consumer == 0) consume_blocks<kElem, kBlk, 1, kF, kShard, kD>(p, sh, h, t0, t1, consumer, warp, lane);
    else consume_blocks<kElem, kBlk, 0, kF, kShard, kD>(p, sh, h, t0, t1, consumer, warp, lane);
  };
  // Wide kernels run fused, narrow ones unfused (launch.cu): each loop exists only where it runs.
  if constexpr (kWide) consume(std::true_type{});
  else consume(std::false_type{});
  if constexpr (!kWide) return;  // the producer warpgroup's warps 1-3 write the -inf tail (fill_tail)
  // The selectors are done.
  sm90::named_sync(uint32_t(NamedBarrier::kSelectorsDone), kC * 128 + kSelectors);
  // One q2k row a list (a shard: one row of the rank's lists, ids and scores best first): list l
  // is token t0 + (l >> list_shift)'s, selection head h 2^list_shift + (l & (2^list_shift - 1)).
  const int cw = consumer * 4 + warp;  // 0 .. 4 kC - 1 over the consumers
  const int lists = int(t1 - t0) << p.list_shift;
  const int lmask = (1 << p.list_shift) - 1;
  for (int l = cw; l < lists; l += kC * 4) {
    const int64_t t = t0 + (l >> p.list_shift);
    const int64_t hs = (h << p.list_shift) + (l & lmask);
    const ListState& ls = sh.lists[l];
    const int64_t row = (hs * p.total_q + t) * p.rule.topk;
    if constexpr (kShard)
      write_ranked_row(p.q2k + row, p.list_scores + row, sh.pick_keys + l, ls.count, p.rule.topk,
                       lane, p.cta_lists);
    else
      write_q2k_row(p.q2k + row, sh.pick_keys + l, ls.count, ls.nvis, p.rule, lane, p.cta_lists);
  }
}

}  // namespace msa::cuda::indexer_sm90
