// Work items of the sm_90a indexer CTA: the batch segments of its token tile and the
// (segment, K tile) items both roles walk in the same order. Blocks count in kBlk keys (the
// scores' and the ids' unit), items in 128-key K tiles (traits.h: two 64-key blocks a tile).
// Included by load.cuh and mma.cuh.
#pragma once

#include "cuda/sm90/block_scores/params.h"
#include "cuda/sm90/block_scores/traits.h"

namespace msa::cuda::indexer_sm90 {

// The part of the CTA's token tile [t0, t1) that falls in batch b, and what K it reads.
struct Segment {
  int64_t q0, lq, k0, lk;  // batch offsets and lengths (paged: k0 = b, the page-table row; an
                           // ICP shard: lk counts the unsharded pool's keys, of which the shard
                           // holds shard_keys(lk))
  int64_t t_begin, t_end;  // global tokens of the tile in this batch
  int64_t nblocks;         // blocks of kBlk keys visible to the segment's last token, at most
                           // nblk_max; the items are the tiles_of<kBlk>(nblocks) K tiles
};

// K tiles that hold the first n blocks of kBlk keys.
template <int kBlk>
__device__ __forceinline__ int64_t tiles_of(int64_t n) {
  if constexpr (kBlk == kBlockN) return n;
  else return (n + kBlocksPerTile<kBlk> - 1) / kBlocksPerTile<kBlk>;
}

// Unfused: the blocks a segment's items write, those of its whole tiles, at most nblk_max
// (with 64-key blocks a last tile's second block may be past the visible ones: the epilogue
// writes its -inf); fill_tail writes the rest.
template <int kBlk>
__device__ __forceinline__ int64_t blocks_written(const Params& p, int64_t nblocks) {
  if constexpr (kBlk == kBlockN) return nblocks;
  else {
    const int64_t n = tiles_of<kBlk>(nblocks) * kBlocksPerTile<kBlk>;
    return n < p.nblk_max ? n : p.nblk_max;
  }
}

// Advances `b` to the next non-empty batch overlapping [t0, t1); false when there is none.
// kShard: the kernel scores an ICP shard (Params::shard): its blocks count the shard's keys. A
// template parameter: the shard's few instructions in every role's item walk cost the fused
// kernels' 32-register producer spills (ptxas: 24 -> 200 bytes) even where no shard is given.
template <int kBlk, bool kShard = false>
__device__ __forceinline__ bool next_segment(const Params& p, int64_t t0, int64_t t1, int64_t& b,
                                             Segment& s) {
  for (; b < p.batch; ++b) {
    const int64_t q0 = p.cu_seqlens_q[b], q1 = p.cu_seqlens_q[b + 1];
    if (q0 >= t1) return false;
    if (q1 <= q0 || q1 <= t0) continue;
    s.q0 = q0;
    s.lq = q1 - q0;
    s.lk = batch_keys(p.keys, b);
    s.t_begin = q0 > t0 ? q0 : t0;
    s.t_end = q1 < t1 ? q1 : t1;
    if (p.paged.page_table != nullptr) {
      // Paged: k0 is the batch's page-table row. A seqused_k outside [0, max_keys] was reported
      // by the paged check (launch.cu) and is clamped here, as that check clamps it.
      s.k0 = b;
      s.lk = s.lk < 0 ? 0 : (s.lk > p.keys.max_keys ? p.keys.max_keys : s.lk);
    } else {
      s.k0 = p.keys.cu_seqlens_k[b];
      if (s.lk < 0 || s.k0 < 0 || s.k0 + s.lk > p.total_k) {  // corrupt cu_seqlens_k: read nothing
        if (threadIdx.x == 0) flag_status(p.status, int32_t(StatusCode::bad_cu_seqlens), 1, b, 0);
        s.lk = 0;
      }
    }
    const int64_t last = s.t_end - 1 - q0;
    int64_t end = p.causal ? last + s.lk - s.lq + 1 : s.lk;
    end = end < 0 ? 0 : (end > s.lk ? s.lk : end);
    if constexpr (kShard) end = shard_keys(p.shard, end);
    s.nblocks = (end + kBlk - 1) / kBlk;
    if (s.nblocks > p.nblk_max) {
      if (threadIdx.x == 0)
        flag_status(p.status, int32_t(StatusCode::shape_mismatch), b, s.nblocks, p.nblk_max);
      s.nblocks = p.nblk_max;
    }
    ++b;
    return true;
  }
  return false;
}

// Whether the epilogue scales each key (FP8 keys with per-token or per-token-head scales).
template <Elem kElem>
__device__ __forceinline__ bool per_key_scales(const Params& p) {
  return kElem == Elem::e4m3 && p.k_scale_kind >= 2;
}

// k_full arrivals per phase: lane 0's expect_tx, plus each of the 32 lanes' cp.async arrival
// (made when its scale copies land) when keys carry per-key scales.
__device__ __forceinline__ uint32_t k_full_arrivals(bool per_key) { return per_key ? 33u : 1u; }

// What the consumers' epilogue setup (segment_rows) reads of a segment, in 32 bits: token and
// key counts are < 2^31 (launch.cu).
struct SegBounds {
  int32_t q0, lq, lk, t_begin, t_end;
};
__device__ __forceinline__ void describe(const Segment& s, Segment& out) { out = s; }
__device__ __forceinline__ void describe(const Segment& s, SegBounds& out) {
  out = SegBounds{int32_t(s.q0), int32_t(s.lq), int32_t(s.lk), int32_t(s.t_begin), int32_t(s.t_end)};
}

// The CTA's (segment, K tile) work items in order, as both roles walk them. Between items only
// the tile counter and the segment's tile count stay live; a new segment goes to the caller's
// `seg`, so the consumers hold its fields only until they have used them (a Segment kept in the
// walker held ~14 registers through the whole block loop).
// kSplit: the unfused kernels, whose CTAs may take a share of the items (cta_items); the fused
// ones never split, and their 32-register producer spills with the skip counter live.
template <int kBlk, bool kSplit = false, bool kShard = false>
class ItemCursor {
 public:
  // `first`: the tile's items before it are skipped (a split's share, cta_items; 0 unless kSplit).
  __device__ ItemCursor(const Params& p, int64_t t0, int64_t t1, int first = 0)
      : p_(p), t0_(t0), t1_(t1), b_(p.batch > 0 ? find_batch(p.cu_seqlens_q, p.batch, t0) : 0),
        skip_(first) {}
  // Next item: K tile kb; fresh when it opens a new segment, then described in out (a Segment,
  // or its SegBounds; else out is not written). False when the tile has no more.
  template <typename Out>
  __device__ bool next(int& kb, bool& fresh, Out& out) {
    fresh = false;
    while (kb_ + 1 >= nblocks_) {
      Segment seg;
      if (!next_segment<kBlk, kShard>(p_, t0_, t1_, b_, seg)) return false;
      const int64_t tiles = tiles_of<kBlk>(seg.nblocks);  // <= 2^24: keys < 2^31 (launch.cu)
      if constexpr (kSplit) {
        if (skip_ >= tiles) {  // wholly before the first item (or empty)
          skip_ -= int(tiles);
          continue;
        }
      }
      describe(seg, out);
      nblocks_ = int(tiles);
      kb_ = -1;
      if constexpr (kSplit) {
        kb_ = skip_ - 1;
        skip_ = 0;
      }
      fresh = true;
    }
    kb = ++kb_;
    return true;
  }

 private:
  const Params& p_;
  int64_t t0_, t1_, b_;
  int nblocks_ = 0, kb_ = -1, skip_;  // the segment's K tiles, the current one, tiles to skip
};

// Visible block count (blocks of kBlk keys) of global token t of segment s.
template <int kBlk>
__device__ __forceinline__ int64_t token_blocks(const Params& p, const Segment& s, int64_t t) {
  int64_t end = p.causal ? t - s.q0 + s.lk - s.lq + 1 : s.lk;
  end = end < 0 ? 0 : (end > s.lk ? s.lk : end);
  return (end + kBlk - 1) / kBlk;
}

// Number of (segment, K tile) items of the tile.
template <int kBlk, bool kShard = false>
__device__ __forceinline__ int64_t count_items(const Params& p, int64_t t0, int64_t t1) {
  int64_t n = 0, b = p.batch > 0 ? find_batch(p.cu_seqlens_q, p.batch, t0) : 0;
  Segment seg;
  while (next_segment<kBlk, kShard>(p, t0, t1, b, seg)) n += tiles_of<kBlk>(seg.nblocks);
  return n;
}

// Segment groups (launch.cu, Params::seg_groups): group g of a tile takes the batches
// [b0 + nb g / n, b0 + nb (g + 1) / n) of the nb batches b0.. its tokens [t0, t1) overlap, as a
// token range of its own (empty: t1 = t0). Each batch's tokens stay in one CTA, so a fused list
// is whole; what a CTA walks is its own batches' keys, not those of every batch in the tile
// (64 decode queries of 64 requests: 64 CTAs instead of one walking 64 requests' keys).
__device__ __forceinline__ void group_tokens(const Params& p, int g, int64_t& t0, int64_t& t1) {
  const int64_t b0 = find_batch(p.cu_seqlens_q, p.batch, t0);
  const int64_t nb = find_batch(p.cu_seqlens_q, p.batch, t1 - 1) - b0 + 1, n = p.seg_groups;
  const int64_t first = b0 + nb * g / n, last = b0 + nb * (g + 1) / n;
  if (nb <= 0 || first >= last) {
    t1 = t0;
    return;
  }
  const int64_t lo = p.cu_seqlens_q[first], hi = p.cu_seqlens_q[last];
  t0 = lo > t0 ? lo : t0;
  t1 = hi < t1 ? hi : t1;
}

// Row groups that hold a token of [t0, t1) (row group r: tokens r 64 / G ..): a wide consumer
// past them runs no wgmma (run_consumer), e.g. a decode CTA's one token.
__device__ __forceinline__ int active_row_groups(const Params& p, int64_t t0, int64_t t1) {
  const int64_t r = ((t1 - t0) * p.group + kTileM - 1) / kTileM;
  return int(r < p.row_groups ? r : p.row_groups);
}

// This CTA's share of its tile's items: split blockIdx.z % item_splits (launch.cu splits the
// unfused kernel's items when the tiles alone leave SMs idle, e.g. few decode queries over long
// keys: a block's scores need no other block's, so a split writes its own blocks only). Every
// role walks the same range.
struct ItemRange {
  int first, count;  // < 2^31 items
};
template <int kBlk, bool kSplit, bool kShard = false>
__device__ __forceinline__ ItemRange cta_items(const Params& p, int64_t t0, int64_t t1) {
  const int64_t n = count_items<kBlk, kShard>(p, t0, t1);
  if constexpr (!kSplit) return ItemRange{0, int(n)};
  const int64_t z = blockIdx.z % p.item_splits, splits = p.item_splits;
  const int64_t first = n * z / splits;
  return ItemRange{int(first), int(n * (z + 1) / splits - first)};
}

}  // namespace msa::cuda::indexer_sm90
