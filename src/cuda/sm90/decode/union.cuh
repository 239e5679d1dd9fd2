// Sparse decode: the union of the blocks that a CTA's queries select through one kv head, built
// in shared memory at the start of every CTA (so run() accepts a new q2k without a new plan).
// A bitmap over the request's blocks gives the union in ascending block order; this item's
// entries [e0, e1) get their block id and a mask of the queries (bit qi) that selected them.
// q2k ids are checked on the way (out of range, repeated within a row). With token ids
// (kv_block_size 1) a block is one key: the bitmap has a bit per key of the request, rows may come
// in any order, and every CTA has one query (plan.cpp). Used by kernel.cuh.
#pragma once

#include <cstdint>

#include "cuda/sm90/decode/params.h"
#include "cuda/sm90/decode/status.cuh"
#include "cuda/sm90/decode/traits.h"

namespace msa::cuda::decode {

struct UnionSmem {
  int* ids;          // [kMaxItemEntries] block id of entry e0 + i
  uint32_t* masks;   // [kMaxItemEntries] queries (bit qi) that selected entry e0 + i
  int* pages;        // [kMaxItemEntries] page of entry e0 + i (8 warps only: union_has_pages)
  uint32_t* bitmap;  // [bitmap_words] blocks selected by any query of the CTA
  int* prefix;       // [bitmap_words] union rank of each word's first bit
  int* scan;         // [warps] per-warp totals of the rank scan (64 slots)
};

// 8-warp CTAs (one wave, prologue on the critical path) keep a page per entry; 4-warp CTAs, whose
// prologues overlap a co-resident CTA's streaming, do not (traits.h sizes both).
template <int kW>
__device__ __forceinline__ UnionSmem union_smem(void* base, int bitmap_words) {
  UnionSmem u;
  u.ids = static_cast<int*>(base);
  u.masks = reinterpret_cast<uint32_t*>(u.ids + kMaxItemEntries);
  u.pages = kW == 8 ? reinterpret_cast<int*>(u.masks + kMaxItemEntries) : nullptr;
  u.bitmap = kW == 8 ? reinterpret_cast<uint32_t*>(u.pages + kMaxItemEntries)
                     : u.masks + kMaxItemEntries;
  u.prefix = reinterpret_cast<int*>(u.bitmap + bitmap_words);
  u.scan = u.prefix + bitmap_words;
  return u;
}

// Index in p.page_table of the entry of the first key of block `id` of request b.
__device__ __forceinline__ int64_t block_page_index(const DecodeParams& p, int b, int id) {
  return int64_t(b) * p.page_table_stride + ((int64_t(id) << p.block_shift) >> p.page_shift);
}

// Starts the page-table line of block `id` of request b towards L2 as soon as the id is known, so
// that the producer's first lookups (load.cuh), which wait for the union, find it there: one
// dependent DRAM round trip less before the first K/V byte. A block's entries are consecutive and
// lie in one 128-byte line (blk / page_size <= 32 entries starting at a multiple of that count).
__device__ __forceinline__ void prefetch_block_pages(const DecodeParams& p, int b, int id) {
  sm90::prefetch_l2(p.page_table + block_page_index(p, b, id));
}

// First slot of q2k row `row` whose (in-range) id repeats an earlier slot's; -1 if none.
__device__ __forceinline__ int first_repeat(const int32_t* ids, int topk, int nblk) {
  for (int s = 1; s < topk; ++s) {
    const int32_t id = ids[s];
    if (id < 0 || id >= nblk) continue;
    for (int r = 0; r < s; ++r)
      if (ids[r] == id) return s;
  }
  return -1;
}

// Whether build_union takes the one-query path below, and whether that path fills u.pages: in
// 8-warp CTAs when every block lies in one page (page_size >= kv_block_size).
__device__ __forceinline__ bool one_query_union(const DecodeParams& p, int nq) {
  return nq == 1 && p.topk <= 64;
}
template <int kW>
__device__ __forceinline__ bool union_has_pages(const DecodeParams& p, int nq) {
  return kW == 8 && one_query_union(p, nq) && p.page_shift >= p.block_shift;
}

// The union of one query's q2k row (topk <= 64) by warp 0 alone: the row's distinct valid ids in
// ascending order, each ranked by counting the smaller distinct ids (shuffles), instead of the
// bitmap, its scan and their five CTA barriers. The same entries, masks (bit 0) and reports as the
// general path; with_pages (union_has_pages): each entry's page id in u.pages, read while the
// ranks are counted, else the page-table lines are prefetched. Returns the union size. Ends with
// __syncthreads.
__device__ __forceinline__ int build_union_one(const DecodeParams& p, const UnionSmem& u, int b,
                                               int h, int64_t t0, int lk, int e0, int e1,
                                               bool with_pages) {
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x, topk = p.topk;
    const int nblk = lk > 0 ? ((lk - 1) >> p.block_shift) + 1 : 0;
    const int64_t row_at = (int64_t(h) * p.total_q + t0) * topk;
    int32_t id[2], page[2] = {0, 0};
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const int s = lane + 32 * k;
      id[k] = s < topk ? p.q2k[row_at + s] : -1;
      if (id[k] < -1 || id[k] >= nblk) {
        report(p, Offence::q2k, uint64_t(row_at + s), StatusCode::block_id_out_of_range);
        id[k] = -1;
      }
      // The page of a one-page block is read now, under the ranking below, and handed to the
      // producer through u.pages; a block over several pages gets its line prefetched.
      if (id[k] >= 0) {
        if (with_pages)
          page[k] = p.page_table[block_page_index(p, b, id[k])];
        else
          prefetch_block_pages(p, b, id[k]);
      }
    }
    // A valid id is its row's first copy unless an earlier slot holds it. Rank: the distinct
    // valid ids below it (unsigned compares: -1 is never below an id). Up to 32 ids (topk <= 32,
    // the usual case) take a match and one unrolled pass of independent shuffles.
    bool first[2];
    int rank[2] = {0, 0};
    if (topk <= 32) {
      const unsigned same = __match_any_sync(0xffffffffu, id[0]);
      first[0] = id[0] >= 0 && (same & ((1u << lane) - 1u)) == 0u;
      first[1] = false;
      const int mine = first[0] ? id[0] : -1;
#pragma unroll
      for (int s = 0; s < 32; ++s)
        rank[0] += uint32_t(__shfl_sync(0xffffffffu, mine, s)) < uint32_t(id[0]) ? 1 : 0;
    } else {
      first[0] = id[0] >= 0;
      first[1] = id[1] >= 0;
      for (int s = 0; s < topk; ++s) {
        const int y = __shfl_sync(0xffffffffu, s < 32 ? id[0] : id[1], s & 31);
#pragma unroll
        for (int k = 0; k < 2; ++k)
          if (y == id[k] && s < lane + 32 * k) first[k] = false;
      }
      for (int s = 0; s < topk; ++s) {
        const int y = __shfl_sync(0xffffffffu, s < 32 ? (first[0] ? id[0] : -1) : (first[1] ? id[1] : -1),
                                  s & 31);
#pragma unroll
        for (int k = 0; k < 2; ++k) rank[k] += uint32_t(y) < uint32_t(id[k]) ? 1 : 0;
      }
    }
    const unsigned f0 = __ballot_sync(0xffffffffu, first[0]);
    const unsigned f1 = __ballot_sync(0xffffffffu, first[1]);
    const int size = __popc(f0) + __popc(f1);
    // Entries of this item past the union (a last tile's tail) get empty masks.
    for (int i = max(0, size - e0) + lane; i < e1 - e0; i += 32) u.masks[i] = 0u;
#pragma unroll
    for (int k = 0; k < 2; ++k)
      if (first[k] && rank[k] >= e0 && rank[k] < e1) {
        u.ids[rank[k] - e0] = id[k];
        u.masks[rank[k] - e0] = 1u;
        if (with_pages) u.pages[rank[k] - e0] = page[k];
      }
    const unsigned r0 = __ballot_sync(0xffffffffu, id[0] >= 0 && !first[0]);
    const unsigned r1 = __ballot_sync(0xffffffffu, id[1] >= 0 && !first[1]);
    if (lane == 0) {
      if (r0 | r1) {
        const int s = r0 ? __ffs(r0) - 1 : 32 + __ffs(r1) - 1;
        report(p, Offence::q2k, uint64_t(row_at + s), StatusCode::block_id_repeated);
      }
      u.scan[0] = size;
    }
  }
  __syncthreads();
  return u.scan[0];
}

// Builds the union for queries [t0, t0 + nq) (global token ids, nq <= 32) of kv head h over
// request b with lk keys, by a CTA of kW warps (all of its threads), and prefetches the page-table
// lines of its blocks; with_pages (union_has_pages of the kernel's consumer width): the one-query
// path fills u.pages instead. Returns the union size. Ends with __syncthreads.
template <int kW>
__device__ __forceinline__ int build_union(const DecodeParams& p, const UnionSmem& u, int b, int h,
                                           int64_t t0, int nq, int lk, int e0, int e1,
                                           bool with_pages) {
  if (one_query_union(p, nq)) return build_union_one(p, u, b, h, t0, lk, e0, e1, with_pages);
  constexpr int kThreads = 32 * kW;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int nblk = lk > 0 ? ((lk - 1) >> p.block_shift) + 1 : 0;
  const int words = (nblk + 31) >> 5;
  for (int i = tid; i < words; i += kThreads) u.bitmap[i] = 0;
  for (int i = tid; i < e1 - e0; i += kThreads) u.masks[i] = 0;
  __syncthreads();

  const int topk = p.topk, total = nq * topk;
  const int64_t row0 = int64_t(h) * p.total_q + t0;  // q2k row of the first query
  for (int i = tid; i < total; i += kThreads) {
    const int qi = i / topk, slot = i - qi * topk;
    const int64_t at = (row0 + qi) * topk + slot;
    const int32_t id = p.q2k[at];
    if (id == -1) continue;
    if (id < -1 || id >= nblk) {
      report(p, Offence::q2k, uint64_t(at), StatusCode::block_id_out_of_range);
      continue;
    }
    atomicOr(&u.bitmap[id >> 5], 1u << (id & 31));
    prefetch_block_pages(p, b, id);
  }
  __syncthreads();

  // Exclusive scan of the words' popcounts: each thread owns a contiguous run of words.
  const int per = (words + kThreads - 1) / kThreads;
  const int w_begin = min(words, tid * per), w_end = min(words, w_begin + per);
  int mine = 0;
  for (int w = w_begin; w < w_end; ++w) mine += __popc(u.bitmap[w]);
  int incl = mine;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, incl, off);
    if (lane >= off) incl += y;
  }
  if (lane == 31) u.scan[warp] = incl;
  __syncthreads();
  int base = 0, size = 0;
#pragma unroll
  for (int w = 0; w < kW; ++w) {
    base += w < warp ? u.scan[w] : 0;
    size += u.scan[w];
  }
  int rank = base + incl - mine;
  for (int w = w_begin; w < w_end; ++w) {
    u.prefix[w] = rank;
    rank += __popc(u.bitmap[w]);
  }
  __syncthreads();

  // Block ids of this item's entries.
  for (int w = tid; w < words; w += kThreads) {
    uint32_t bits = u.bitmap[w];
    int r = u.prefix[w];
    if (r >= e1 || r + __popc(bits) <= e0) continue;
    while (bits) {
      const int bit = __ffs(bits) - 1;
      if (r >= e0 && r < e1) u.ids[r - e0] = (w << 5) + bit;
      ++r;
      bits &= bits - 1;
    }
  }
  // Which queries selected each entry; a bit already set means the id repeats within the row.
  for (int i = tid; i < total; i += kThreads) {
    const int qi = i / topk, slot = i - qi * topk;
    const int64_t at = (row0 + qi) * topk + slot;
    const int32_t id = p.q2k[at];
    if (id < 0 || id >= nblk) continue;
    const uint32_t word = u.bitmap[id >> 5];
    const int r = u.prefix[id >> 5] + __popc(word & ((1u << (id & 31)) - 1u));
    if (r < e0 || r >= e1) continue;
    const uint32_t old = atomicOr(&u.masks[r - e0], 1u << qi);
    if (old & (1u << qi)) {
      const int64_t row_at = (row0 + qi) * topk;
      const int s = first_repeat(p.q2k + row_at, topk, nblk);
      report(p, Offence::q2k, uint64_t(row_at + (s < 0 ? slot : s)), StatusCode::block_id_repeated);
    }
  }
  __syncthreads();
  return size;
}

}  // namespace msa::cuda::decode
