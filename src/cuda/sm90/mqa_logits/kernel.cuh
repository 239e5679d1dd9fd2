// The sm_90a MQA logits kernel (traits.h): ragged rows over a flat key tensor, or the paged rows
// of seed 001 over a fused page pool. Roles: producer warp (Q once by TMA, one box per token;
// then each 128-key block through a kStages ring: flat keys one box, paged keys one box per pool
// block, and the block's 128 key scales by cp.async), consumer warpgroups (one 64-row group
// each: S = Q K^T by wgmma, relu times the head weights, the sum over each warp's 16 rows by a
// shuffle reduce-scatter, the per-warp sums into shared memory; then, after one consumer
// barrier, the sum over each token's warps times the key scale into logits).
// Barriers: q_full (producer lane 0 + TMA bytes), full[s] (lane 0's arrival with the TMA bytes,
// plus the 32 lanes' cp.async arrivals), empty[s] (every consumer thread after its scale read),
// NamedBarrier::kConsumers once per block (red is double-buffered, so one barrier suffices).
#pragma once

#include <cuda.h>

#include <climits>
#include <cstdint>

#include "cuda/device/pipeline.cuh"
#include "cuda/device/sm90.cuh"
#include "cuda/device/status.cuh"
#include "cuda/device/wgmma_m64n128.cuh"
#include "cuda/sm90/mqa_logits/params.h"
#include "cuda/sm90/mqa_logits/traits.h"

namespace msa::cuda::mqa_logits_sm90 {

using Ring = sm90::Ring<kStages>;

// The CTA's logits rows and columns.
struct CtaWork {
  int64_t row0 = 0;      // first row
  int ntok = 0;          // rows of this CTA
  int b = 0, first = 0;  // paged: the request and the token slot t of row0
  int c0 = 0, c1 = 0;    // columns [c0, c1) this CTA writes
};

template <bool kPaged>
__device__ __forceinline__ CtaWork cta_work(const Params& p) {
  CtaWork w;
  if constexpr (kPaged) {
    const int64_t x = blockIdx.x;
    const int split = int(x % p.splits);
    const int64_t rest = x / p.splits;
    w.b = int(rest / p.groups);
    w.first = int(rest % p.groups) * p.tokens_per_cta;
    w.ntok = min(p.tokens_per_cta, p.next_n - w.first);
    w.row0 = int64_t(w.b) * p.next_n + w.first;
    w.c0 = split * p.cols_per_split;
    w.c1 = min(p.cols, w.c0 + p.cols_per_split);
  } else {
    // Last rows first: under causal ranges they see the most keys.
    const int64_t tile = int64_t(gridDim.x) - 1 - blockIdx.x;
    w.row0 = tile * p.tokens_per_cta;
    w.ntok = int(min(int64_t(p.tokens_per_cta), int64_t(p.rows) - w.row0));
    w.c1 = p.cols;
  }
  return w;
}

// Token i's visible columns [lo, hi), its inputs checked: a bad range or length is reported and
// the row then sees no key.
template <bool kPaged>
__device__ __forceinline__ void token_range(const Params& p, const CtaWork& w, int i, int32_t& lo,
                                            int32_t& hi) {
  lo = hi = 0;
  if constexpr (kPaged) {
    const int32_t len = p.seq_lens[int64_t(w.b) * p.sl_stride];
    if (len < 0 || len > p.cols) {
      flag_status(p.status, int32_t(StatusCode::seq_len_invalid), w.b, len, p.cols);
      return;
    }
    hi = len > 0 ? max(0, len - p.next_n + w.first + i + 1) : 0;
  } else {
    const int64_t r = w.row0 + i;
    const int32_t s = p.ks[r], e = p.ke[r];
    if (s < 0 || s > e || e > p.cols) {
      flag_status(p.status, int32_t(StatusCode::key_range_invalid), r, s, e);
      return;
    }
    lo = s;
    hi = e;
  }
}

// Pool block of paged key column `key` of request b, or -1 when it is not to be read: past the
// CTA's last visible key, past the table (reported once by the producer), or an id outside the
// pool (reported here).
__device__ __forceinline__ int32_t pool_block(const Params& p, int b, int key, int hi_max) {
  const int col = key >> p.block_shift;
  if (key >= hi_max || col >= p.bt_cols) return -1;
  const int32_t id = p.block_tables[int64_t(b) * p.bt_stride + col];
  if (id < 0 || id >= p.num_blocks) {
    flag_status(p.status, int32_t(StatusCode::page_id_out_of_range), b, col, id);
    return -1;
  }
  return id;
}

// Producer warp: Q, then key blocks [kb_lo, kb_hi) with their scales.
template <bool kPaged, int kR>
__device__ void run_producer(const Params& p, const CUtensorMap* tm_q, const CUtensorMap* tm_k,
                             SharedStorage<kR>& sh, const CtaWork& w, int kb_lo, int kb_hi,
                             int hi_max, int lane) {
  if (lane == 0) {
    sm90::mbar_arrive_expect_tx(&sh.q_full, uint32_t(w.ntok * p.hp * kRowBytes));
    for (int i = 0; i < w.ntok; ++i)
      sm90::tma_load_3d(sh.q + i * p.hp * kRowBytes, tm_q, &sh.q_full, 0, 0, int32_t(w.row0 + i));
    if (kPaged && kb_hi > kb_lo) {
      const int needed = (hi_max + p.block_size - 1) >> p.block_shift;
      if (needed > p.bt_cols)
        flag_status(p.status, int32_t(StatusCode::block_table_narrow), w.b, needed, p.bt_cols);
    }
  }
  constexpr int kPerLane = kBlockN / 32;
  for (int it = 0, kb = kb_lo; kb < kb_hi; ++it, ++kb) {
    const int stage = Ring::stage(it);
    if (it >= kStages) sm90::mbar_wait(&sh.empty[stage], Ring::empty_parity(it));
    const int key0 = kb * kBlockN;
    // Scales: 4 keys per lane by cp.async (zeros where no key is read), one arrival per lane.
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int key = key0 + lane + 32 * i;
      const void* src = p.weights;  // any valid address when nothing is copied
      uint32_t bytes = 0;
      if constexpr (kPaged) {
        const int32_t id = key < hi_max && (key >> p.block_shift) < p.bt_cols
                               ? p.block_tables[int64_t(w.b) * p.bt_stride + (key >> p.block_shift)]
                               : -1;
        if (id >= 0 && id < p.num_blocks) {
          src = p.pool + int64_t(id) * p.block_bytes + int64_t(p.block_size) * kRowBytes +
                int64_t(key & (p.block_size - 1)) * 4;
          bytes = 4;
        }
      } else if (p.k_scale != nullptr && key < p.cols) {
        src = p.k_scale + key;
        bytes = 4;
      }
      sm90::cp_async_4(sm90::smem_addr(&sh.scale[stage][lane + 32 * i]), src, bytes);
    }
    sm90::cp_async_mbar_arrive(&sh.full[stage]);
    if (lane == 0) {
      if constexpr (kPaged) {
        // One box per pool block of the 128 keys (block sizes 32, 64, 128).
        const int per = kBlockN >> p.block_shift;
        int32_t ids[kBlockN / 32];
        uint32_t bytes = 0;
        for (int j = 0; j < per; ++j) {
          ids[j] = pool_block(p, w.b, key0 + (j << p.block_shift), hi_max);
          if (ids[j] >= 0) bytes += uint32_t(p.block_size) * kRowBytes;
        }
        sm90::mbar_arrive_expect_tx(&sh.full[stage], bytes);
        for (int j = 0; j < per; ++j)
          if (ids[j] >= 0)
            sm90::tma_load_3d(sh.k[stage] + (j << p.block_shift) * kRowBytes, tm_k, &sh.full[stage],
                              0, 0, ids[j]);
      } else {
        sm90::mbar_arrive_expect_tx(&sh.full[stage], uint32_t(kKBlockBytes));
        sm90::tma_load_3d(sh.k[stage], tm_k, &sh.full[stage], 0, 0, key0);
      }
    }
  }
}

// relu that keeps NaN (a NaN input gives a NaN logit, as the reference).
__device__ __forceinline__ float relu_nan(float x) { return x < 0.f ? 0.f : x; }

// Sums v[0..31] of this lane over the 8 lanes that share lane % 4 (its warp's 16 rows) by a
// reduce-scatter: afterwards v[m], m < 4, is the total of original index 16 b4 + 8 b3 + 4 b2 + m
// (b2..b4: bits 2..4 of the lane).
__device__ __forceinline__ void reduce_scatter_rows(float (&v)[32], int lane) {
#pragma unroll
  for (int step = 0; step < 3; ++step) {
    const int half = 16 >> step;  // values kept after this step
    const int mask = 16 >> step;  // lane bit 4, 3, 2
    const bool upper = (lane & mask) != 0;
#pragma unroll
    for (int k = 0; k < 16; ++k) {
      if (k >= half) break;
      const float send = upper ? v[k] : v[k + half];
      const float keep = upper ? v[k + half] : v[k];
      v[k] = keep + __shfl_xor_sync(0xffffffffu, send, mask);
    }
  }
}

// Consumer warpgroup `rg` (row group): every key block's per-warp sums, then this thread's share
// of the logits.
template <bool kPaged, int kR>
__device__ void run_consumer(const Params& p, SharedStorage<kR>& sh, const CtaWork& w, int kb_lo,
                             int kb_hi, int rg, int tid) {
  const int warp = (tid >> 5) & 3, lane = tid & 31;
  const int gw = rg * 4 + warp;  // consumer warp: rows [16 gw, 16 gw + 16)
  // This thread's two rows (accumulator rows g and g + 8 of the warp) and their weights.
  float wt[2];
  bool live[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = gw * 16 + (lane >> 2) + 8 * i;
    const int tok = r / p.hp, h = r - tok * p.hp;
    live[i] = tok < w.ntok && h < p.heads;
    wt[i] = live[i] ? p.weights[(w.row0 + tok) * p.w_stride + h] : 0.f;
  }
  const uint64_t q_desc = sm90::tile_desc(sh.q + rg * kTileM * kRowBytes);
  const uint64_t k_desc0 = sm90::tile_desc(sh.k[0]);
  const bool unit_scale = !kPaged && p.k_scale == nullptr;
  const float neg_inf = -INFINITY;
  sm90::mbar_wait(&sh.q_full, 0);
  sm90::RingState<kStages> ring;
  for (int kb = kb_lo, it = 0; kb < kb_hi; ++kb, ++it) {
    sm90::mbar_wait(&sh.full[ring.stage], ring.phase);
    float acc[64];
    sm90::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 32; ++kk)
      sm90::wgmma_ss_e4m3(acc, sm90::desc_offset(q_desc, kk * 32),
                          sm90::desc_offset(k_desc0, uint32_t(ring.stage) * kKBlockBytes + kk * 32),
                          kk > 0 ? 1u : 0u);
    sm90::wgmma_commit();
    sm90::wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < 64; ++i) sm90::reg_fence(acc[i]);
    // Column 8 j + 2 (lane % 4) + e of rows g (acc[4 j + e]) and g + 8 (acc[4 j + 2 + e]).
    float v[32];
#pragma unroll
    for (int j = 0; j < 16; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e)
        v[2 * j + e] = (live[0] ? wt[0] * relu_nan(acc[4 * j + e]) : 0.f) +
                       (live[1] ? wt[1] * relu_nan(acc[4 * j + 2 + e]) : 0.f);
    reduce_scatter_rows(v, lane);
    float* red = sh.red[it & 1][gw];
    const int jb = 8 * ((lane >> 4) & 1) + 4 * ((lane >> 3) & 1) + 2 * ((lane >> 2) & 1);
#pragma unroll
    for (int m = 0; m < 4; m += 2)
      *reinterpret_cast<float2*>(red + 8 * (jb + (m >> 1)) + 2 * (lane & 3)) = make_float2(v[m], v[m + 1]);
    sm90::named_sync(uint32_t(NamedBarrier::kConsumers), Cfg<kR>::kConsumerThreads);
    // Each (token, key) of the block: the sum over the token's warps, times the key's scale.
    const int warps_per_tok = p.hp >> 4;
    for (int idx = tid; idx < w.ntok * kBlockN; idx += Cfg<kR>::kConsumerThreads) {
      const int i = idx / kBlockN, j = idx % kBlockN;
      const int col = kb * kBlockN + j;
      if (col < w.c0 || col >= w.c1) continue;
      float* out = p.logits + (w.row0 + i) * p.out_stride + col;
      if (col >= sh.lo[i] && col < sh.hi[i]) {
        float s = 0.f;
        for (int x = 0; x < warps_per_tok; ++x) s += sh.red[it & 1][i * warps_per_tok + x][j];
        *out = s * (unit_scale ? 1.f : sh.scale[ring.stage][j]);
      } else if (p.clean) {
        *out = neg_inf;
      }
    }
    sm90::mbar_arrive(&sh.empty[ring.stage]);
    ring.advance();
  }
  // Columns of [c0, c1) outside the computed blocks.
  if (p.clean) {
    const int lo_col = kb_lo * kBlockN, hi_col = kb_hi * kBlockN;
    const int width = w.c1 - w.c0;
    for (int64_t idx = tid; idx < int64_t(w.ntok) * width; idx += Cfg<kR>::kConsumerThreads) {
      const int i = int(idx / width), col = w.c0 + int(idx % width);
      if (col >= lo_col && col < hi_col) continue;
      p.logits[(w.row0 + i) * p.out_stride + col] = neg_inf;
    }
  }
}

// tm_q: q as [rows, H, 128] e4m3, boxes of 128 x hp x 1. tm_k: ragged, k as [S, 1, 128], boxes of
// 128 keys; paged, the pool's values as [num_blocks, block_size, 128] (block stride block_bytes),
// boxes of one pool block.
template <bool kPaged, int kR>
__global__ void __launch_bounds__(Cfg<kR>::kThreads, 1)
    mqa_logits_kernel(const __grid_constant__ CUtensorMap tm_q,
                      const __grid_constant__ CUtensorMap tm_k, const __grid_constant__ Params p) {
  extern __shared__ uint8_t smem_raw[];
  const uint32_t pad = (1024 - (sm90::smem_addr(smem_raw) & 1023)) & 1023;
  SharedStorage<kR>& sh = *reinterpret_cast<SharedStorage<kR>*>(smem_raw + pad);
  const CtaWork w = cta_work<kPaged>(p);
  if (threadIdx.x == 0) {
    sm90::mbar_init(&sh.q_full, 1);
    for (int s = 0; s < kStages; ++s) {
      sm90::mbar_init(&sh.full[s], 1 + 32);
      sm90::mbar_init(&sh.empty[s], Cfg<kR>::kConsumerThreads);
    }
    sm90::fence_barrier_init();
    sm90::prefetch_tensor_map(&tm_q);
    sm90::prefetch_tensor_map(&tm_k);
  }
  if (threadIdx.x < w.ntok) token_range<kPaged>(p, w, threadIdx.x, sh.lo[threadIdx.x], sh.hi[threadIdx.x]);
  __syncthreads();
  // The blocks some row sees within [c0, c1).
  int lo_min = INT_MAX, hi_max = 0;
  for (int i = 0; i < w.ntok; ++i)
    if (sh.lo[i] < sh.hi[i]) {
      lo_min = min(lo_min, sh.lo[i]);
      hi_max = max(hi_max, sh.hi[i]);
    }
  const int a = max(lo_min, w.c0), e = min(hi_max, w.c1);
  const int kb_lo = a < e ? a / kBlockN : 0, kb_hi = a < e ? (e + kBlockN - 1) / kBlockN : 0;
  if (threadIdx.x < 128) {
    sm90::regs_dealloc<Cfg<kR>::kProducerRegs>();
    if (threadIdx.x < 32) run_producer<kPaged, kR>(p, &tm_q, &tm_k, sh, w, kb_lo, kb_hi, hi_max, threadIdx.x);
  } else {
    sm90::regs_alloc<Cfg<kR>::kConsumerRegs>();
    run_consumer<kPaged, kR>(p, sh, w, kb_lo, kb_hi, threadIdx.x / 128 - 1, threadIdx.x - 128);
  }
}

}  // namespace msa::cuda::mqa_logits_sm90
