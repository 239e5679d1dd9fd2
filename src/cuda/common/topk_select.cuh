// Device pieces of top-K block selection shared by the top-K kernel (common/topk.cu), the token
// top-K (common/token_topk.cu) and the fused indexer (sm90/block_scores): the ranking keys, the
// forced-block rule and the warp-wide writer of one ascending, -1 padded q2k row. The ranking
// matches src/cpu/topk.cpp and src/cpu/logits.cpp exactly.
#pragma once

#include <cmath>
#include <cstdint>

#include "cuda/device/status.cuh"

namespace msa::cuda {

struct SelectRule {
  int topk, sink, local;
};

// Order-preserving bits of a score + 1: larger is better, NaN -> 1 (below -inf, which maps to
// 0x00800000), never 0 (free for "not a candidate"). -0.0 takes +0.0's bits: the two are equal
// scores, so ties between them go by position too.
__device__ __forceinline__ uint32_t score_key(float s) {
  const uint32_t u = s == 0.f ? 0u : __float_as_uint(s);
  const uint32_t ord = (s != s) ? 0u : ((u & 0x80000000u) ? ~u : (u | 0x80000000u));
  return ord + 1u;
}

// Sort key: larger is better. High word: score_key, low word: ~block id (lower id wins ties).
// 0 marks "not a candidate".
__device__ __forceinline__ uint64_t rank_key(float s, int64_t kb) {
  return (uint64_t(score_key(s)) << 32) | uint32_t(~uint32_t(kb));
}
__device__ __forceinline__ int64_t key_block(uint64_t key) { return int64_t(~uint32_t(key)); }
// The score a key ranks by (score_key inverted): -0.0 comes back as +0.0, NaN as the canonical NaN.
__device__ __forceinline__ float key_score(uint64_t key) {
  const uint32_t ord = uint32_t(key >> 32) - 1u;
  if (ord == 0u) return __uint_as_float(0x7fffffffu);
  return __uint_as_float((ord & 0x80000000u) ? (ord & 0x7fffffffu) : ~ord);
}

__device__ __forceinline__ uint64_t warp_max_u64(uint64_t v) {
  for (int o = 16; o > 0; o >>= 1) {
    const uint64_t w = __shfl_xor_sync(0xffffffffu, v, o);
    v = w > v ? w : v;
  }
  return v;
}

// Forced blocks of a token with nvis visible blocks: sinks [0, nsink) and the local window
// [local_start, nvis), which excludes the sinks it overlaps.
__device__ __forceinline__ int64_t forced_sinks(const SelectRule& r, int64_t nvis) {
  return nvis < r.sink ? nvis : r.sink;
}
__device__ __forceinline__ int64_t local_start(const SelectRule& r, int64_t nvis) {
  const int64_t lo = nvis - r.local, nsink = forced_sinks(r, nvis);
  return lo > nsink ? lo : nsink;
}
__device__ __forceinline__ int forced_count(const SelectRule& r, int64_t nvis) {
  return int(forced_sinks(r, nvis) + nvis - local_start(r, nvis));
}
__device__ __forceinline__ bool is_forced(const SelectRule& r, int64_t kb, int64_t nvis) {
  return kb < r.sink || kb >= nvis - r.local;
}

// Warp-wide: writes row[0, topk) = the forced blocks and the picked blocks (keys, 0 = none;
// pick i at picks[i * stride]), ascending, -1 padded. forced + npicks <= topk <= 64.
__device__ __forceinline__ void write_q2k_row(int32_t* row, const uint64_t* picks, int npicks,
                                              int64_t nvis, const SelectRule& r, int lane,
                                              int stride = 1) {
  const int nsink = int(forced_sinks(r, nvis));
  const int64_t lo = local_start(r, nvis);
  const int nloc = int(nvis - lo);
  int64_t id[2];
#pragma unroll
  for (int u = 0; u < 2; ++u) {
    const int slot = lane + 32 * u;
    int64_t v = -1;
    if (slot < nsink) v = slot;
    else if (slot < nsink + nloc) v = lo + (slot - nsink);
    else if (slot < nsink + nloc + npicks && picks[(slot - nsink - nloc) * stride] != 0)
      v = key_block(picks[(slot - nsink - nloc) * stride]);
    id[u] = v;
  }
  // Ids are distinct, so an id's rank among the valid ids is its output slot.
  int rank[2] = {0, 0};
#pragma unroll
  for (int src = 0; src < 64; ++src) {
    const int64_t other = __shfl_sync(0xffffffffu, id[src >> 5], src & 31);
#pragma unroll
    for (int u = 0; u < 2; ++u) rank[u] += (other >= 0 && other < id[u]) ? 1 : 0;
  }
  int valid = 0;
#pragma unroll
  for (int u = 0; u < 2; ++u) valid += __popc(__ballot_sync(0xffffffffu, id[u] >= 0));
#pragma unroll
  for (int u = 0; u < 2; ++u)
    if (id[u] >= 0) row[rank[u]] = int32_t(id[u]);
  for (int k = valid + lane; k < r.topk; k += 32) row[k] = -1;
}

// Warp-wide: one row of ranked picks (keys, pick i at picks[i * stride]; npicks <= 64): ids[k]
// the block of the k-th best, scores[k] its score (key_score), then -1 / -inf up to topk.
__device__ __forceinline__ void write_ranked_row(int32_t* ids, float* scores, const uint64_t* picks,
                                                 int npicks, int topk, int lane, int stride = 1) {
  uint64_t key[2];
#pragma unroll
  for (int u = 0; u < 2; ++u) {
    const int slot = lane + 32 * u;
    key[u] = slot < npicks ? picks[slot * stride] : 0;
  }
  // Keys of distinct blocks are distinct: a key's rank is the number of keys above it.
  int rank[2] = {0, 0};
#pragma unroll
  for (int src = 0; src < 64; ++src) {
    const uint64_t other = __shfl_sync(0xffffffffu, key[src >> 5], src & 31);
#pragma unroll
    for (int u = 0; u < 2; ++u) rank[u] += other > key[u] ? 1 : 0;
  }
#pragma unroll
  for (int u = 0; u < 2; ++u)
    if (key[u] != 0) {
      ids[rank[u]] = int32_t(key_block(key[u]));
      scores[rank[u]] = key_score(key[u]);
    }
  for (int k = npicks + lane; k < topk; k += 32) {
    ids[k] = -1;
    scores[k] = -INFINITY;
  }
}

}  // namespace msa::cuda
