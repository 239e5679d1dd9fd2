// CUDA top-K block selection from materialized block scores (docs/semantics.md, Top-K selection),
// giving the same ids as the CPU reference (src/cpu/topk.cpp): forced sink and local blocks, then
// the highest group scores (NaN below every number), ties toward the lower block id, rows
// ascending, -1 padded.
//
// One CTA per (kv head, 32 consecutive tokens). Group scores of a chunk of up to kChunk blocks
// are gathered into shared memory with coalesced reads (scores is [Hq, nblk_max, total_q], tokens
// innermost), then each warp selects for 4 of the tokens by repeated warp arg-max over 64-bit
// keys. Sequences longer than one chunk carry the best picks so far into the next chunk, which
// keeps the selection exact for any length. Also the selection of the pipeline's dense case
// (every visible block), written without scores.
#include <cuda_runtime.h>

#include <cstdint>

#include "backend.h"
#include "cuda/common/index_checks.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/common/topk_select.cuh"
#include "cuda/device/check.h"
#include "cuda/device/smem_limit.h"

namespace msa::cuda {
namespace {

constexpr int kTokens = 32;          // tokens per CTA (one per lane)
constexpr int kWarps = 8;
constexpr int kChunk = 1024;         // blocks of group scores held in shared memory at once
constexpr int kPitch = kTokens + 1;  // padded row: lanes reading one token's column hit 32 banks
constexpr int kMaxTopK = 64;
constexpr int kSmallBlocks = 256;    // the register path's bound (select_small)
constexpr int kSmallPerLane = kSmallBlocks / 32;
constexpr int kGather = 8;           // score rows a warp has in flight while gathering

struct TopKParams {
  const float* scores;         // [Hq, nblk_max, total_q] contiguous
  int32_t* q2k;                // [Hkv, total_q, topk] contiguous
  const int32_t* cu_seqlens_q; // [B+1]
  KeyLengths keys;
  int32_t* status;             // int32[4]
  SelectRule rule;
  int64_t total_q, nblk_max, batch;
  int group, topk, blk;
  bool causal;
};

// Shared memory of a kernel whose chunks hold up to kChunkBlocks blocks: kChunk, or kSmallBlocks
// when no request has more (then 4 CTAs fit an SM instead of 1).
template <int kChunkBlocks>
struct TopKSmem {
  float gs[kChunkBlocks * kPitch];             // group scores [block in chunk][token]
  uint32_t picked[kTokens][kChunkBlocks / 32]; // chunk blocks already taken in this pass
  uint64_t best[kTokens][kMaxTopK];           // best picks of earlier chunks (keys)
  uint64_t next[kWarps][kMaxTopK];            // picks of the running pass, per warp
  int32_t nvis[kTokens];
};

// Visible block count of token t (-1 for lanes past total_q).
__device__ int64_t visible_blocks(const TopKParams& p, int64_t t) {
  if (t >= p.total_q || p.batch <= 0) return -1;
  const int64_t b = find_batch(p.cu_seqlens_q, p.batch, t);
  const int64_t q0 = p.cu_seqlens_q[b], lq = int64_t(p.cu_seqlens_q[b + 1]) - q0;
  if (t < q0 || t - q0 >= lq) {
    flag_status(p.status, int32_t(StatusCode::bad_cu_seqlens), 0, b, 0);
    return 0;
  }
  const int64_t lk = batch_keys(p.keys, b);
  int64_t end = p.causal ? t - q0 + lk - lq + 1 : lk;
  end = end < 0 ? 0 : (end > lk ? lk : end);
  int64_t nvis = (end + p.blk - 1) / p.blk;
  if (nvis > p.nblk_max) {
    flag_status(p.status, int32_t(StatusCode::shape_mismatch), t, nvis, p.nblk_max);
    nvis = p.nblk_max;
  }
  return nvis;
}

// One pass over a chunk for token `tok` (warp-cooperative): choose the `want` best among the
// chunk's non-forced visible blocks and the carried best picks; leaves them in s.best[tok].
template <typename Smem>
__device__ void select_in_chunk(Smem& s, const TopKParams& p, int tok, int64_t c0, int64_t clen,
                                int64_t nvis, int want, int carried, int lane, int warp) {
  for (int w = lane; w < int(sizeof(s.picked[0]) / 4); w += 32) s.picked[tok][w] = 0;
  uint64_t carried_mask = 0;  // bit i: carried pick i already taken this pass
  __syncwarp();
  for (int i = 0; i < want; ++i) {
    uint64_t mine = 0;
    for (int64_t j = lane; j < clen; j += 32) {
      const int64_t kb = c0 + j;
      if (kb >= nvis || is_forced(p.rule, kb, nvis) || (s.picked[tok][j >> 5] >> (j & 31) & 1u)) continue;
      const uint64_t k = rank_key(s.gs[j * kPitch + tok], kb);
      mine = k > mine ? k : mine;
    }
    for (int j = lane; j < carried; j += 32)
      if (!(carried_mask >> j & 1ull)) mine = s.best[tok][j] > mine ? s.best[tok][j] : mine;
    const uint64_t top = warp_max_u64(mine);
    if (top == 0) {  // fewer candidates than wanted
      if (lane == 0) s.next[warp][i] = 0;
      continue;
    }
    const int64_t kb = key_block(top);
    for (int j = 0; j < carried; ++j)
      if (s.best[tok][j] == top) carried_mask |= 1ull << j;
    if (kb >= c0 && kb < c0 + clen && lane == 0) s.picked[tok][(kb - c0) >> 5] |= 1u << ((kb - c0) & 31);
    if (lane == 0) s.next[warp][i] = top;
    __syncwarp();
  }
  __syncwarp();
  for (int i = lane; i < want; i += 32) s.best[tok][i] = s.next[warp][i];
  __syncwarp();
}

// Tokens whose CTA sees at most kSmallBlocks blocks (32K keys of 128) skip the chunk machinery:
// each lane keeps the keys of its kSmallBlocks / 32 candidates in registers, sorted best first
// once (a 19-comparator network), and each pick is two warp reductions (`redux.sync` max of the
// lanes' first high words, then of the low words, ~block id, among the lanes that hold that
// high word: the lowest id of the best score) and a shift of the winning lane's list. The picks
// are those of select_in_chunk (keys are distinct, and a lane's first key is its best, ties
// included). The previous form, a 64-bit warp max by 5 shuffle rounds and a compare-and-clear of
// all 8 keys a pick (~95 ALU instructions), left the kernel ALU-bound (ncu: math-pipe stalls 29%
// of samples); IDX-32K-M3-fp8's select_topk (4 lists of <= 256 blocks per token) is this path.
__device__ __forceinline__ void order_desc(uint64_t& a, uint64_t& b) {
  const uint64_t x = a > b ? a : b, y = a > b ? b : a;
  a = x;
  b = y;
}

template <typename Smem>
__device__ void select_small(Smem& s, const TopKParams& p, int tok, int64_t clen, int64_t nvis,
                             int want, int lane) {
  static_assert(kSmallPerLane == 8, "select_small: the sorting network is for 8 keys a lane");
  uint64_t k[kSmallPerLane];
#pragma unroll
  for (int u = 0; u < kSmallPerLane; ++u) {
    const int64_t kb = lane + 32 * u;
    k[u] = kb < clen && kb < nvis && !is_forced(p.rule, kb, nvis)
               ? rank_key(s.gs[kb * kPitch + tok], kb)
               : 0;
  }
  // Batcher's odd-even merge sort of 8, descending.
  constexpr int kNet[19][2] = {{0, 1}, {2, 3}, {4, 5}, {6, 7}, {0, 2}, {1, 3}, {4, 6},
                               {5, 7}, {1, 2}, {5, 6}, {0, 4}, {1, 5}, {2, 6}, {3, 7},
                               {2, 4}, {3, 5}, {1, 2}, {3, 4}, {5, 6}};
#pragma unroll
  for (int c = 0; c < 19; ++c) order_desc(k[kNet[c][0]], k[kNet[c][1]]);
  for (int i = 0; i < want; ++i) {
    const uint32_t hi = uint32_t(k[0] >> 32), lo = uint32_t(k[0]);
    const uint32_t top_hi = __reduce_max_sync(0xffffffffu, hi);
    const uint32_t top_lo = __reduce_max_sync(0xffffffffu, hi == top_hi ? lo : 0u);
    // One lane holds the winner (0 when fewer candidates than wanted: popping zeros is harmless).
    const bool win = hi == top_hi && lo == top_lo;
#pragma unroll
    for (int u = 0; u + 1 < kSmallPerLane; ++u) k[u] = win ? k[u + 1] : k[u];
    if (win) k[kSmallPerLane - 1] = 0;
    if (lane == 0) s.best[tok][i] = (uint64_t(top_hi) << 32) | top_lo;
  }
  __syncwarp();
}

template <int kChunkBlocks>
__global__ void __launch_bounds__(kWarps * 32) topk_kernel(TopKParams p) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  auto& s = *reinterpret_cast<TopKSmem<kChunkBlocks>*>(smem_raw);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t h = blockIdx.y, t0 = int64_t(blockIdx.x) * kTokens;
  if (threadIdx.x < kTokens) s.nvis[threadIdx.x] = int32_t(visible_blocks(p, t0 + threadIdx.x));
  __syncthreads();
  // The most visible blocks of the CTA's tokens: one warp reduction (a loop over the 32 tokens
  // in 64-bit took ~10% of the kernel's warp samples at IDX-32K-M3-fp8).
  static_assert(kTokens == 32, "topk_kernel: a token per lane");
  const int64_t chunk_end = int64_t(__reduce_max_sync(0xffffffffu, unsigned(max(s.nvis[lane], 0))));

  int carried[kTokens / kWarps] = {};
  for (int64_t c0 = 0; c0 < chunk_end; c0 += kChunkBlocks) {
    const int64_t clen = chunk_end - c0 < kChunkBlocks ? chunk_end - c0 : kChunkBlocks;
    // Gather group scores: rows (block) split across warps, tokens across lanes (coalesced).
    // One head a list (the serving geometry's index heads): kGather rows of a warp in flight
    // (one row at a time, each load's latency and its 64-bit index arithmetic stood alone: 21%
    // of the kernel's warp samples at IDX-32K-M3-fp8). With G heads a list the
    // head loop already keeps loads in flight, and the batched form was slower (IDX-32K-fp8's
    // select_topk 0.628 -> 0.660 ms).
    const int64_t t = t0 + lane;
    if (p.group == 1) {
      const bool live = t < p.total_q;
      const int64_t row = p.total_q;
      const float* col = p.scores + (h * p.nblk_max + c0) * p.total_q + (live ? t : 0);
      for (int64_t j = warp; j < clen; j += kWarps * kGather) {
        float m[kGather];
#pragma unroll
        for (int u = 0; u < kGather; ++u)
          m[u] = live && j + u * kWarps < clen ? col[(j + u * kWarps) * row]
                                               : __int_as_float(0x7fc00000);
#pragma unroll
        for (int u = 0; u < kGather; ++u)
          if (j + u * kWarps < clen) s.gs[(j + u * kWarps) * kPitch + lane] = m[u];
      }
    } else {
      for (int64_t j = warp; j < clen; j += kWarps) {
        float m = __int_as_float(0x7fc00000);
        if (t < p.total_q)
          for (int g = 0; g < p.group; ++g)
            m = fmaxf(m, p.scores[((h * p.group + g) * p.nblk_max + c0 + j) * p.total_q + t]);
        s.gs[j * kPitch + lane] = m;
      }
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < kTokens / kWarps; ++r) {
      const int tok = warp + r * kWarps;
      const int64_t nvis = s.nvis[tok];
      if (nvis <= 0) continue;
      const int want = p.topk - forced_count(p.rule, nvis);
      if (want <= 0 || c0 >= nvis) continue;
      if (chunk_end <= kSmallBlocks) select_small(s, p, tok, clen, nvis, want, lane);
      else select_in_chunk(s, p, tok, c0, clen, nvis, want, carried[r], lane, warp);
      carried[r] = want;
    }
    __syncthreads();
  }
#pragma unroll
  for (int r = 0; r < kTokens / kWarps; ++r) {
    const int tok = warp + r * kWarps;
    const int64_t t = t0 + tok;
    if (t >= p.total_q) continue;
    const int64_t nvis = s.nvis[tok] < 0 ? 0 : s.nvis[tok];
    write_q2k_row(p.q2k + (h * p.total_q + t) * p.topk, s.best[tok], carried[r], nvis, p.rule, lane);
  }
}

// Every visible block of token t, ascending, -1 padded: the selection when top-K covers them all
// (nblk_max = topk, so a length past what the caller's shapes allow is reported, never written).
// A thread per (token, 4 slots): consecutive threads write consecutive 16 bytes of a head's rows
// (with kVec, int4 stores; a thread per token writing its rows one id at a time scattered 4-byte
// stores 4 * topk bytes apart across the warp). Launched with PDL, it lets the next kernel of the
// stream (the dense attention's prep in the pipeline) launch at once; that one waits for it.
template <bool kVec>
__global__ void every_visible_kernel(TopKParams p, int64_t heads) {
  pdl_wait();
  pdl_trigger();
  const int quads = (p.topk + 3) / 4;
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t t = i / quads;
  if (t >= p.total_q) return;
  const int k0 = int(i - t * quads) * 4;
  const int64_t nvis = visible_blocks(p, t);
  int ids[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) ids[j] = k0 + j < nvis ? k0 + j : -1;
  for (int64_t h = 0; h < heads; ++h) {
    int32_t* row = p.q2k + (h * p.total_q + t) * p.topk + k0;
    if constexpr (kVec) {
      *reinterpret_cast<int4*>(row) = make_int4(ids[0], ids[1], ids[2], ids[3]);
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j)
        if (k0 + j < p.topk) row[j] = ids[j];
    }
  }
}

// Key lengths of a flat cache or a page pool, as the kernels read them.
KeyLengths key_lengths(const KVCache& kv, const ProblemShape& s) {
  KeyLengths k;
  if (kv.layout == KVLayout::flat) {
    k.cu_seqlens_k = kv.cu_seqlens_k.ptr<int32_t>();
  } else {
    k.seqused_k = kv.seqused_k.defined() ? kv.seqused_k.ptr<int32_t>() : nullptr;
    k.max_keys = s.max_pages * s.page_size;
  }
  return k;
}

}  // namespace

void select_every_visible(const BlockTopKArgs& a, const ProblemShape& s, cudaStream_t stream) {
  check_indexer_supported(a, s);
  if (s.total_q == 0 || a.q2k.shape[0] == 0) return;
  TopKParams p{};
  p.q2k = a.q2k.ptr<int32_t>();
  p.cu_seqlens_q = a.cu_seqlens_q.ptr<int32_t>();
  p.keys = key_lengths(a.kv, s);
  p.status = a.status.ptr<int32_t>();
  p.total_q = s.total_q;
  p.nblk_max = a.topk;
  p.batch = s.batch;
  p.topk = a.topk;
  p.blk = a.kv_block_size;
  p.causal = a.causal;
  constexpr int kThreads = 256;
  const int64_t threads = s.total_q * ((a.topk + 3) / 4);
  const unsigned blocks = unsigned((threads + kThreads - 1) / kThreads);
  const bool vec = a.topk % 4 == 0 && reinterpret_cast<uintptr_t>(p.q2k) % 16 == 0;
  if (vec) launch_pdl(every_visible_kernel<true>, blocks, kThreads, 0, stream, p, a.q2k.shape[0]);
  else launch_pdl(every_visible_kernel<false>, blocks, kThreads, 0, stream, p, a.q2k.shape[0]);
}

void select_topk(const TopKArgs& a, const ProblemShape& s, cudaStream_t stream) {
  MSA_CHECK(a.topk <= kMaxTopK, "topk: at most ", kMaxTopK, " on CUDA, got ", a.topk);
  MSA_CHECK(s.group <= 16, "select_topk: GQA group Hq/Hkv must be at most 16 on CUDA, got ",
            s.group);
  if (s.total_q == 0 || s.num_kv_heads == 0) return;
  TopKParams p{};
  p.scores = a.scores.ptr<float>();
  p.q2k = a.q2k.ptr<int32_t>();
  p.cu_seqlens_q = a.cu_seqlens_q.ptr<int32_t>();
  p.keys = key_lengths(a.kv, s);
  p.status = a.status.ptr<int32_t>();
  p.total_q = s.total_q;
  p.nblk_max = a.scores.shape[1];
  p.batch = s.batch;
  p.group = int(s.group);
  p.topk = a.topk;
  p.rule = SelectRule{a.topk, a.sink_blocks, a.local_blocks};
  p.blk = a.kv_block_size;
  p.causal = a.causal;
  // Scores of at most kSmallBlocks blocks (nblk_max bounds every token's): the small-chunk
  // kernel, whose 54 KB let 4 CTAs share an SM (the 1024-block chunks take 155 KB, one CTA).
  const bool small = p.nblk_max <= kSmallBlocks;
  const size_t smem = small ? sizeof(TopKSmem<kSmallBlocks>) : sizeof(TopKSmem<kChunk>);
  auto* kernel = small ? topk_kernel<kSmallBlocks> : topk_kernel<kChunk>;
  allow_dynamic_smem(kernel, smem, "select_topk");
  const dim3 grid(unsigned((s.total_q + kTokens - 1) / kTokens), unsigned(s.num_kv_heads));
  kernel<<<grid, kWarps * 32, smem, stream>>>(p);
  MSA_CUDA_CHECK_LAUNCH();
}

}  // namespace msa::cuda
