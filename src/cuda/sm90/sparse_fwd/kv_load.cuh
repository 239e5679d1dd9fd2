// K/V block loads of the sparse forward producers (load.cuh, uniform_load.cuh): one 128-key block
// of one kv head into a K/V stage, from flat KV or from a page pool (DESIGN.md s.6). The KV-major
// path loads K and V on one barrier (load_kv_block); the uniform path locates the block once and
// loads K and V on their own barriers (locate_kv_block + load_kv_tile).
//
// Flat: per 64-column half one 128-row box of the 3-D map [total_k, Hkv, D] (4 boxes, 64 KB).
// Paged: the 4-D map over the pool ([pages, slots, Hkv, D] or [pages, Hkv, slots, D]) has boxes
// of R = min(page_size, 128) slots x 64 columns; box i of the block covers keys
// kb * 128 + [i R, i R + R), all in one page (R divides page_size and 128), and lands at row i R of
// each half, so the stage holds the same 128-row swizzled tiles as a flat load (every box starts
// on a 1024-byte swizzle-atom boundary: R >= 16 rows of 128 B). Box i is loaded only if its first
// key is below the batch's length and its page id is in [0, num_pages); the barrier expects
// exactly the bytes of the boxes issued (R * 128 B per half and tensor). Rows not loaded keep
// stale data: they are past the batch's keys (masked in S, zeroed in V by the consumers, as the
// flat tail rows are) or behind a bad page id, which paged_checks.cuh has already reported.
#pragma once

#include "cuda/device/sm90.cuh"
#include "cuda/sm90/sparse_fwd/params.h"
#include "cuda/sm90/sparse_fwd/traits.h"

namespace msa::cuda::sparse_fwd {

// 4-D tile load global -> shared, completing `bar`'s transaction count.
__device__ __forceinline__ void tma_load_4d(void* dst, const CUtensorMap* map, uint64_t* bar,
                                            int32_t c0, int32_t c1, int32_t c2, int32_t c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5, %6}], [%2];" ::"r"(sm90::smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(sm90::smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2),
      "r"(c3)
      : "memory");
}

// Where one lane's share of a 128-key block comes from; the same for K and V (same layout).
struct KVBlockSource {
  bool paged;
  bool issue;          // this lane issues boxes (flat: lane 0; paged: lane i owns box i)
  int32_t c1, c2, c3;  // map coordinates after the column: flat (head, key row, -);
                       // paged nhd (head, slot, page), hnd (slot, head, page)
  int32_t row_bytes;   // smem offset of the lane's box inside each 128-row half
  uint32_t bytes;      // bytes of the whole block of ONE tensor (K or V): a barrier's expect_tx
};

// Block kb (keys [kb * 128, kb * 128 + 128) of its batch) of kv head `head`. k_start: flat, the
// batch's first key row; paged, the batch index (its page-table row). k_len: the batch's keys
// (clamped to the pages it owns). Warp-collective (one page-table read per box lane, a ballot).
__device__ __forceinline__ KVBlockSource locate_kv_block(const PagedKV& pk, int32_t head,
                                                         int32_t k_start, int32_t kb,
                                                         int32_t k_len, int lane) {
  KVBlockSource src{false, lane == 0, head, k_start + kb * kBlockN, 0, 0, 2 * kKVHalfBytes};
  if (pk.page_table == nullptr) return src;
  int32_t page = -1, slot = 0;
  if (lane < (kBlockN >> pk.box_shift)) {
    const int32_t key0 = kb * kBlockN + (lane << pk.box_shift);
    if (key0 < k_len) {
      const int32_t id =
          pk.page_table[int64_t(k_start) * pk.page_table_stride + (key0 >> pk.page_shift)];
      if (id >= 0 && id < pk.num_pages) {
        page = id;
        slot = key0 & ((1 << pk.page_shift) - 1);
      }
    }
  }
  const unsigned boxes = __ballot_sync(0xffffffffu, page >= 0);
  src.paged = true;
  src.issue = page >= 0;
  src.c1 = pk.head_major ? slot : head;
  src.c2 = pk.head_major ? head : slot;
  src.c3 = page;
  src.row_bytes = (lane << pk.box_shift) * 128;  // box i starts at row i R; 128 B rows
  // R rows of 128 B in each of the two halves per box.
  src.bytes = (uint32_t(__popc(boxes)) * uint32_t(2 * 128)) << pk.box_shift;
  return src;
}

// Issues this lane's boxes of one tensor (K or V) into the two 64-column halves `dst`,
// completing on `bar`. Call after lane 0 announced the bytes (arrive.expect_tx) and a __syncwarp.
__device__ __forceinline__ void load_kv_tile(const KVBlockSource& src, const CUtensorMap* tm,
                                             uint8_t (&dst)[2][kKVHalfBytes], uint64_t* bar) {
  if (!src.issue) return;
  for (int half = 0; half < 2; ++half) {
    if (src.paged)
      tma_load_4d(dst[half] + src.row_bytes, tm, bar, half * kHalfCols, src.c1, src.c2, src.c3);
    else
      sm90::tma_load_3d(dst[half], tm, bar, half * kHalfCols, src.c1, src.c2);
  }
}

// K and V of a block into stage s on one barrier (the KV-major path): lane 0 arrives with the
// exact byte count, then the boxes. Warp-collective, after the stage's kv_empty wait and after
// lane 0 wrote the stage's info struct (released by the same arrive).
__device__ __forceinline__ void load_kv_block(const PagedKV& pk, const CUtensorMap* tm_k,
                                              const CUtensorMap* tm_v, SharedStorage& sh, int s,
                                              int32_t head, int32_t k_start, int32_t kb,
                                              int32_t k_len, int lane) {
  const KVBlockSource src = locate_kv_block(pk, head, k_start, kb, k_len, lane);
  if (lane == 0) sm90::mbar_arrive_expect_tx(&sh.kv_full[s], 2 * src.bytes);
  __syncwarp();  // the bytes are announced before any box can complete
  load_kv_tile(src, tm_k, sh.k[s], &sh.kv_full[s]);
  load_kv_tile(src, tm_v, sh.v[s], &sh.kv_full[s]);
}

}  // namespace msa::cuda::sparse_fwd
