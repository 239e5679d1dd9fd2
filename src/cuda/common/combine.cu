// Kernel of the sparse-attention combine (combine.cuh). One unit = (token, kv head): G x kSeg
// threads, each owning kVec consecutive head-dim elements of one query head (8 at D = 32, 64 and
// 128, 16 at 256: combine_vec), so a unit reads its topk x G x D partial values as contiguous 16-byte
// loads.
#include <algorithm>
#include <climits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/common/combine.cuh"
#include "cuda/common/index_checks.cuh"
#include "cuda/device/check.h"

namespace msa::cuda {
namespace {

constexpr int kThreads = 256;
// Elements per thread at head dim kD: a query head is then kD / kVec <= 16 threads, so a unit of
// G <= 16 heads fits a block.
template <int kD>
constexpr int combine_vec = kD == 256 ? 16 : 8;
constexpr int kBatch = 4;  // bf16 partial rows loaded together per thread
constexpr int64_t kMaxBlocks = 132 * 8 * 8;  // 8 waves of 8 resident blocks per SM on an H200

// f32 partial values [d0, d0 + kVec) of a row.
template <int kD, int kVec = combine_vec<kD>>
__device__ __forceinline__ void load_partial(const CombineParams& p, int64_t row, int d0,
                                             float (&x)[kVec]) {
  const auto* src = reinterpret_cast<const float4*>(static_cast<const float*>(p.part_o) +
                                                    row * kD + d0);
#pragma unroll
  for (int i = 0; i < kVec / 4; ++i) {
    const float4 a = src[i];
    x[4 * i] = a.x; x[4 * i + 1] = a.y; x[4 * i + 2] = a.z; x[4 * i + 3] = a.w;
  }
}

// log sum_s exp(v_s) over the valid slots, in fixed slot order; -inf when none is finite.
__device__ __forceinline__ float merge_lse(const float* v, const int32_t* ids, int topk,
                                          int64_t nblk, int group) {
  float m = -INFINITY;
  for (int s = 0; s < topk; ++s)
    if (ids[s] >= 0 && ids[s] < nblk) m = fmaxf(m, v[int64_t(s) * group]);
  if (m == -INFINITY) return m;
  float sum = 0.f;
  for (int s = 0; s < topk; ++s)
    if (ids[s] >= 0 && ids[s] < nblk) sum += expf(v[int64_t(s) * group] - m);
  return m + logf(sum);
}

// One unit = (token t of batch b, kv head h), nblk = batch b's key blocks. The kSeg = kD / kVec
// threads of one query head (16 at D = 128, 8 at 64) form an aligned warp segment: lane d of the
// segment reads the id and LSE of slots d, d + kSeg, ... (one round of parallel loads per kSeg
// slots instead of a chain of one dependent load per slot), the max comes from segment shuffles,
// and each slot's weight is broadcast from the lane that computed it. Sums still run in slot order
// over the same slots, so the result is bit for bit that of a per-thread loop.
template <int kD>
constexpr int combine_seg = kD / combine_vec<kD>;

// g: the query head in the group, d: the thread's place in the head's segment.
template <bool kF16, int kD>
__device__ __forceinline__ void combine_unit(const CombineParams& p, int64_t t, int64_t h,
                                             int64_t nblk, int g, int d) {
  constexpr int kSeg = combine_seg<kD>, kVec = combine_vec<kD>, kV8 = kVec / 8;
  constexpr unsigned kSegMask = (1u << kSeg) - 1;
  const int d0 = d * kVec;
  const unsigned seg_shift = threadIdx.x & (32 - kSeg), seg = kSegMask << seg_shift;
  const int64_t base = (h * p.total_q + t) * p.topk;  // first slot of (h, t)
  const int32_t* ids = p.q2k + base;
  const float* lse_g = p.part_lse + base * p.group + g;
  const float* rl_g = p.part_rl + base * p.group + g;

  float m = -INFINITY;
  for (int s0 = 0; s0 < p.topk; s0 += kSeg) {
    const int s = s0 + d;
    const int32_t id = s < p.topk ? ids[s] : -1;
    const float l = s < p.topk ? lse_g[int64_t(s) * p.group] : -INFINITY;
    if (id >= 0 && id < nblk) m = fmaxf(m, l);
  }
#pragma unroll
  for (int o = kSeg / 2; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(seg, m, o, kSeg));
  float acc[kVec] = {};
  float sum = 0.f;
  for (int s0 = 0; m != -INFINITY && s0 < p.topk; s0 += kSeg) {
    const int s = s0 + d;
    const int32_t id = s < p.topk ? ids[s] : -1;
    const bool ok = id >= 0 && id < nblk;
    // exp(-inf - m) = 0 for a slot whose block held no visible key: its O partial is 0.
    const float w_mine = ok ? expf(lse_g[int64_t(s) * p.group] - m) : 0.f;
    const float wo_mine = ok ? w_mine * rl_g[int64_t(s) * p.group] : 0.f;  // of the unnormalised O
    const unsigned valid = (__ballot_sync(seg, ok) >> seg_shift) & kSegMask;  // same in the segment
    const int n = min(kSeg, p.topk - s0);
    if (p.part_bf16) {
      // kBatch slots' 16-byte loads in flight per thread.
      for (int u0 = 0; u0 < n; u0 += kBatch) {
        uint4 raw[kBatch][kV8];
#pragma unroll
        for (int u = 0; u < kBatch; ++u)
#pragma unroll
          for (int v = 0; v < kV8; ++v)
            raw[u][v] = (valid >> (u0 + u)) & 1u
                            ? *reinterpret_cast<const uint4*>(
                                  static_cast<const __nv_bfloat16*>(p.part_o) +
                                  ((base + s0 + u0 + u) * p.group + g) * kD + d0 + 8 * v)
                            : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          const float w = __shfl_sync(seg, w_mine, u0 + u, kSeg);
          const float wo = __shfl_sync(seg, wo_mine, u0 + u, kSeg);
          if (!((valid >> (u0 + u)) & 1u)) continue;
          sum += w;
#pragma unroll
          for (int v = 0; v < kV8; ++v) {
            const auto* h2 = reinterpret_cast<const __nv_bfloat162*>(&raw[u][v]);
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const float2 f = __bfloat1622float2(h2[i]);
              acc[8 * v + 2 * i] = fmaf(wo, f.x, acc[8 * v + 2 * i]);
              acc[8 * v + 2 * i + 1] = fmaf(wo, f.y, acc[8 * v + 2 * i + 1]);
            }
          }
        }
      }
    } else {
      for (int u = 0; u < n; ++u) {
        const float w = __shfl_sync(seg, w_mine, u, kSeg);
        const float wo = __shfl_sync(seg, wo_mine, u, kSeg);
        if (!((valid >> u) & 1u)) continue;
        float x[kVec];
        load_partial<kD>(p, (base + s0 + u) * p.group + g, d0, x);
        sum += w;
#pragma unroll
        for (int i = 0; i < kVec; ++i) acc[i] = fmaf(wo, x[i], acc[i]);
      }
    }
  }
  const float inv = sum > 0.f ? 1.f / sum : 0.f;
  const int64_t hq = h * p.group + g;
  using T = std::conditional_t<kF16, __half, __nv_bfloat16>;
  T* dst = static_cast<T*>(p.out) + t * p.out_stride_t + hq * p.out_stride_h + d0;
#pragma unroll
  for (int v = 0; v < kV8; ++v) {
    uint4 packed;
    auto* pk = reinterpret_cast<uint32_t*>(&packed);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float a = acc[8 * v + 2 * i] * inv, b = acc[8 * v + 2 * i + 1] * inv;
      if constexpr (kF16) {
        const __half2 x = __floats2half2_rn(a, b);
        pk[i] = *reinterpret_cast<const uint32_t*>(&x);
      } else {
        const __nv_bfloat162 x = __floats2bfloat162_rn(a, b);
        pk[i] = *reinterpret_cast<const uint32_t*>(&x);
      }
    }
    *reinterpret_cast<uint4*>(dst + 8 * v) = packed;
  }
  if (d0 != 0) return;
  if (p.lse) p.lse[hq * p.total_q + t] = m == -INFINITY ? m : m + logf(sum);
  if (p.tlse)
    p.tlse[hq * p.total_q + t] =
        merge_lse(p.part_tlse + base * p.group + g, ids, p.topk, nblk, p.group);
}


// Work tiles of kTileTokens tokens of one (kv head, query block) pair, grid-stride: a pair the
// uniform path wrote (every pair under block-uniform selections) costs one flag test per tile,
// and the batch lookup is done once per tile instead of once per unit. Query blocks of 64, 128 or
// 512 tokens: 4, 8 or 32 tiles.
constexpr int kTileTokens = 16;
constexpr int kTileShift = 4;
static_assert(kTileTokens == 1 << kTileShift, "tiles of 2^kTileShift tokens");

// 4 blocks an SM (64 registers); at D = 256 (16 values and kBatch x 2 loads in flight a thread) 2.
template <int kD>
constexpr int combine_blocks_per_sm = kD == 256 ? 2 : 4;
template <bool kF16, int kD>
__global__ void __launch_bounds__(kThreads, combine_blocks_per_sm<kD>)
    combine_kernel(const CombineParams p) {
  constexpr int kSeg = combine_seg<kD>;
  // A unit's heads in rounds of at most kThreads / kSeg: one round for sparse calls (G <= 16),
  // several for dense calls without keys (G up to 64 after dense_kv_split), whose rows are zeros.
  const int round_heads = min(p.group, kThreads / kSeg);
  const int per_unit = round_heads * kSeg;
  const int units_per_block = kThreads / per_unit;
  if (threadIdx.x >= units_per_block * per_unit) return;
  // 32-bit tile state (tiles, tokens and blocks fit int32; checked on the host) keeps the
  // kernel at 64 registers, 4 blocks per SM.
  const int32_t tile_shift = p.qblock_shift - kTileShift;  // tiles per query block: 2^tile_shift
  const int32_t tiles = int32_t(p.num_kv_heads * p.qblock_cap) << tile_shift;
  const int32_t qblocks = p.qblock_start[p.batch], qcap = int32_t(p.qblock_cap);
  for (int32_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int32_t pair = tile >> tile_shift, sub = tile & ((1 << tile_shift) - 1);
    const int32_t h = pair / qcap, qblock = pair % qcap;
    if (qblock >= qblocks || p.uniform[pair]) continue;
    const int32_t b = int32_t(last_le(p.qblock_start, p.batch, qblock));
    const int32_t q_start = p.cu_seqlens_q[b], lq = p.cu_seqlens_q[b + 1] - q_start;
    const int32_t lk = p.cu_seqlens_k[b + 1] - p.cu_seqlens_k[b];
    const int32_t nblk = lk > 0 ? (lk - 1) / p.kv_block_size + 1 : 0;
    const int32_t lo = ((qblock - p.qblock_start[b]) << p.qblock_shift) + sub * kTileTokens;
    // Rows past total_q only come from a broken cu_seqlens_q (reported by the checks): skipped,
    // never written out of bounds.
    const int32_t hi = min(min(lq, lo + kTileTokens), int32_t(p.total_q) - q_start);
    if (q_start < 0) continue;
    const int li = int(threadIdx.x) % per_unit;
    for (int32_t tl = lo + int32_t(threadIdx.x) / per_unit; tl < hi; tl += units_per_block)
      for (int g = li / kSeg; g < p.group; g += round_heads)
        combine_unit<kF16, kD>(p, q_start + tl, h, nblk, g, li % kSeg);
  }
}

}  // namespace

void launch_sparse_combine(const CombineParams& p, bool out_f16, cudaStream_t stream) {
  if (p.total_q * p.num_kv_heads == 0 || p.batch == 0) return;
  // D = 32: dense calls only (no partials), whose zero rows it writes when no key exists.
  MSA_CHECK(p.head_dim == 128 || p.head_dim == 64 || p.head_dim == 256 || p.head_dim == 32,
            "attention_forward: the CUDA combine merges partials of head dim 32, 64, 128 or 256, "
            "got ", p.head_dim);
  const int64_t tiles = (p.num_kv_heads * p.qblock_cap) << (p.qblock_shift - kTileShift);
  MSA_CHECK(tiles < INT32_MAX, "attention_forward: Hkv * query blocks = ",
            p.num_kv_heads * p.qblock_cap, " is too large for the CUDA combine");
  const int64_t blocks = std::min<int64_t>(tiles, kMaxBlocks);
  // A normal launch: with programmatic serialization (pdl.cuh) the prefill measured 50-250 us
  // slower (P8K-tok, P32K-tok on the H200), the combine's waiting CTAs holding SMs.
  // A query head's threads: 4 at D = 32, 8 at 64, 16 at 128 and 256 (combine_vec).
  const unsigned grid = unsigned(blocks);
  if (p.head_dim == 32 && out_f16) combine_kernel<true, 32><<<grid, kThreads, 0, stream>>>(p);
  else if (p.head_dim == 32) combine_kernel<false, 32><<<grid, kThreads, 0, stream>>>(p);
  else if (p.head_dim == 64 && out_f16) combine_kernel<true, 64><<<grid, kThreads, 0, stream>>>(p);
  else if (p.head_dim == 64) combine_kernel<false, 64><<<grid, kThreads, 0, stream>>>(p);
  else if (p.head_dim == 256 && out_f16) combine_kernel<true, 256><<<grid, kThreads, 0, stream>>>(p);
  else if (p.head_dim == 256) combine_kernel<false, 256><<<grid, kThreads, 0, stream>>>(p);
  else if (out_f16) combine_kernel<true, 128><<<grid, kThreads, 0, stream>>>(p);
  else combine_kernel<false, 128><<<grid, kThreads, 0, stream>>>(p);
  MSA_CUDA_CHECK_LAUNCH();
}

}  // namespace msa::cuda
