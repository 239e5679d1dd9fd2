// Producer warp of the sm_90a indexer: lane 0 issues the TMA loads, Q once (q_full), then each
// work item's K block through the kStages ring (k_full / k_empty). For FP8 keys with per-key
// scales the whole warp also copies the block's 128 key scales into shared memory by cp.async
// (0 past the batch's keys; paged K: from each key's pool slot), each lane's arrival on k_full
// made when its copies land; negative scales are reported once here, from the staged copy two
// items later. Paged K (docs/semantics.md, Paged KV) is loaded by the whole warp, one box per lane
// (load_paged_k).
// Called from kernel.cuh.
#pragma once

#include <cfloat>

#include "cuda/device/sm90.cuh"
#include "cuda/sm90/block_scores/work.cuh"
#include "cuda/common/paged_kv.cuh"

namespace msa::cuda::indexer_sm90 {

static_assert(kBlockN == 128 && kRowBytes == 128, "the paged K locator assumes 128-key tiles of "
              "128-byte rows");

// Block kb of a paged batch into K stage `stage` (cuda/common/paged_kv.cuh: lane i < 128 / R owns
// box i and lands it at row i R of each 128-byte-row half, the same swizzled tile as a flat load;
// lane 0 expects exactly the bytes issued). Warp-collective.
template <Elem kElem, bool kShard, int kD>
__device__ __forceinline__ void load_paged_k(const Params& p, const CUtensorMap* tm_k,
                                             SharedStorage& sh, int stage, int64_t h,
                                             const Segment& seg, int64_t kb, int lane) {
  constexpr int kHalves = kRowHalves<kElem, kD>;  // 128-byte rows per key
  constexpr int kHalfK = kBlockN * kRowBytes;
  const KVBlockSource src =
      locate_kv_block(p.paged, int32_t(h), int32_t(seg.k0), int32_t(kb),
                      int32_t(kShard ? shard_keys(p.shard, seg.lk) : seg.lk), kHalves, lane);
  if (lane == 0) sm90::mbar_arrive_expect_tx(&sh.k_full[stage], src.bytes);
  __syncwarp();  // the bytes are announced before any box can complete
  if (!src.issue) return;
  for (int half = 0; half < kHalves; ++half)
    sm90::tma_load_4d(sh.k[stage] + half * kHalfK + src.row_bytes, tm_k, &sh.k_full[stage],
                      half * kRowValues<kElem>, src.c1, src.c2, src.c3);
}

// kShard: an ICP shard (work.cuh, next_segment), whose keys are a prefix of the segment's. kD: the
// head dim (traits.h kRowHalves).
template <Elem kElem, int kBlk, bool kSplit, bool kShard, int kD>  // kBlk: the items' count
__device__ void run_producer(const Params& p, const CUtensorMap* tm_q, const CUtensorMap* tm_k,
                             SharedStorage& sh, int64_t h, int64_t t0, int64_t t1, int lane) {
  constexpr int kHalves = kRowHalves<kElem, kD>;  // 128-byte rows per token or key
  constexpr int kHalfQ = kTileM * kRowBytes, kHalfK = kBlockN * kRowBytes;
  const bool per_key = per_key_scales<kElem>(p);
  const bool paged = p.paged.page_table != nullptr;
  if (!per_key && !paged && lane != 0) return;
  const int tokens_per_group = kTileM / p.group;
  if (lane == 0) {
    sm90::mbar_arrive_expect_tx(&sh.q_full, uint32_t(p.row_groups * kHalves * kHalfQ));
    for (int r = 0; r < p.row_groups; ++r)
      for (int half = 0; half < kHalves; ++half)
        sm90::tma_load_3d(sh.q[r] + half * kHalfQ, tm_q, &sh.q_full, half * kRowValues<kElem>,
                          int32_t(h * p.group), int32_t(t0 + r * tokens_per_group));
  }
  const ItemRange range = cta_items<kBlk, kSplit, kShard>(p, t0, t1);
  ItemCursor<kBlk, kSplit, kShard> iter(p, t0, t1, range.first);
  // Per-key scales: each lane copies 4 of the block's 128 by cp.async (zeros past lk) and
  // arrives on k_full when they land, so the producer never waits on their global latency (a
  // round trip per stage that starved the consumers once FP8 made the math faster: ncu, 16% of
  // warp samples on k_full). The negative-scale check reads an item's scales back two
  // items later, once its k_full phase is seen complete, before the next copy into that stage.
  // Flat K: key j of a batch is scale token seg.k0 + j. Paged K (seg.k0 = the batch): the pool
  // slot that holds it, page * page_size + j % page_size (validate.cpp), 0 bytes copied for a
  // page id out of range (reported by the paged check).
  constexpr int kPerLane = kBlockN / 32;
  const int64_t scale_stride = p.k_scale_kind == 2 ? 1 : p.num_kv_heads;
  const float* scale_base = p.k_scale + (p.k_scale_kind == 2 ? 0 : h);
  // The scale token of batch-local key j < 2^31 of the segment that starts at k0 (paged: the
  // batch b); `in` turns false for a page id out of range.
  auto scale_token = [&](int64_t k0, int32_t j, bool& in) -> int64_t {
    if (!paged) return k0 + j;
    const int32_t id =
        in ? p.paged.page_table[k0 * p.paged.page_table_stride + (j >> p.paged.page_shift)] : -1;
    in = in && id >= 0 && id < p.paged.num_pages;
    return (int64_t(id) << p.paged.page_shift) | (j & ((1 << p.paged.page_shift) - 1));
  };
  // An item's first key as one register pair for the check two items later (the producer runs
  // at 40 registers): flat, its global key k0 + j0; paged, b << 32 | j0.
  auto item_key = [&](int64_t k0, int32_t j0) {
    return paged ? (k0 << 32) | int64_t(j0) : k0 + j0;
  };
  auto check_scales = [&](int64_t item, int64_t key) {
    const int st = KRing::stage(item);
    sm90::mbar_wait(&sh.k_full[st], KRing::full_parity(item));
#pragma unroll
    for (int i = 0; i < kPerLane; ++i)
      // Only copied keys hold one (others 0); NaN and infinity fail the test too.
      if (!(sh.k_scale[st][lane + 32 * i] >= 0.f && sh.k_scale[st][lane + 32 * i] <= FLT_MAX)) {
        bool in = true;
        const int64_t k0 = paged ? key >> 32 : key;
        const int32_t j0 = paged ? int32_t(key & 0xffffffff) : 0;
        flag_status(p.status, int32_t(StatusCode::negative_scale), 1,
                    scale_token(k0, j0 + lane + 32 * i, in), h);
      }
  };
  int64_t key_prev2 = -1, key_prev1 = -1;  // item_key of items it - 2 and it - 1
  int kb;
  bool fresh;
  int64_t it = 0;
  Segment seg;  // the current item's segment (next writes it when one opens)
  for (; it < range.count && iter.next(kb, fresh, seg); ++it) {
    const int stage = KRing::stage(it);
    const int64_t key0 = seg.k0 + int64_t(kb) * kBlockN;
    if (it >= kStages) sm90::mbar_wait(&sh.k_empty[stage], KRing::empty_parity(it));
    if (per_key) {
      if (it >= 2) check_scales(it - 2, key_prev2);
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        const int32_t j = kb * kBlockN + lane + 32 * i;
        bool in = j < (kShard ? shard_keys(p.shard, seg.lk) : seg.lk);
        const int64_t token = scale_token(seg.k0, j, in);
        sm90::cp_async_4(sm90::smem_addr(&sh.k_scale[stage][lane + 32 * i]),
                         in ? scale_base + token * scale_stride : scale_base, in ? 4u : 0u);
      }
      sm90::cp_async_mbar_arrive(&sh.k_full[stage]);
      key_prev2 = key_prev1;
      key_prev1 = item_key(seg.k0, kb * kBlockN);
    }
    if (paged) {
      load_paged_k<kElem, kShard, kD>(p, tm_k, sh, stage, h, seg, kb, lane);
    } else if (lane == 0) {
      sm90::mbar_arrive_expect_tx(&sh.k_full[stage], uint32_t(kHalves * kHalfK));
      for (int half = 0; half < kHalves; ++half)
        sm90::tma_load_3d(sh.k[stage] + half * kHalfK, tm_k, &sh.k_full[stage],
                          half * kRowValues<kElem>,
                          int32_t(h), int32_t(key0));
    }
  }
  if (per_key) {  // the last two items' scales
    if (it >= 2) check_scales(it - 2, key_prev2);
    if (it >= 1) check_scales(it - 1, key_prev1);
  }
}

}  // namespace msa::cuda::indexer_sm90
