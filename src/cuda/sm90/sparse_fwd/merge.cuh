// The combine inside the KV-major kernel (traits.h MergeArea; 16-bit q at D = 128 over 128-key
// blocks, bf16 partials, top-K <= kMergeMaxTopk, no temperature LSE). A fourth warpgroup:
// - warp 12 + c, the store warp of consumer c: issues the TMA stores of each tile the consumer
//   staged (the consumer no longer issues or waits for them), frees the Q buffer once they have
//   read it, and once they have completed counts one arrival for each of the tile's tokens in
//   MainParams::merge_count, kMergeBatch tiles at a time; the arrival that leaves a (token, kv
//   head) at 0 publishes it on the call's merge list;
// - warps 14-15 of every CTA take pairs from that list and fold their partials with the combine's
//   arithmetic in its slot order (common/combine.cu combine_unit), so out and lse are bit for bit
//   the combine kernel's. Each thread reads the rows it folds by cp.async, kMergeDepth slots ahead.
// The partials are read while the kernel still computes, instead of by a kernel after it.
#pragma once

#include <cuda_bf16.h>

#include "cuda/sm90/sparse_fwd/kernel.cuh"

namespace msa::cuda::sparse_fwd {

constexpr uint32_t kMergeBarrier = uint32_t(NamedBarrier::kMerge);

// Arrivals are counted kMergeBatch tiles at a time behind one release fence: a fence after every
// tile's stores cost a store warp ~4.5 us a tile on an H100 (P8K-tok), more than its consumer
// takes for a tile (~2.4 us). (bulk_wait_read and bulk_wait compile to the same scoreboard wait,
// so the lag may hide only the atomics' latency, not the stores' completion.)
constexpr int kMergeBatch = 4;

// Release and acquire at GPU scope (__threadfence() is fence.sc.gpu, more than either side of the
// counts' hand-off needs).
__device__ __forceinline__ void fence_acq_rel_gpu() {
  asm volatile("fence.acq_rel.gpu;" ::: "memory");
}
// Polls read relaxed and acquire with one fence once they see what they wait for: ld.acquire
// compiles to a load and an invalidation of the SM's L1 (CCTL.IVALL), which the producer's and
// consumers' metadata reads would pay for at every poll.
__device__ __forceinline__ unsigned long long ld_relaxed_gpu(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ uint32_t ld_relaxed_gpu(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// An arrival's result: the count word before it (merge_count). The arrival that was the pair's
// last publishes it and its slot mask on the merge list (past merge_list_cap, which only invalid
// selections reach, it is dropped: the status reports them).
__device__ __forceinline__ void merge_settle(const MainParams& p, int32_t idx, uint32_t old) {
  if ((old & 0xffffu) != 1u) return;
  fence_acq_rel_gpu();  // the other arrivals' rows (acquired) before the entry (released)
  const uint32_t at = atomicAdd(p.merge_ctr + 1, 1u);
  if (at >= p.merge_list_cap) return;
  atomicExch(p.merge_list + at,
             (static_cast<unsigned long long>(old >> 16) << 32) | uint32_t(idx + 1));
}

// Counts one arrival of each token in toks (this lane's, -1: none) after one release of their
// rows; the results come back in old, to settle a batch later.
__device__ __forceinline__ void merge_arrive(const MainParams& p, const int32_t (&toks)[kMergeBatch],
                                             uint32_t (&old)[kMergeBatch]) {
  bool any = false;
#pragma unroll
  for (int i = 0; i < kMergeBatch; ++i) any |= toks[i] >= 0;
  if (!any) return;
  sm90::fence_proxy_async_global();
  fence_acq_rel_gpu();  // their partial rows, and the consumers' LSE rows (stored before `staged`)
#pragma unroll
  for (int i = 0; i < kMergeBatch; ++i)
    if (toks[i] >= 0) old[i] = atomicSub(p.merge_count + toks[i], 1u);
}

// The store warp of consumer c: tiles in the consumer's order (its uses of buffers 0, 1, 0, ...).
// The metadata and tile_head come from the producer (q_full), the staged rows from the consumer
// (staged); both are released on q_empty, which counts this warp's 32 arrivals. Every kMergeBatch
// uses, the arrivals of the batch before the last are counted (their stores have completed by
// then: at most the last batch's groups are pending), and the results of the previous count are
// settled, so neither a store's completion nor an atomic's latency is in the per-tile chain.
template <int kBlk, int kD>
__device__ __forceinline__ void run_store_warp(const MainParams& p, KVMajorStorage<kBlk, kD>& sh,
                                               MergeArea& ma, int c, int lane) {
  const int tpt = p.tokens_per_tile;
  // lag[i]: this lane's token (h * total_q + t) of the tile i uses back, -1: none or counted.
  int32_t lag[2 * kMergeBatch];
  int32_t sent[kMergeBatch];  // the tokens of the last count, whose results are in old
  uint32_t old[kMergeBatch];
#pragma unroll
  for (int i = 0; i < 2 * kMergeBatch; ++i) lag[i] = -1;
#pragma unroll
  for (int i = 0; i < kMergeBatch; ++i) {
    sent[i] = -1;
    old[i] = 0;
  }
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
      sm90::bulk_commit();  // one group a use, by every lane
      sm90::bulk_wait_read<0>();
      sm90::mbar_arrive(&sh.q_empty[c][stage]);
    }
#pragma unroll
    for (int i = 2 * kMergeBatch - 1; i > 0; --i) lag[i] = lag[i - 1];
    lag[0] = cur;
    if (!done && use % kMergeBatch != kMergeBatch - 1) continue;
#pragma unroll
    for (int i = 0; i < kMergeBatch; ++i) {
      if (sent[i] >= 0) merge_settle(p, sent[i], old[i]);
      sent[i] = -1;
    }
    if (done) {  // every tile not yet counted, now that all stores have completed
      sm90::bulk_wait<0>();
#pragma unroll
      for (int b = 0; b < 2; ++b) {
#pragma unroll
        for (int i = 0; i < kMergeBatch; ++i) sent[i] = lag[b * kMergeBatch + i];
        merge_arrive(p, sent, old);
#pragma unroll
        for (int i = 0; i < kMergeBatch; ++i) {
          if (sent[i] >= 0) merge_settle(p, sent[i], old[i]);
        }
      }
      break;
    }
    // The uses before the last kMergeBatch have completed their stores.
    sm90::bulk_wait<kMergeBatch>();
#pragma unroll
    for (int i = 0; i < kMergeBatch; ++i) {
      sent[i] = lag[kMergeBatch + i];
      lag[kMergeBatch + i] = -1;
    }
    merge_arrive(p, sent, old);
  }
  __syncwarp();
  if (lane == 0) {
    __threadfence();  // this warp's list entries before its count
    atomicAdd(p.merge_ctr + 2, 1u);
  }
}

// The leader's pairs: it claims the list's next index (one atomicAdd; taking entries by
// compare-and-swap on a shared cursor, 132 leaders retrying, held P8K-tok at 11.8 ms on an H100)
// while the pair before it is folded, then waits for the index's entry, or returns 0 once every
// store warp of the grid is done and the index is past the last entry. A leader waits for other
// CTAs' entries, which the cooperative launch makes safe (every CTA is resident, and no CTA's
// store warps wait for a merge).
__device__ __forceinline__ uint32_t merge_claim(const MainParams& p) {
  return atomicAdd(p.merge_ctr, 1u);
}
__device__ __forceinline__ unsigned long long merge_wait(const MainParams& p, uint32_t h) {
  const uint32_t stores = uint32_t(kConsumers) * gridDim.x;  // store warps of the grid
  while (true) {
    if (h < p.merge_list_cap) {
      const unsigned long long e = ld_relaxed_gpu(p.merge_list + h);
      if (e != 0) {
        fence_acq_rel_gpu();  // the entry's publication acquired: the pair's rows are visible
        return e;
      }
    }
    if (ld_relaxed_gpu(p.merge_ctr + 2) == stores) {
      fence_acq_rel_gpu();  // every store warp's entries, and the final tail
      const uint32_t tail = ld_relaxed_gpu(p.merge_ctr + 1);
      if (h >= min(tail, p.merge_list_cap)) return 0;
      continue;  // its entry is written
    }
    __nanosleep(64);
  }
}

// Warps 14-15 (tid 0-63): thread tid folds rows tid / 16 + 4 k (k < 4, rows < G) at columns
// 8 (tid % 16) .. + 8; lane j = tid % 16 of a row's segment holds slot j's LSE, weight and
// 1 / sum, which it broadcasts when the fold reaches slot j, as the combine does.
__device__ __forceinline__ void run_merge(const MainParams& p, MergeArea& ma, int tid) {
  const int G = p.group, topk = p.topk;
  const int r0 = tid >> 4, j = tid & 15, d0 = j * 8;
  const uint32_t ring = sm90::smem_addr(&ma.ring[0][0][tid]);
  constexpr uint32_t kRowStep = kMergeThreads * 16, kStageStep = 4 * kRowStep;
  const auto* part_o = static_cast<const __nv_bfloat16*>(p.part_o);
  if (tid == 0) ma.cur[0] = merge_wait(p, merge_claim(p));
  sm90::named_sync(kMergeBarrier, kMergeThreads);
  for (uint32_t it = 0;; ++it) {
    const unsigned long long e = ma.cur[it & 1u];
    if (e == 0) break;
    const int32_t pair = int32_t(uint32_t(e)) - 1;
    const uint32_t mask = uint32_t(e >> 32);
    const int64_t base = int64_t(pair) * topk;  // the pair's slot 0 entry
    // This thread's rows of the next slot of `rest` into ring stage d, one cp.async group a call
    // (empty once no slot is left).
    uint32_t rest = mask;
    auto issue = [&](int d) {
      if (rest != 0) {
        const int s = __ffs(rest) - 1;
        rest &= rest - 1;
        const __nv_bfloat16* src = part_o + ((base + s) * G + r0) * kHeadDim + d0;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          if (r0 + 4 * k < G)
            sm90::cp_async_16(ring + d * kStageStep + k * kRowStep, src + 4 * k * kHeadDim, 16);
        }
      }
      sm90::cp_async_commit();
    };
#pragma unroll
    for (int d = 0; d < kMergeDepth; ++d) issue(d);
    const bool mine = j < topk && ((mask >> j) & 1u) != 0;
    float lse_j[4], rl_j[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int g = r0 + 4 * k;
      lse_j[k] = -INFINITY;
      rl_j[k] = 0.f;
      if (mine && g < G) {
        lse_j[k] = __ldcg(p.part_lse + (base + j) * G + g);
        rl_j[k] = __ldcg(p.part_rl + (base + j) * G + g);
      }
    }
    const uint32_t next = tid == 0 ? merge_claim(p) : 0u;  // the next pair's index
    float m[4], w_j[4], wo_j[4], sum[4], acc[4][8];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      m[k] = lse_j[k];
#pragma unroll
      for (int off = 8; off > 0; off >>= 1)
        m[k] = fmaxf(m[k], __shfl_xor_sync(0xffffffffu, m[k], off, 16));
      // exp(-inf - m) = 0 for a slot whose block held no visible key; a row whose every slot is
      // so (m = -inf) folds nothing, as in the combine.
      w_j[k] = m[k] == -INFINITY ? 0.f : expf(lse_j[k] - m[k]);
      wo_j[k] = w_j[k] * rl_j[k];
      sum[k] = 0.f;
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[k][i] = 0.f;
    }
    uint32_t todo = mask;
    for (int d = 0; todo != 0; d = d + 1 == kMergeDepth ? 0 : d + 1) {
      const int s = __ffs(todo) - 1;
      todo &= todo - 1;
      sm90::cp_async_wait<kMergeDepth - 1>();  // slot s's group (kMergeDepth - 1 issued since)
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int g = r0 + 4 * k;
        const float w = __shfl_sync(0xffffffffu, w_j[k], s, 16);
        const float wo = __shfl_sync(0xffffffffu, wo_j[k], s, 16);
        if (g >= G || m[k] == -INFINITY) continue;
        // sum rounded as the combine's separate add (its w comes through a shuffle, which no
        // FMA can span).
        sum[k] = __fadd_rn(sum[k], w);
        const uint4 raw = sm90::ld_shared_u32x4(ring + d * kStageStep + k * kRowStep);
        const auto* h2 = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float2 f = __bfloat1622float2(h2[i]);
          acc[k][2 * i] = fmaf(wo, f.x, acc[k][2 * i]);
          acc[k][2 * i + 1] = fmaf(wo, f.y, acc[k][2 * i + 1]);
        }
      }
      issue(d);  // the stage just read: the slot kMergeDepth ahead
    }
    const int64_t t = pair % p.total_q, h = pair / p.total_q;
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
    // The next pair's entry, waited for only now: a wait before the fold held the warp (its other
    // lanes at the first shuffle) until one more pair had been published.
    if (tid == 0) ma.cur[(it + 1) & 1u] = merge_wait(p, next);
    sm90::named_sync(kMergeBarrier, kMergeThreads);  // the next pair's entry in ma.cur
  }
  sm90::cp_async_wait<0>();
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
  if (threadIdx.x == 0) {
    for (int c = 0; c < kConsumers; ++c) {
      for (int s = 0; s < kQStages; ++s) {
        sm90::mbar_init(&ma.staged[c][s], 128);
        ma.cons_done[c][s] = 0;
      }
    }
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
