// The sm_90a MQA logits kernel (traits.h): ragged rows over a flat key tensor, or the paged rows
// of seed 001 over a fused page pool. Roles: the producer warpgroup (warp 0: Q once by TMA, one
// box per token; the four warps in turn: each 128-key block through a kStages ring, flat keys
// one box, paged keys one box per pool block, and the block's 128 key scales by cp.async; then
// -inf into the unseen columns), four consumer warpgroups (each a 64-key half of a block against
// 128 query rows: S^T = K Q^T by wgmma, then relu times the head weights summed over the
// thread's columns and its quad, times the key scale, into logits).
// Barriers: q_full (producer lane 0 + TMA bytes), full[s] (the issuing warp's lane 0 arrival
// with the TMA bytes, plus its 32 lanes' cp.async arrivals), empty[s] (every thread of the
// warpgroups that read stage s, after its scale reads).
#pragma once

#include <cuda.h>

#include <climits>
#include <cstdint>

#include "cuda/device/pipeline.cuh"
#include "cuda/device/sm90.cuh"
#include "cuda/device/status.cuh"
#include "cuda/device/wgmma_m64n128.cuh"
#include "cuda/device/wgmma_m64n8.cuh"
#include "cuda/sm90/mqa_logits/fp4_load.cuh"
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
__device__ __forceinline__ CtaWork cta_work(const Params& p, unsigned block) {
  CtaWork w;
  if constexpr (kPaged) {
    const int64_t x = block;
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
    const int64_t tile = int64_t(gridDim.x) - 1 - block;
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
      flag_status(p.status, int32_t(StatusCode::seq_len_invalid), w.b + p.report_base, len, p.cols);
      return;
    }
    hi = len > 0 ? max(0, len - p.next_n + w.first + i + 1) : 0;
  } else {
    const int64_t r = w.row0 + i;
    const int32_t s = p.ks[r], e = p.ke[r];
    if (s < 0 || s > e || e > p.cols) {
      flag_status(p.status, int32_t(StatusCode::key_range_invalid), r + p.report_base, s, e);
      return;
    }
    lo = s;
    hi = e;
  }
}

// The paged block table of request b seen through a window of 32 columns, one per producer lane,
// with the next window's entries already in flight: a block's pool ids come by shuffles, never
// by a dependent global load per block (one per block made the producer the bound: 2 us per
// block on MQAL-PAGED-B64). Entries past the table read as -1.
struct TableWindow {
  int base = 0;           // the window's first column
  int32_t cur = -1, next = -1;
  __device__ __forceinline__ static int32_t load(const Params& p, int b, int col) {
    return col < p.bt_cols ? p.block_tables[int64_t(b) * p.bt_stride + col] : -1;
  }
  __device__ __forceinline__ void start(const Params& p, int b, int col0, int lane) {
    base = col0;
    cur = load(p, b, base + lane);
    next = load(p, b, base + 32 + lane);
  }
  // Moves the window on until it holds column `col` (warp-uniform; col never goes back).
  __device__ __forceinline__ void reach(const Params& p, int b, int col, int lane) {
    while (col >= base + 32) {
      base += 32;
      cur = next;
      next = load(p, b, base + 32 + lane);
    }
  }
  // Column col's id from lane col - base (col within the window; every lane calls).
  __device__ __forceinline__ int32_t id(int col) const {
    return __shfl_sync(0xffffffffu, cur, (col - base) & 31);
  }
};

// Paged, one thread: a block table narrower than the request's visible keys (hi_max) need is
// reported (the missing columns read as -1 and their keys are not read).
__device__ __forceinline__ void check_table_width(const Params& p, const CtaWork& w, int hi_max) {
  const int needed = (hi_max + p.block_size - 1) >> p.block_shift;
  if (needed > p.bt_cols)
    flag_status(p.status, int32_t(StatusCode::block_table_narrow), w.b + p.report_base, needed, p.bt_cols);
}

// MXFP4: the four UE8M0 scale bytes of q's row `row`, head h (q_sf's last dim is contiguous).
__device__ __forceinline__ uint32_t q_scale_word(const Params& p, int64_t row, int h) {
  const uint8_t* sf = p.q_sf + row * p.sf_stride_row + h * p.sf_stride_h;
  return uint32_t(sf[0]) | (uint32_t(sf[1]) << 8) | (uint32_t(sf[2]) << 16) | (uint32_t(sf[3]) << 24);
}

// The key blocks [lo, hi) some row of the CTA sees within [c0, c1) (empty: 0, 0), and the end of
// the rows' ranges.
struct Blocks {
  int lo = 0, hi = 0, hi_max = 0;
};
__device__ __forceinline__ Blocks blocks_seen(const SharedStorage& sh, const CtaWork& w) {
  int lo_min = INT_MAX;
  Blocks k;
  for (int i = 0; i < w.ntok; ++i)
    if (sh.lo[i] < sh.hi[i]) {
      lo_min = min(lo_min, sh.lo[i]);
      k.hi_max = max(k.hi_max, sh.hi[i]);
    }
  const int a = max(lo_min, w.c0), e = min(k.hi_max, w.c1);
  if (a < e) {
    k.lo = a / kBlockN;
    k.hi = (e + kBlockN - 1) / kBlockN;
  }
  return k;
}

// -inf into row[a, b) by 128 threads (t): 16-byte stores where the row's address allows.
__device__ __forceinline__ void fill_neg_inf(float* row, int a, int b, int t) {
  if (a >= b) return;
  const int mis = int((reinterpret_cast<uintptr_t>(row + a) >> 2) & 3);
  const int head = min(b - a, (4 - mis) & 3);
  if (t < head) row[a + t] = -INFINITY;
  const int va = a + head, nv = (b - va) >> 2;
  float4* v = reinterpret_cast<float4*>(row + va);
  // Not unrolled: four 16-byte stores in flight at once spilled under the producer's 32 registers.
#pragma unroll 1
  for (int j = t; j < nv; j += 128) v[j] = make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
  const int tail = va + 4 * nv;
  if (t < b - tail) row[tail + t] = -INFINITY;
}

// Columns of the CTA's rows in [c0, c1) outside the computed blocks (all of them when none is),
// set to -inf by the 128 producer threads (t) once their loads are issued, so that the stores run
// under the consumers' last blocks. The consumers did this after their loop, one scalar store and
// one 64-bit division per column, alone on the SM: 18% of MQAL-PAGED-B64's warp samples; under
// causal ranges (MQAL-PREFILL-32K) half of the [T, S] logits are such columns. Everything it needs
// is derived again from p, an opaque copy of the block index and the rows' ranges in shared
// memory: the CTA's work kept live across the producer loop made that loop spill under its 32
// registers.
template <bool kPaged>
__device__ __forceinline__ void clean_unseen(const Params& p, const SharedStorage& sh, int t) {
  if (!p.clean) return;
  const CtaWork w = cta_work<kPaged>(p, unsigned(sm90::reg_copy(int(blockIdx.x))));
  const Blocks k = blocks_seen(sh, w);
  const bool any = k.hi > k.lo;
  const int lo_col = any ? min(w.c1, k.lo * kBlockN) : w.c1;
  const int hi_col = any ? max(w.c0, k.hi * kBlockN) : w.c1;
  for (int i = 0; i < w.ntok; ++i) {
    float* row = p.logits + (w.row0 + i) * p.out_stride;
    fill_neg_inf(row, w.c0, lo_col, t);
    fill_neg_inf(row, hi_col, w.c1, t);
  }
}

// Producer warp `pw` of kProducerWarps: Q (warp 0), then every kProducerWarps-th key block of
// [kb_lo, kb_hi) from its own, with the block's scales. One warp issuing every block was the
// bound: ~430 instructions a block (table window, id checks, scale copies, boxes) took it ~1.1 us
// a block, and the consumers waited on full stages for half their time (MQAL-PAGED-B64).
template <bool kPaged, int kHp>
__device__ void run_producer(const Params& p, const CUtensorMap* tm_q, const CUtensorMap* tm_k,
                             SharedStorage& sh, const CtaWork& w, int kb_lo, int kb_hi,
                             int hi_max, int pw, int lane) {
  if (pw == 0 && lane == 0) {
    sm90::mbar_arrive_expect_tx(&sh.q_full, uint32_t(w.ntok * kHp * kRowBytes));
    for (int i = 0; i < w.ntok; ++i)
      sm90::tma_load_3d(sh.q + i * kHp * kRowBytes, tm_q, &sh.q_full, 0, 0, int32_t(w.row0 + i));
    if (kPaged && kb_hi > kb_lo) check_table_width(p, w, hi_max);
  }
  constexpr int kPerLane = kBlockN / 32;
  TableWindow tab;
  if (kPaged && kb_lo + pw < kb_hi) tab.start(p, w.b, ((kb_lo + pw) * kBlockN) >> p.block_shift, lane);
  for (int it = pw, kb = kb_lo + pw; kb < kb_hi; it += kProducerWarps, kb += kProducerWarps) {
    const int stage = Ring::stage(it);
    const int key0 = kb * kBlockN;
    // The block's pool ids (paged): columns [key0 >> shift, (key0 + 128) >> shift) lie in one
    // window (32 columns hold 1024 keys or more).
    if constexpr (kPaged) tab.reach(p, w.b, (key0 + kBlockN - 1) >> p.block_shift, lane);
    if (it >= kStages) sm90::mbar_wait(&sh.empty[stage], Ring::empty_parity(it));
    // Scales: 4 keys per lane by cp.async (zeros where no key is read), one arrival per lane.
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int key = key0 + lane + 32 * i;
      const void* src = p.weights;  // any valid address when nothing is copied
      uint32_t bytes = 0;
      if constexpr (kPaged) {
        const int32_t id = tab.id(key >> p.block_shift);
        if (key < hi_max && id >= 0 && id < p.num_blocks) {
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
    if constexpr (kPaged) {
      // One box per pool block of the 128 keys (block sizes 32, 64, 128): lane j < 128 / block
      // size takes pool block j, its id by shuffle, and issues its own box once lane 0 has set
      // the stage's byte count. (A loop over the four boxes in lane 0 had ptxas hoist their
      // offsets out of the block loop and spill them under the producer's 32 registers.)
      const int shift = p.block_shift, j = lane & 3;
      const int key = key0 + (j << shift), col = key >> shift;
      const int32_t id = tab.id(col);
      const bool want = lane < (kBlockN >> shift) && key < hi_max && col < p.bt_cols;
      const bool ok = want && id >= 0 && id < p.num_blocks;
      if (want && !ok) flag_status(p.status, int32_t(StatusCode::page_id_out_of_range), w.b + p.report_base, col, id);
      const uint32_t boxes = __popc(__ballot_sync(0xffffffffu, ok));
      if (lane == 0)
        sm90::mbar_arrive_expect_tx(&sh.full[stage], boxes * uint32_t(p.block_size) * kRowBytes);
      __syncwarp();
      if (ok)
        sm90::tma_load_3d(sh.k[stage] + (j << shift) * kRowBytes, tm_k, &sh.full[stage], 0, 0, id);
    } else if (lane == 0) {
      sm90::mbar_arrive_expect_tx(&sh.full[stage], uint32_t(kKBlockBytes));
      sm90::tma_load_3d(sh.k[stage], tm_k, &sh.full[stage], 0, 0, key0);
    }
  }
}

// MXFP4 producer warpgroup (tid 0..127, fp4_load.cuh): Q's rows converted once, then thread tid
// converts key key0 + tid of every block: its 64 bytes and scale word copied kFp4Ahead blocks
// ahead into the thread's own raw slots (so no barrier guards them), written as e4m3 with the
// key's factor in the stage's scales (0 and a zero row where no key is read). Each thread fences
// its generic stores for wgmma and arrives on the stage.
template <int kHp>
__device__ void run_producer_fp4(const Params& p, SharedStorage& sh, const CtaWork& w, int kb_lo,
                                 int kb_hi, int hi_max, int tid) {
  const int lane = tid & 31;
  for (int r = tid; r < w.ntok * kHp; r += 128) {
    const int tok = r / kHp, h = r % kHp;
    if (h < p.heads) {
      const int64_t row = w.row0 + tok;
      const uint8_t* src = p.q4 + row * p.q4_stride_row + h * p.q4_stride_h;
      uint4 v[4];
#pragma unroll
      for (int g = 0; g < 4; ++g) v[g] = __ldg(reinterpret_cast<const uint4*>(src) + g);
      const uint32_t sf = q_scale_word(p, row, h);
      store_fp4_row(sh.q, r, v, sf, max_exponent(sf));
    } else {
      zero_row(sh.q, r);
    }
  }
  sm90::fence_proxy_async_smem();
  sm90::mbar_arrive(&sh.q_full);
  if (tid == 0 && kb_hi > kb_lo) check_table_width(p, w, hi_max);
  TableWindow tab;
  if (kb_hi > kb_lo) tab.start(p, w.b, (kb_lo * kBlockN) >> p.block_shift, lane);
  // Copies key key0 + tid of block kb (64 value bytes, its scale word; zeros where no key is
  // read) into raw slot `slot` as one cp.async group; returns whether the key was read.
  const auto copy = [&](int kb, int slot) {
    const int key0 = kb * kBlockN, key = key0 + tid, col = key >> p.block_shift;
    tab.reach(p, w.b, (key0 + kBlockN - 1) >> p.block_shift, lane);
    const int32_t id = tab.id(col);
    const bool used = key < hi_max && col < p.bt_cols;
    const bool ok = used && id >= 0 && id < p.num_blocks;
    if (used && !ok && (key & (p.block_size - 1)) == 0)
      flag_status(p.status, int32_t(StatusCode::page_id_out_of_range), w.b + p.report_base, col, id);
    const uint8_t* base = p.pool + int64_t(ok ? id : 0) * p.block_bytes;
    const void* none = p.weights;  // any valid address when nothing is copied
    const int s = key & (p.block_size - 1);
    const uint32_t dst = sm90::smem_addr(sh.raw[slot][tid]);
#pragma unroll
    for (int g = 0; g < 4; ++g)
      sm90::cp_async_16(dst + 16 * raw_chunk(g, tid), ok ? static_cast<const void*>(base + s * 64 + 16 * g) : none,
                        ok ? 16u : 0u);
    sm90::cp_async_4(sm90::smem_addr(&sh.raw_sf[slot][tid]),
                     ok ? static_cast<const void*>(base + p.block_size * 64 + s * 4) : none,
                     ok ? 4u : 0u);
    sm90::cp_async_commit();
    return ok;
  };
  const int n = kb_hi - kb_lo;
  uint32_t oks = 0;  // bit d: the key of block it + d was read
#pragma unroll
  for (int d = 0; d < kFp4Ahead; ++d) {
    if (d < n) oks |= uint32_t(copy(kb_lo + d, d)) << d;
    else sm90::cp_async_commit();  // an empty group keeps the count of groups in flight
  }
  for (int it = 0; it < n; ++it) {
    const int stage = Ring::stage(it), slot = it % kFp4Raw;
    if (it + kFp4Ahead < n)
      oks |= uint32_t(copy(kb_lo + it + kFp4Ahead, (it + kFp4Ahead) % kFp4Raw)) << kFp4Ahead;
    else
      sm90::cp_async_commit();
    sm90::cp_async_wait<kFp4Ahead>();  // block it's copies have landed (this thread's own)
    const bool ok = oks & 1u;
    oks >>= 1;
    if (it >= kStages) sm90::mbar_wait(&sh.empty[stage], Ring::empty_parity(it));
    if (ok) {
      uint4 v[4];
#pragma unroll
      for (int g = 0; g < 4; ++g)
        v[g] = *reinterpret_cast<const uint4*>(sh.raw[slot][tid] + 16 * raw_chunk(g, tid));
      const uint32_t sf = sh.raw_sf[slot][tid];
      const int me = max_exponent(sf);
      store_fp4_row(sh.k[stage], tid, v, sf, me);
      sh.scale[stage][tid] = token_factor(me);
    } else {
      zero_row(sh.k[stage], tid);
      sh.scale[stage][tid] = 0.f;
    }
    sm90::fence_proxy_async_smem();
    sm90::mbar_arrive(&sh.full[stage]);
  }
}

// relu that keeps NaN (a NaN input gives a NaN logit, as the reference): one max.NaN.
__device__ __forceinline__ float relu_nan(float x) {
  float r;
  asm("max.NaN.f32 %0, %1, 0f00000000;" : "=f"(r) : "f"(x));
  return r;
}

// S^T = K Q^T of one 64-key half of a K stage (A: keys x D at `k_desc`) and 128 query rows
// (B: rows x D at `q_desc`), one commit group; the first k-step overwrites the accumulators.
__device__ __forceinline__ void issue_kq(float (&acc)[64], uint64_t k_desc, uint64_t q_desc) {
  sm90::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kHeadDim / 32; ++kk)
    sm90::wgmma_ss_e4m3(acc, sm90::desc_offset(k_desc, kk * 32), sm90::desc_offset(q_desc, kk * 32),
                        kk > 0 ? 1u : 0u);
  sm90::wgmma_commit();
}

// Consumer warpgroup `rg`: key half kh = rg % 2 of a block, token group tg = (rg / 2) % groups
// (128 query rows: 128 / kHp tokens), column lane cl = rg / (2 groups), which takes every
// lanes-th block. S^T comes out keys x rows, so a thread holds two keys x 32 rows, and a token's
// weighted relu sum needs no cross-warp reduction (no shared-memory round trip, no barrier
// between the consumers). kHp, the rows a token takes, is a compile-time constant so that every
// index of the epilogue is one too. The head sum, two ways:
// - FFMA (FP8 kernels): each thread sums its own columns, then its quad's 4 lanes by shuffles.
// - kMmaSum (MXFP4 kernels): relu(S^T) [64 keys x 128 rows] straight from the accumulators as the
//   A operand of 16 tf32 `wgmma m64n8k8` against the group's weight tile (wtile), whose column n
//   is token n % kTokens, so every lane of a quad holds the same (key, token) sums. On an H100,
//   alternated, medians of 20, with the straight conversion (fp4_load.cuh): MQAL-PAGED-B64-fp4
//   139.9-140.5 us with FFMA, 137.6-138.2 with the products (their consumers share the SM with
//   converting producers, so fewer consumer instructions pay); the FP8 kernels lost to the N = 8
//   products' tensor time (MQAL-PAGED-B64 116.3 -> 118.7 / 117.7 us, MQAL-PREFILL-32K 9.28 ->
//   9.64 / 9.79 ms) for 17% fewer loop instructions (258 -> 215 at H 64), so they keep FFMA. The
//   tf32 operands (the f32 bits' top 19) round each term to ~2^-11: 7.0-7.6e-4 relative L2 on the
//   tests' inputs (docs/kernels/mqa_logits.md), within their 1e-3.
template <bool kPaged, int kHp, bool kMmaSum>
__device__ void run_consumer(const Params& p, SharedStorage& sh, const CtaWork& w, int kb_lo,
                             int kb_hi, int rg, int tid) {
  constexpr int kJt = kHp / 8;              // 8-column groups per token
  constexpr int kTokens = kBlockN / kHp;    // tokens per 128-row group (<= 4: wtile's 8 columns)
  constexpr int kValues = 2 * kTokens;      // (key, token) sums per quad
  // The sums each lane stores: FFMA, value v = 4 e + c (token v / 2, key v % 2); MMA, value
  // i = first + e of its d (key i / 2, token (2 c + i % 2) % kTokens).
  constexpr int kStores = kMmaSum ? (kTokens >= 4 ? 2 : 1) : (kValues + 3) / 4;
  const int warp = (tid >> 5) & 3, lane = tid & 31, c = lane & 3;
  // The warpgroup index through lane 0's copy: ptxas then sees it (and the stage, the
  // descriptors and the block loop derived from it) as warp-uniform and builds the wgmma
  // descriptors in uniform registers, instead of moving each from vector registers (R2UR) before
  // every wgmma.
  rg = __shfl_sync(0xffffffffu, rg, 0);
  const int kh = rg & 1, tg = (rg >> 1) % p.groups_n, cl = rg / (2 * p.groups_n);
  const int tok0 = tg * kTokens;  // the CTA token of this group's column 0
  const uint64_t q_desc = sm90::tile_desc(sh.q + tg * kBlockN * kRowBytes);
  const uint64_t k_desc0 = sm90::tile_desc(sh.k[0] + kh * 64 * kRowBytes);
  const bool unit_scale = !kPaged && p.k_scale == nullptr;
  const float* wrow = sh.wt + tg * kBlockN;  // weights of this group's 128 rows (0 past H)
  const uint64_t w_desc = sm90::wgmma_desc_plain(sm90::smem_addr(sh.wtile[tg]), 128);
  const int key_in = kh * 64 + warp * 16 + (lane >> 2);  // this thread's keys: key_in, key_in + 8
  const int first = kTokens == 1 ? 2 * c : kTokens == 2 ? c : 2 * (c >> 1);  // MMA
  // Each stored sum's token (CTA index), key offset (0 or 8) and visible range, once.
  int32_t lo[kStores], hi[kStores], tok[kStores], koff[kStores];
  bool own[kStores];
#pragma unroll
  for (int e = 0; e < kStores; ++e) {
    if constexpr (kMmaSum) {
      const int i = first + e;
      tok[e] = tok0 + (2 * c + (i & 1)) % kTokens;
      koff[e] = 8 * (i >> 1);
      own[e] = (kTokens > 1 || c < 2) && tok[e] < w.ntok;
    } else {
      const int v = 4 * e + c;
      tok[e] = tok0 + v / 2;
      koff[e] = 8 * (v & 1);
      own[e] = v < kValues && tok[e] < w.ntok;
    }
    lo[e] = own[e] ? sh.lo[tok[e]] : 0;
    hi[e] = own[e] ? sh.hi[tok[e]] : 0;
  }
  sm90::mbar_wait(&sh.q_full, 0);
  float acc[64];
  for (int b = cl; kb_lo + b < kb_hi; b += p.lanes) {
    const int stage = Ring::stage(b);
    const int kb = kb_lo + b;
    sm90::mbar_wait(&sh.full[stage], Ring::full_parity(b));
    issue_kq(acc, sm90::desc_offset(k_desc0, uint32_t(stage) * kKBlockBytes), q_desc);
    sm90::wgmma_wait<0>();
    // Columns 8 j + 2 c + e, keys key_in (acc[4 j + e]) and key_in + 8 (acc[4 j + 2 + e]); token
    // t of the group holds groups j in [t kJt, (t + 1) kJt). Rows past H weigh 0 and hold zero Q
    // (the TMA fill; MMA: the rows of absent tokens are zeroed too): they add 0, or NaN only where
    // the key holds NaN and the real rows give NaN too.
    float x[kStores];
    if constexpr (kMmaSum) {
#pragma unroll
      for (int i = 0; i < 64; ++i) acc[i] = relu_nan(acc[i]);
      float d[4] = {0.f, 0.f, 0.f, 0.f};
      sm90::wgmma_fence();
#pragma unroll
      for (int j = 0; j < 16; ++j) {  // A: (key g, k t), (g + 8, t), (g, t + 4), (g + 8, t + 4)
        const uint32_t a[4] = {__float_as_uint(acc[4 * j]), __float_as_uint(acc[4 * j + 2]),
                               __float_as_uint(acc[4 * j + 1]), __float_as_uint(acc[4 * j + 3])};
        sm90::wgmma_rs_tf32_n8(d, a, sm90::desc_offset(w_desc, uint32_t(j) * 256u), j > 0 ? 1u : 0u);
      }
      sm90::wgmma_commit();
      sm90::wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < 4; ++i) sm90::reg_fence(d[i]);
#pragma unroll
      for (int e = 0; e < kStores; ++e) {  // d[first + e], first known at run time only
        x[e] = d[0];
#pragma unroll
        for (int r = 1; r < 4; ++r) x[e] = first + e == r ? d[r] : x[e];
      }
    } else {
#pragma unroll
      for (int i = 0; i < 64; ++i) sm90::reg_fence(acc[i]);
      float sum[kValues];
#pragma unroll
      for (int v = 0; v < kValues; ++v) sum[v] = 0.f;
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        const float2 wj = *reinterpret_cast<const float2*>(wrow + 8 * j + 2 * c);
#pragma unroll
        for (int k = 0; k < 2; ++k) {
          float& s = sum[2 * (j / kJt) + k];
          s = fmaf(wj.x, relu_nan(acc[4 * j + 2 * k]), s);
          s = fmaf(wj.y, relu_nan(acc[4 * j + 2 * k + 1]), s);
        }
      }
      // The quad's 4 lanes hold a token's columns between them.
#pragma unroll
      for (int v = 0; v < kValues; ++v) {
        sum[v] += __shfl_xor_sync(0xffffffffu, sum[v], 1);
        sum[v] += __shfl_xor_sync(0xffffffffu, sum[v], 2);
      }
#pragma unroll
      for (int e = 0; e < kStores; ++e) {  // sum[4 e + c]: c is known at run time only
        x[e] = sum[4 * e];
#pragma unroll
        for (int r = 1; r < 4; ++r)
          if (4 * e + r < kValues) x[e] = c == r ? sum[4 * e + r] : x[e];
      }
    }
#pragma unroll
    for (int e = 0; e < kStores; ++e) {
      const int key = key_in + koff[e], col = kb * kBlockN + key;
      if (!own[e] || col < w.c0 || col >= w.c1) continue;
      float* out = p.logits + (w.row0 + tok[e]) * p.out_stride + col;
      if (col >= lo[e] && col < hi[e])
        *out = x[e] * (unit_scale ? 1.f : sh.scale[stage][key]);
      else if (p.clean)
        *out = -INFINITY;
    }
    sm90::mbar_arrive(&sh.empty[stage]);
  }
}

// tm_q: q as [rows, H, 128] e4m3, boxes of 128 x kHp x 1. tm_k: ragged, k as [S, 1, 128], boxes of
// 128 keys; paged, the pool's values as [num_blocks, block_size, 128] (block stride block_bytes),
// boxes of one pool block.
template <bool kPaged, int kHp, bool kFp4 = false>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kCtasPerSm)
    mqa_logits_kernel(const __grid_constant__ CUtensorMap tm_q,
                      const __grid_constant__ CUtensorMap tm_k, const __grid_constant__ Params p) {
  extern __shared__ uint8_t smem_raw[];
  const uint32_t pad = (1024 - (sm90::smem_addr(smem_raw) & 1023)) & 1023;
  SharedStorage& sh = *reinterpret_cast<SharedStorage*>(smem_raw + pad);
  const CtaWork w = cta_work<kPaged>(p, blockIdx.x);
  if (threadIdx.x == 0) {
    // MXFP4: every producer thread arrives (its converted rows), no TMA bytes.
    sm90::mbar_init(&sh.q_full, kFp4 ? 128 : 1);
    for (int s = 0; s < kStages; ++s) {
      sm90::mbar_init(&sh.full[s], kFp4 ? 128 : 1 + 32);
      sm90::mbar_init(&sh.empty[s], 2 * 128 * p.groups_n);  // the column lane of stage s
    }
    sm90::fence_barrier_init();
    if constexpr (!kFp4) {
      sm90::prefetch_tensor_map(&tm_q);
      sm90::prefetch_tensor_map(&tm_k);
    }
  }
  if (threadIdx.x < w.ntok) token_range<kPaged>(p, w, threadIdx.x, sh.lo[threadIdx.x], sh.hi[threadIdx.x]);
  // The weight of each CTA row (token i's head h at row i kHp + h; 0 past H and past the tokens).
  for (int r = threadIdx.x; r < kMaxRowGroups * kTileM; r += Cfg::kThreads) {
    const int tok = r / kHp, h = r % kHp;
    float wt = tok < w.ntok && h < p.heads ? p.weights[(w.row0 + tok) * p.w_stride + h] : 0.f;
    // MXFP4: the power of two the row's e4m3 conversion left out (fp4_load.cuh).
    if (kFp4 && tok < w.ntok && h < p.heads)
      wt *= token_factor(max_exponent(q_scale_word(p, w.row0 + tok, h)));
    sh.wt[r] = wt;
  }
  __syncthreads();
  if constexpr (kFp4) {
    // Each row group's weight tile for the head-sum product (run_consumer's kMmaSum; traits.h
    // wtile): k-step j, column n, k: the weight of query row 8 j + 2 (k % 4) + k / 4 (the
    // accumulator column that the tf32 A fragment's k takes) when that row is token
    // n % (128 / kHp)'s, else 0.
    for (int i = threadIdx.x; i < int(sizeof(sh.wtile) / sizeof(float)); i += Cfg::kThreads) {
      const int grp = i / 1024, j = (i / 64) % 16, cm = (i / 32) % 2, n = (i / 4) % 8, kk = i % 4;
      const int r = 8 * j + 2 * kk + cm;
      sh.wtile[grp][j][cm][n][kk] = r / kHp == n % (kBlockN / kHp) ? sh.wt[grp * kBlockN + r] : 0.f;
    }
    // The Q rows of the row groups past the CTA's tokens (the producers write none there): zero,
    // so that the product's zero weights meet finite S (stale bytes could be NaN: 0 x NaN = NaN).
    for (int i = w.ntok * kHp * kRowBytes / 16 + threadIdx.x;
         i < p.groups_n * kBlockN * kRowBytes / 16; i += Cfg::kThreads)
      reinterpret_cast<uint4*>(sh.q)[i] = make_uint4(0u, 0u, 0u, 0u);
    sm90::fence_proxy_async_smem();  // generic stores read by wgmma
    __syncthreads();
  }
  const Blocks seen = blocks_seen(sh, w);
  const int kb_lo = seen.lo, kb_hi = seen.hi, hi_max = seen.hi_max;
  if constexpr (kFp4) {
    static_assert(kPaged, "MXFP4 logits are paged only");
    if (threadIdx.x < 128) {
      sm90::regs_dealloc<Cfg::kFp4ProducerRegs>();
      run_producer_fp4<kHp>(p, sh, w, kb_lo, kb_hi, hi_max, threadIdx.x);
      clean_unseen<kPaged>(p, sh, threadIdx.x);
    } else {
      sm90::regs_alloc<Cfg::kFp4ConsumerRegs>();
      run_consumer<kPaged, kHp, kFp4>(p, sh, w, kb_lo, kb_hi, threadIdx.x / 128 - 1, threadIdx.x - 128);
    }
  } else if (threadIdx.x < 128) {
    sm90::regs_dealloc<Cfg::kProducerRegs>();
    run_producer<kPaged, kHp>(p, &tm_q, &tm_k, sh, w, kb_lo, kb_hi, hi_max, threadIdx.x / 32,
                              threadIdx.x % 32);
    clean_unseen<kPaged>(p, sh, threadIdx.x);
  } else {
    sm90::regs_alloc<Cfg::kConsumerRegs>();
    run_consumer<kPaged, kHp, kFp4>(p, sh, w, kb_lo, kb_hi, threadIdx.x / 128 - 1, threadIdx.x - 128);
  }
}

}  // namespace msa::cuda::mqa_logits_sm90
