// The token-sparse forward kernel (token_traits.h): one CTA per (query token, kv head, row tile),
// a producer warpgroup gathering the query's selected keys 64 a stage with 16-byte cp.async rows,
// a consumer warpgroup running S = Q K^T, the online softmax and O += P V with wgmma, then the
// normalised rows, lse and tlse straight to the outputs. Included by instantiate_tokens_*.cu.
//
// Numerics as the uniform path (uniform_mma.cuh): scores in the log2 domain, unselected,
// invisible or empty key slots replaced by -inf (their K and V rows are zero-filled, never read
// from memory, so NaN in unused pool slots cannot leak), lazy rescaling of O.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "cuda/common/index_checks.cuh"
#include "cuda/sm90/sparse_fwd/token_traits.h"
#include "cuda/sm90/sparse_fwd/uniform_mma.cuh"

namespace msa::cuda::sparse_fwd {

// The unit of this CTA. Latest tokens first: under causal masking they see the most keys, so the
// longest CTAs start in the first wave.
struct TokenUnit {
  int64_t t;         // query token
  int32_t head;      // kv head
  int32_t hq0;       // first query head of the tile
  int32_t rows;      // query heads in the tile (<= 64)
  int32_t batch;
  int32_t last_key;  // the last key position the token sees (-1: none)
};

__device__ __forceinline__ TokenUnit token_unit(const TokenParams& p) {
  TokenUnit u;
  u.t = p.total_q - 1 - int64_t(blockIdx.x);
  u.head = int32_t(blockIdx.y) / p.row_tiles;
  const int32_t tile = int32_t(blockIdx.y) - u.head * p.row_tiles;
  u.hq0 = u.head * p.group + tile * 64;
  u.rows = min(64, p.group - tile * 64);
  u.batch = int32_t(find_batch(p.cu_seqlens_q, p.batch, u.t));
  const int32_t q0 = p.cu_seqlens_q[u.batch];
  const int32_t lq = p.cu_seqlens_q[u.batch + 1] - q0;
  const int32_t lk = max(0, p.cu_k[u.batch + 1] - p.cu_k[u.batch]);
  const int32_t diag = p.causal_offset != nullptr ? p.causal_offset[u.batch] : lk - lq;
  u.last_key = causal_last(p.causal, int32_t(u.t - q0), diag, lk);
  return u;
}

// Chunk c (0..D / 8 - 1, 16 bytes) of row r (< 64) of a 64 x D 16-bit tile: half c / 8, chunk
// (c % 8) ^ (r % 8) of the half's 128-byte row r (the 128-byte swizzle wgmma reads).
__device__ __forceinline__ uint32_t swizzled_chunk(uint32_t tile, int r, int c) {
  return tile + uint32_t((c >> 3) * kTokHalfBytes + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

// Producer warpgroup (tid 0..127): Q, the row scan, then every stage. kRow = D / 8 lanes copy one
// 2 D-byte row, a lane 16 bytes of it (D = 128: a half-warp a row, so every warp instruction reads
// two whole rows: with a row per lane, each 16-byte copy fetched a 32-byte sector of which the
// next instruction fetched the other half, 2.83 TB/s of useful gathers at TOKSPARSE-32K). Warp w
// copies keys 8 i + 2 w + {0, 1} (i = 0..7) of the stage, K and V, its 16 keys' rows in
// 16 kRow / 32 steps; lane l < 16 looks up key 8 (l / 2) + 2 w + l % 2 and the lanes take each
// key's row addresses by shuffle.
template <bool kF16, int kD>
__device__ __forceinline__ void token_producer(const TokenParams& p, TokenStorage<kD>& sh,
                                               const TokenUnit& u, int tid) {
  constexpr int kRow = kD / 8;            // 16-byte chunks a row
  constexpr int kRows = 32 / kRow;        // rows a warp step copies (4, 2, 1)
  constexpr int kSteps = 16 / kRows;      // a warp's steps for its 16 keys of a stage
  using TokRing = sm90::Ring<TokenStorage<kD>::kStages>;
  const int lane = tid & 31, warp = tid >> 5;
  const int part = lane / kRow, c = lane % kRow;  // the lane's row of a step, and its chunk
  // Q rows of the tile (rows past the group's heads zero-filled): 64 kRow chunks, 128 threads.
  {
    const auto* q = static_cast<const uint8_t*>(p.q) + 2 * u.t * p.q_stride_t;
    constexpr int kRowShift = kRow == 8 ? 3 : kRow == 16 ? 4 : 5;  // log2(kRow)
    const int r0 = tid >> kRowShift;  // its chunk c: tid % kRow = lane % kRow
#pragma unroll
    for (int i = 0; i < 64 * kRow / 128; ++i) {
      const int r = r0 + (128 / kRow) * i;
      const bool ok = r < u.rows;
      const uint8_t* src = q + 2 * int64_t(u.hq0 + (ok ? r : 0)) * p.q_stride_h + c * 16;
      sm90::cp_async_16(swizzled_chunk(sm90::smem_addr(sh.q[0]), r, c), src, ok ? 16u : 0u);
    }
    sm90::cp_async_mbar_arrive(&sh.q_full);
  }
  // The last slot holding a selected visible key: stages past it are never loaded.
  const int32_t* ids = p.q2k + (int64_t(u.head) * p.total_q + u.t) * p.topk;
  int32_t last = -1;
  for (int32_t s = tid; s < p.topk; s += 128) {
    const int32_t id = ids[s];
    if (id >= 0 && id <= u.last_key) last = s;
  }
  last = __reduce_max_sync(0xffffffffu, last);
  if (lane == 0) atomicMax(&sh.last_slot, last);
  sm90::named_sync(1, 128);
  const int32_t stages = (sh.last_slot + kTokKeys) / kTokKeys;
  if (tid == 0) {
    sh.stages = stages;
    sm90::mbar_arrive(&sh.q_full);
  }
  const auto* kbase = static_cast<const uint8_t*>(p.k);
  const auto* vbase = static_cast<const uint8_t*>(p.v);
  const int64_t k_head = p.k_stride_head * u.head, v_head = p.v_stride_head * u.head;
  const int32_t key0 = p.paged.page_table == nullptr ? p.cu_k[u.batch] : 0;
  const int32_t* pages = p.paged.page_table + int64_t(u.batch) * p.paged.page_table_stride;
  const int my_key = 8 * ((lane >> 1) & 7) + 2 * warp + (lane & 1);  // lanes >= 16 repeat 0..15
  const uint32_t* mask = nullptr;  // the token's packed key-mask row (null: no mask)
  if (p.mask_bits != nullptr)
    mask = p.mask_bits + int64_t(p.mask_token_row != nullptr ? p.mask_token_row[u.t] : u.t) *
                             p.mask_words;
  for (int32_t n = 0; n < stages; ++n) {
    const int s = TokRing::stage(n);
    const int32_t slot = n * kTokKeys + my_key;
    const int32_t id = slot < p.topk ? ids[slot] : -1;
    bool ok = id >= 0 && id <= u.last_key;
    if (ok && mask != nullptr)  // ids past the mask's columns see nothing (key_mask_short)
      ok = (id >> 5) < p.mask_words && ((__ldg(mask + (id >> 5)) >> (id & 31)) & 1u);
    int64_t koff = 0, voff = 0;  // element offsets of the key's rows
    if (ok) {
      if (p.paged.page_table == nullptr) {
        const int64_t row = int64_t(key0) + id;
        ok = row >= 0 && row < p.total_k;  // cu_seqlens_k was checked (and reported) on the device
        koff = row * p.k_stride_row + k_head;
        voff = row * p.v_stride_row + v_head;
      } else {
        const int32_t page = pages[id >> p.paged.page_shift];
        ok = page >= 0 && page < p.paged.num_pages;  // a bad id was reported by the paged check
        const int64_t sl = id & ((1 << p.paged.page_shift) - 1);
        koff = int64_t(page) * p.k_stride_page + sl * p.k_stride_row + k_head;
        voff = int64_t(page) * p.v_stride_page + sl * p.v_stride_row + v_head;
      }
    }
    const uint32_t bits = __ballot_sync(0xffffffffu, ok) & 0xffffu;
    sm90::mbar_wait(&sh.empty[s], TokRing::empty_parity(n));
    const uint32_t kt = sm90::smem_addr(sh.k[s][0]), vt = sm90::smem_addr(sh.v[s][0]);
#pragma unroll
    for (int i = 0; i < kSteps; ++i) {
      // Step i copies chunk c of the warp's rows from = kRows i + part (its key 8 (from / 2) +
      // 2 w + from % 2).
      const int from = kRows * i + part;
      const int key = kRows >= 2 ? 4 * kRows * i + 8 * (part >> 1) + 2 * warp + (part & 1)
                                 : 8 * (i >> 1) + 2 * warp + (i & 1);
      const bool kok = (bits >> from) & 1u;
      const int64_t ko = __shfl_sync(0xffffffffu, koff, from);
      const int64_t vo = __shfl_sync(0xffffffffu, voff, from);
      sm90::cp_async_16(swizzled_chunk(kt, key, c), kok ? kbase + 2 * ko + c * 16 : kbase,
                        kok ? 16u : 0u);
      sm90::cp_async_16(swizzled_chunk(vt, key, c), kok ? vbase + 2 * vo + c * 16 : vbase,
                        kok ? 16u : 0u);
    }
    if (lane == 0) {
      sh.mask[s][warp] = bits;
      sm90::mbar_arrive(&sh.full[s]);
    }
    sm90::cp_async_mbar_arrive(&sh.full[s]);
  }
}

// A stage's mask applied to both rows of S: column 8 n + col_base + e (col_base = 2 (lane % 4))
// is key 8 n + 2 w + e of warp w = lane % 4's word, bit 2 n + e.
__device__ __forceinline__ void apply_stage_mask(float (&sc)[32], uint32_t bits) {
  if (bits == 0xffffu) return;
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int e = 0; e < 2; ++e)
      if (((bits >> (2 * n + e)) & 1u) == 0) sc[n * 4 + e] = sc[n * 4 + 2 + e] = -INFINITY;
}

template <typename T, int kOff, int kN>
__device__ __forceinline__ void store_token_row(const TokenParams& p, const float (&o)[kN],
                                                int64_t t, int32_t hq, const OnlineRow& r,
                                                int col_base, bool lead) {
  const float inv = r.m == -INFINITY ? 0.f : 1.f / r.l;
  T* row = static_cast<T*>(p.out) + t * p.out_stride_t + int64_t(hq) * p.out_stride_h;
  store_row<T, kOff>(row, o, inv, col_base);
  if (lead) {
    if (p.lse) p.lse[int64_t(hq) * p.total_q + t] = row_lse(r.m, r.l);
    if (p.tlse) p.tlse[int64_t(hq) * p.total_q + t] = row_tlse(r.m, r.t, p.inv_temperature);
  }
}

// Consumer warpgroup (tid 0..127): per stage j one wgmma group {S_j = Q K_j^T, O += P_{j-1}
// V_{j-1}}, S_j's softmax overlapping the P V product (uniform_mma.cuh's order, one warpgroup).
template <bool kF16, bool kTemp, int kD>
__device__ __forceinline__ void token_consumer(const TokenParams& p, TokenStorage<kD>& sh,
                                               const TokenUnit& u, int tid) {
  using TokRing = sm90::Ring<TokenStorage<kD>::kStages>;
  using T = std::conditional_t<kF16, __half, __nv_bfloat16>;
  const int warp = tid >> 5, lane = tid & 31;
  const int r0 = warp * 16 + (lane >> 2), r1 = r0 + 8;
  const int col_base = 2 * (lane & 3);
  sm90::mbar_wait(&sh.q_full, 0);
  const int32_t stages = sh.stages;
  const uint32_t q_addr = sm90::smem_addr(sh.q[0]);
  float o[kD / 2], sc[32];
  uint32_t pa[4][4];
#pragma unroll
  for (int i = 0; i < kD / 2; ++i) o[i] = 0.f;
  OnlineRow st0, st1;
  float a0, a1;
  // The stage's mask words, read by lane 0 alone (the lane that later frees the stage, so the
  // read precedes the release as racecheck sees it) and broadcast; this thread's is lane % 4's.
  auto stage_mask = [&](int s) {
    uint4 m = make_uint4(0u, 0u, 0u, 0u);
    if (lane == 0) m = *reinterpret_cast<const uint4*>(sh.mask[s]);
    const uint32_t w[4] = {__shfl_sync(0xffffffffu, m.x, 0), __shfl_sync(0xffffffffu, m.y, 0),
                           __shfl_sync(0xffffffffu, m.z, 0), __shfl_sync(0xffffffffu, m.w, 0)};
    const int q = lane & 3;
    return q == 0 ? w[0] : q == 1 ? w[1] : q == 2 ? w[2] : w[3];
  };
  auto softmax = [&](int s) {
    float s0 = p.scale_log2, s1 = p.scale_log2;
    if (p.soft_cap_log2 > 0.f) {
      s0 = soft_cap_row<0>(sc, s0, p.soft_cap_log2);
      s1 = soft_cap_row<2>(sc, s1, p.soft_cap_log2);
    }
    apply_stage_mask(sc, stage_mask(s));
    // Slack 0: the base is always the running max, so the largest term of a row is exactly 1 in
    // bf16 P (with kRescaleSlack, p up to 2^8 rounded: 2.6x the FA3 bar's error on peaked rows).
    online_softmax_rows<kTemp>(sc, kTokKeys - 1, kTokKeys - 1, col_base, s0, s1,
                               p.inv_temperature, st0, st1, a0, a1, 0.f);
  };
  auto wait_full = [&](int32_t n) {
    sm90::mbar_wait(&sh.full[TokRing::stage(n)], TokRing::full_parity(n));
    // The stage's rows were written by cp.async (generic proxy); wgmma reads them (async proxy).
    sm90::fence_proxy_async_smem();
  };
  auto release = [&](int32_t n) {
    if (lane == 0) sm90::mbar_arrive(&sh.empty[TokRing::stage(n)]);
  };
  if (stages > 0) {
    wait_full(0);
    sm90::wgmma_fence();
    issue_uniform_qk<kF16, false, kD>(sc, q_addr, sm90::smem_addr(sh.k[0][0]));
    sm90::wgmma_wait<0>();
    fence_regs(sc);
    softmax(0);
    pack_probs<kF16>(sc, pa);
    for (int32_t n = 1; n < stages; ++n) {
      wait_full(n);
      const int s = TokRing::stage(n), sp = TokRing::stage(n - 1);
      sm90::wgmma_fence();
      issue_uniform_qk<kF16, false, kD>(sc, q_addr, sm90::smem_addr(sh.k[s][0]));
      issue_uniform_pv<kF16>(o, pa, sm90::smem_addr(sh.v[sp][0]));
      sm90::wgmma_wait<1>();
      fence_regs(sc);
      softmax(s);
      sm90::wgmma_wait<0>();
      fence_regs(o);
      fence_regs(pa);
      release(n - 1);
      if (__any_sync(0xffffffffu, a0 != 1.f || a1 != 1.f)) rescale_rows(o, a0, a1);
      pack_probs<kF16>(sc, pa);
    }
    sm90::wgmma_fence();
    issue_uniform_pv<kF16>(o, pa, sm90::smem_addr(sh.v[TokRing::stage(stages - 1)][0]));
    sm90::wgmma_wait<0>();
    fence_regs(o);
    fence_regs(pa);
    release(stages - 1);
  }
  finish_row(st0, p.inv_temperature);
  finish_row(st1, p.inv_temperature);
  const bool lead = (lane & 3) == 0;
  if (r0 < u.rows) store_token_row<T, 0>(p, o, u.t, u.hq0 + r0, st0, col_base, lead);
  if (r1 < u.rows) store_token_row<T, 2>(p, o, u.t, u.hq0 + r1, st1, col_base, lead);
}

template <bool kF16, bool kTemp, int kD>
__global__ void __launch_bounds__(kTokThreads, kTokCtasPerSm<kD>)
    token_fwd_kernel(const __grid_constant__ TokenParams p) {
  extern __shared__ __align__(1024) uint8_t token_smem[];
  // token_traits.h: the plan has no alignment slack.
  if ((sm90::smem_addr(token_smem) & 1023u) != 0) __trap();
  TokenStorage<kD>& sh = *reinterpret_cast<TokenStorage<kD>*>(token_smem);
  const int tid = int(threadIdx.x);
  if (tid == 0) {
    for (int s = 0; s < TokenStorage<kD>::kStages; ++s) {
      sm90::mbar_init(&sh.full[s], 128 + 4);  // every producer thread's copies + 4 mask writers
      sm90::mbar_init(&sh.empty[s], 4);       // lane 0 of each consumer warp
    }
    sm90::mbar_init(&sh.q_full, 128 + 1);     // the Q copies + the stage count
    sh.last_slot = -1;
    sm90::fence_barrier_init();
  }
  __syncthreads();
  const TokenUnit u = token_unit(p);
  if (tid < 128) {
    constexpr uint32_t kRegs = kTokProducerRegsOf<kD>;
    sm90::regs_dealloc<kRegs>();
    token_producer<kF16, kD>(p, sh, u, tid);
  } else {
    constexpr uint32_t kRegs = kTokConsumerRegsOf<kD>;
    sm90::regs_alloc<kRegs>();
    token_consumer<kF16, kTemp, kD>(p, sh, u, tid - 128);
  }
}

}  // namespace msa::cuda::sparse_fwd
