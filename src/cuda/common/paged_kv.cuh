// Paged K/V as the sm_90a producers read it (docs/semantics.md, Paged KV), shared by the sparse
// forward (sparse_fwd/kv_load.cuh) and the indexer (block_scores/load.cuh): the page-pool
// description and the per-lane locator of one 128-key block's TMA boxes.
//
// The pool's tensor map is 4-D ([pages, slots, Hkv, D] or [pages, Hkv, slots, D], make_tma_paged)
// with boxes of R = min(page_size, 128) slots x one 128-byte row. Box i of a block covers keys
// kb * 128 + [i R, i R + R), all in one page (R divides page_size and 128), and lands at row i R of
// each 128-byte-row half of the stage, so the stage holds the same 128-row swizzled tiles as a
// flat load (every box starts on a 1024-byte swizzle-atom boundary: R >= 16 rows of 128 B). Box i
// is loaded only if its first key is below the batch's length and its page id is in
// [0, num_pages); a barrier expects exactly the bytes of the boxes issued. Rows not loaded keep
// stale data: past the batch's keys (masked by the consumers, as flat tail rows are) or behind a
// bad page id, which paged_checks.cuh has already reported.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#include "cuda/device/sm90.cuh"
#endif

namespace msa::cuda {

// page_table null: flat KV.
struct PagedKV {
  const int32_t* page_table = nullptr;  // [B, max_pages], row stride page_table_stride; or null
  int64_t page_table_stride = 0;        // elements
  int32_t num_pages = 0;                // ids outside [0, num_pages) are never loaded
  int32_t page_shift = 0;               // log2(page_size), page_size in {16, ..., 256}
  int32_t box_shift = 7;                // log2(keys per TMA box) = log2(min(page_size, 128))
  int32_t head_major = 0;               // 1: [num_pages, Hkv, page_size, D] (map coords slot, head)
};

// Page and box sizes are powers of two (validated on the host): shifts instead of divisions.
inline PagedKV make_paged_kv(const int32_t* page_table, int64_t page_table_stride,
                             int64_t num_pages, int64_t page_size, bool head_major) {
  auto log2_of = [](int64_t x) {
    int32_t n = 0;
    while ((int64_t(1) << n) < x) ++n;
    return n;
  };
  PagedKV pk;
  pk.page_table = page_table;
  pk.page_table_stride = page_table_stride;
  pk.num_pages = int32_t(num_pages);
  pk.page_shift = log2_of(page_size);
  pk.box_shift = log2_of(page_size < 128 ? page_size : 128);
  pk.head_major = head_major ? 1 : 0;
  return pk;
}

#if defined(__CUDACC__)
// Where one lane's share of a 128-key block comes from; the same for K and V (same layout).
struct KVBlockSource {
  bool paged;
  bool issue;          // this lane issues boxes (flat: lane 0; paged: lane i owns box i)
  int32_t c1, c2, c3;  // map coordinates after the column: flat (head, key row, -);
                       // paged nhd (head, slot, page), hnd (slot, head, page)
  int32_t row_bytes;   // smem offset of the lane's box inside each 128-row half
  uint32_t bytes;      // bytes of the whole block of ONE tensor: a barrier's expect_tx
};

// Block kb (keys [kb * 128, kb * 128 + 128) of its batch) of kv head `head`, each key being
// `halves` 128-byte rows (2 for 16-bit D = 128, 1 for fp8). k_start: flat, the batch's first key
// row; paged, the batch index (its page-table row). k_len: the batch's keys (clamped to the pages
// it owns). Warp-collective (one page-table read per box lane, a ballot). kKeys: keys per block,
// 128, or 64 for the sparse forward's head-dim-256 stages and its 64-key blocks (its pools then
// have boxes of at most 64 slots, box_shift <= 6).
template <int kKeys = 128>
__device__ __forceinline__ KVBlockSource locate_kv_block(const PagedKV& pk, int32_t head,
                                                         int32_t k_start, int32_t kb,
                                                         int32_t k_len, int halves, int lane) {
  constexpr int kRowBytes = 128;
  KVBlockSource src{false, lane == 0, head, k_start + kb * kKeys, 0, 0,
                    uint32_t(halves * kKeys * kRowBytes)};
  if (pk.page_table == nullptr) return src;
  int32_t page = -1, slot = 0;
  if (lane < (kKeys >> pk.box_shift)) {
    const int32_t key0 = kb * kKeys + (lane << pk.box_shift);
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
  src.row_bytes = (lane << pk.box_shift) * kRowBytes;  // box i starts at row i R
  // R rows of 128 B in each half per box.
  src.bytes = (uint32_t(__popc(boxes)) * uint32_t(halves * kRowBytes)) << pk.box_shift;
  return src;
}
#endif

}  // namespace msa::cuda
