// The combine inside the KV-major kernel (traits.h MergeArea; 16-bit q at D = 128 over 128-key
// blocks, bf16 partials, top-K <= kMergeMaxTopk, no temperature LSE). A fourth warpgroup:
// - warp 12 + c, the store warp of consumer c: issues the TMA stores of each tile the consumer
//   staged (the consumer no longer issues or waits for them), frees the Q buffer once they have
//   read it, and once they have completed counts one arrival for each of the tile's tokens in
//   MainParams::merge_count; the arrival that leaves a (token, kv head) at 0 pushes it on this
//   CTA's merge queue;
// - warps 14-15 merge the queued pairs: lane 0 of warp 14 streams each pair's LSE / 1 / sum rows
//   (a header item) and its slots' partial rows (a piece a slot) by bulk copies into a ring of
//   kMergeRing stages, and the 64 threads fold them in slot order with the combine's arithmetic
//   (common/combine.cu combine_unit), so out and lse are bit for bit the combine kernel's.
// The partials are read while the kernel still computes, instead of by a kernel after it.
#pragma once

#include <cuda_bf16.h>

#include "cuda/sm90/sparse_fwd/kernel.cuh"

namespace msa::cuda::sparse_fwd {

constexpr uint32_t kMergeBarrier = uint32_t(NamedBarrier::kMerge);

// Pushes a pair (h * total_q + t) and its slot mask on the CTA's merge queue; waits while the
// queue is full.
__device__ __forceinline__ void merge_push(MergeArea& ma, int32_t pair, uint32_t mask) {
  const int32_t at = atomicAdd(&ma.q_tail, 1);
  while (at - atomicAdd(&ma.q_head, 0) >= kMergeQueue) __nanosleep(128);
  __threadfence_block();
  atomicExch(&ma.queue[at % kMergeQueue],
             (static_cast<unsigned long long>(mask) << 32) | uint32_t(pair + 1));
}

// An arrival's result: the count word before it (merge_count); the pair whose last partial it was
// is pushed, with its slot mask.
__device__ __forceinline__ void merge_settle(MergeArea& ma, int32_t idx, uint32_t old) {
  if ((old & 0xffffu) != 1u) return;
  __threadfence();  // every other arrival's rows before the merge reads them
  merge_push(ma, idx, old >> 16);
}

// The store warp of consumer c: tiles in the consumer's order (its uses of buffers 0, 1, 0, ...).
// The metadata and tile_head come from the producer (q_full), the staged rows from the consumer
// (staged); both are released on q_empty, which counts this warp's 32 arrivals. A tile's arrivals
// are counted once the next tile's stores are issued (its own have completed by then), and their
// results read a tile later still, so the atomics' latency is not in the warp's per-tile chain.
template <int kBlk, int kD>
__device__ __forceinline__ void run_store_warp(const MainParams& p, KVMajorStorage<kBlk, kD>& sh,
                                               MergeArea& ma, int c, int lane) {
  const int tpt = p.tokens_per_tile;
  int32_t prev = -1;     // this lane's token of the previous tile (h * total_q + t), -1: none
  int32_t counted = -1;  // the token whose arrival `old` answers, -1: none
  uint32_t old = 0;
  for (uint32_t use = 0;; ++use) {
    const int stage = int(use % kQStages);
    const uint32_t parity = (use / kQStages) & 1u;
    sm90::mbar_wait(&ma.staged[c][stage], parity);
    const bool done = ma.cons_done[c][stage] != 0;
    int32_t cur = -1;
    if (!done) {
      sm90::mbar_wait(&sh.q_full[c][stage], parity);
      if (lane < tpt) {
        const TileMeta& meta = sh.meta[c][stage];
        const int32_t t = meta.token[lane], sl = meta.slot[lane];
        if (t >= 0) {
          cur = ma.tile_head[c][stage] * int32_t(p.total_q) + t;
          const int32_t entry = cur * p.topk + sl;
          const uint8_t* buf = sh.q[c][stage][0];
          const int row = lane * p.group;  // the token's first row in the tile
#pragma unroll
          for (int half = 0; half < kD / kHalfCols; ++half)
            sm90::tma_store_3d(&p.tm_part, buf + half * kQHalfBytes + row * 128,
                               half * kHalfCols, 0, entry);
        }
      }
      sm90::bulk_commit();
      sm90::bulk_wait_read<0>();
      sm90::mbar_arrive(&sh.q_empty[c][stage]);
    }
    if (counted >= 0) merge_settle(ma, counted, old);
    __syncwarp();  // a lane waiting in merge_push for queue space, before the others spin on staged
    counted = -1;
    if (done) sm90::bulk_wait<0>();
    else sm90::bulk_wait<1>();  // the previous tile's stores have completed
    if (prev >= 0) {
      sm90::fence_proxy_async_global();
      __threadfence();  // its partial rows, and the consumers' LSE rows (stored before `staged`)
      old = atomicSub(p.merge_count + prev, 1u);
      counted = prev;
    }
    prev = cur;
    if (done) break;
  }
  if (counted >= 0) merge_settle(ma, counted, old);
  __syncwarp();
  if (lane == 0) {
    __threadfence_block();
    atomicAdd(&ma.stores_done, 1);
  }
}

// The next queued pair, or 0 (the leader's; head advances past it).
__device__ __forceinline__ unsigned long long merge_pop(MergeArea& ma, int32_t& head) {
  const unsigned long long e = atomicExch(&ma.queue[head % kMergeQueue], 0ull);
  if (e == 0) return 0;
  ++head;
  __threadfence_block();  // the slot's clearing before the head that lets a push reuse it
  atomicExch(&ma.q_head, head);
  __threadfence_block();
  return e;
}

// Warps 14-15 (tid 0-63): thread tid folds rows tid / 16 + 4 k (k < 4, rows < G) at columns
// 8 (tid % 16) .. + 8.
__device__ __forceinline__ void run_merge(const MainParams& p, MergeArea& ma, int tid) {
  const int G = p.group;
  const uint32_t piece_bytes = uint32_t(G) * kHeadDim * 2;
  const uint32_t hdr_bytes = uint32_t(p.topk * G) * 4;
  const bool leader = tid == 0;
  uint32_t issued = 0, consumed = 0;  // items issued (leader) and folded
  uint32_t cur_mask = 0;              // leader: the slots of cur_pair not yet issued
  int32_t cur_pair = 0, head = 0;
  const int r0 = tid >> 4, d0 = (tid & 15) * 8;
  float m[4], sum[4], acc[4][8];
  while (true) {
    // Warp 14 converges around lane 0's issuing: its other lanes wait at __syncwarp, not on a
    // ring barrier. Spinning there (try_wait) on an item only lane 0 can issue held the warp's
    // other path, lane 0's, until the wait timed out: every pair took that timeout (P8K-tok
    // 1.65 -> 68.4 ms on the H100).
    if (tid < 32) {
      if (leader) {
        while (issued - consumed < uint32_t(kMergeRing)) {
          const int st = int(issued % kMergeRing);
          uint64_t* bar = &ma.full[st];
          if (cur_mask == 0) {
            const unsigned long long e = merge_pop(ma, head);
            if (e == 0) {
              if (issued != consumed) break;  // fold what is in flight
              if (atomicAdd(&ma.stores_done, 0) == kConsumers) {
                __threadfence_block();
                if (atomicAdd(&ma.q_tail, 0) == head) {  // every push has been taken
                  ma.item[st] = MergeItem{kMergeEnd, 0, 0, 0u};
                  sm90::mbar_arrive(bar);
                  ++issued;
                  break;
                }
              }
              __nanosleep(256);
              continue;
            }
            cur_pair = int32_t(uint32_t(e)) - 1;
            cur_mask = uint32_t(e >> 32);
            ma.item[st] = MergeItem{kMergeHeader, cur_pair, -1, cur_mask};
            sm90::fence_proxy_async_global();
            sm90::fence_proxy_async_smem();
            sm90::mbar_arrive_expect_tx(bar, 2 * hdr_bytes);
            const int64_t row = int64_t(cur_pair) * p.topk * G;
            sm90::bulk_load(sm90::smem_addr(ma.ring[st]), p.part_lse + row, hdr_bytes,
                            sm90::smem_addr(bar));
            sm90::bulk_load(sm90::smem_addr(ma.ring[st]) + kMergeHeaderRl, p.part_rl + row,
                            hdr_bytes, sm90::smem_addr(bar));
          } else {
            const int s = __ffs(cur_mask) - 1;
            cur_mask &= cur_mask - 1;
            ma.item[st] = MergeItem{kMergePiece, cur_pair, s, cur_mask == 0 ? 1u : 0u};
            sm90::fence_proxy_async_smem();
            sm90::mbar_arrive_expect_tx(bar, piece_bytes);
            const auto* src = static_cast<const __nv_bfloat16*>(p.part_o) +
                              (int64_t(cur_pair) * p.topk + s) * G * kHeadDim;
            sm90::bulk_load(sm90::smem_addr(ma.ring[st]), src, piece_bytes, sm90::smem_addr(bar));
          }
          ++issued;
        }
      }
      __syncwarp();
    }
    const int st = int(consumed % kMergeRing);
    sm90::mbar_wait(&ma.full[st], (consumed / kMergeRing) & 1u);
    const MergeItem it = ma.item[st];
    if (it.kind == kMergeEnd) break;
    if (it.kind == kMergeHeader) {
      const auto* lse_src = reinterpret_cast<const float*>(ma.ring[st]);
      const auto* rl_src = reinterpret_cast<const float*>(ma.ring[st] + kMergeHeaderRl);
      for (int i = tid; i < p.topk * G; i += kMergeThreads) {
        ma.lse[i] = lse_src[i];
        ma.rl[i] = rl_src[i];
      }
      sm90::named_sync(kMergeBarrier, kMergeThreads);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int g = r0 + 4 * k;
        m[k] = -INFINITY;
        sum[k] = 0.f;
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[k][i] = 0.f;
        if (g < G)
          for (uint32_t b = it.mask; b != 0; b &= b - 1)
            m[k] = fmaxf(m[k], ma.lse[(__ffs(b) - 1) * G + g]);
      }
    } else {
      const int s = it.slot;
      const uint32_t base = sm90::smem_addr(ma.ring[st]) + uint32_t(d0) * 2;
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int g = r0 + 4 * k;
        // exp(-inf - m) = 0 for a slot whose block held no visible key; a row whose every slot
        // is so (m = -inf) folds nothing, as in the combine.
        if (g >= G || m[k] == -INFINITY) continue;
        // sum rounded as the combine's separate add (its w comes through a shuffle, which no
        // FMA can span): expf ends in a multiply, which a contracted add would fuse.
        const float w = expf(ma.lse[s * G + g] - m[k]);
        const float wo = w * ma.rl[s * G + g];
        sum[k] = __fadd_rn(sum[k], w);
        const uint4 raw = sm90::ld_shared_u32x4(base + uint32_t(g) * kHeadDim * 2);
        const auto* h2 = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float2 f = __bfloat1622float2(h2[i]);
          acc[k][2 * i] = fmaf(wo, f.x, acc[k][2 * i]);
          acc[k][2 * i + 1] = fmaf(wo, f.y, acc[k][2 * i + 1]);
        }
      }
      if (it.mask != 0) {  // the pair's last slot: its rows of out and lse
        const int64_t t = it.pair % p.total_q, h = it.pair / p.total_q;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const int g = r0 + 4 * k;
          if (g >= G) continue;
          const float inv = sum[k] > 0.f ? 1.f / sum[k] : 0.f;
          const int64_t hq = h * G + g;
          uint4 packed;
          auto* pk = reinterpret_cast<uint32_t*>(&packed);
#pragma unroll
          for (int i = 0; i < 4; ++i)
            pk[i] = pack_pair<false>(acc[k][2 * i] * inv, acc[k][2 * i + 1] * inv);
          *reinterpret_cast<uint4*>(static_cast<__nv_bfloat16*>(p.out) + t * p.out_stride_t +
                                    hq * p.out_stride_h + d0) = packed;
          if (d0 == 0 && p.lse)
            p.lse[hq * p.total_q + t] = m[k] == -INFINITY ? m[k] : m[k] + logf(sum[k]);
        }
      }
    }
    sm90::named_sync(kMergeBarrier, kMergeThreads);  // the stage (and ma.lse) may be refilled
    ++consumed;
  }
}

// The merging KV-major kernel (bf16 q, D = 128, 128-key blocks): the KV-major warpgroups as in
// sparse_fwd_kernel, whose consumers hand each staged tile to the fourth warpgroup.
template <bool kMask>
__global__ void __launch_bounds__(512, 1)
    sparse_fwd_merge_kernel(const __grid_constant__ CUtensorMap tm_q,
                            const __grid_constant__ CUtensorMap tm_k,
                            const __grid_constant__ CUtensorMap tm_v,
                            const __grid_constant__ MainParams p) {
  constexpr int kBlk = kBlockN, kD = kHeadDim;
  using Storage = KVMajorStorage<kBlk, kD>;
  extern __shared__ uint8_t smem_raw[];
  // q_empty: the consumer's 128 threads and the store warp's 32.
  Storage& sh = init_shared<Storage>(smem_raw, p.group, p.tokens_per_tile, 128 + 32, false, &tm_q,
                                     &tm_k, &tm_v);
  MergeArea& ma = *reinterpret_cast<MergeArea*>(reinterpret_cast<uint8_t*>(&sh) + sizeof(Storage));
  for (int i = threadIdx.x; i < kMergeQueue; i += blockDim.x) ma.queue[i] = 0;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kMergeRing; ++s) sm90::mbar_init(&ma.full[s], 1);
    for (int c = 0; c < kConsumers; ++c) {
      for (int s = 0; s < kQStages; ++s) {
        sm90::mbar_init(&ma.staged[c][s], 128);
        ma.cons_done[c][s] = 0;
      }
    }
    ma.q_head = ma.q_tail = ma.stores_done = 0;
    sm90::fence_barrier_init();
    sm90::prefetch_tensor_map(&p.tm_part);
  }
  __syncthreads();
  pdl_wait();     // the prep kernels' tables (pdl.cuh)
  pdl_trigger();  // the uniform kernel may take each SM this kernel leaves
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, wg = warp / 4;
  if (wg == 0) {
    sm90::regs_dealloc<kMergeProducerRegs>();
    run_producer_pairs<false, kBlk, kD, true>(p, &tm_q, &tm_k, &tm_v, sh, warp, lane,
                                              &ma.tile_head[0][0]);
  } else if (wg <= kConsumers) {
    sm90::regs_alloc<kMergeConsumerRegs>();
    run_consumer<false, false, kMask, kBlk, kD, true>(p, sh, wg - 1, threadIdx.x - 128 * wg, &ma);
  } else {
    sm90::regs_dealloc<kMergeEpilogueRegs>();
    if (warp < 14) run_store_warp<kBlk, kD>(p, sh, ma, warp - 12, lane);
    else run_merge(p, ma, threadIdx.x - 448);
  }
}

}  // namespace msa::cuda::sparse_fwd
