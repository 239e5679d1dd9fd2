// Producer side of the decode kernel: one pipeline stage (K and V of kStageKeys consecutive key
// slots of the item, traits.h) from the page pool into shared memory with 16-byte cp.async by the
// producer warpgroup's 128 threads. Slots without a key (past the length, past the union or the
// item, bad page id) are zero-filled and marked -1 in slot_key, so no byte of an unused page slot
// ever reaches the math. Used by kernel.cuh.
#pragma once

#include <cstdint>

#include "cuda/decode/ptx.cuh"
#include "cuda/decode/params.h"
#include "cuda/decode/status.cuh"
#include "cuda/decode/traits.h"

namespace msa::cuda::decode {

// Where the keys of an item's slots come from. Slot s of a request is key s (dense) or key
// s % blk of union entry s / blk's block (sparse); tile t holds slots [128 t, 128 t + 128).
struct TileSource {
  int b = 0, h = 0;
  int lk = 0;                  // keys of the request
  int slot_end = 0;            // first slot past the item's tiles
  int union_size = 0;          // sparse: entries in the union
  int e0 = 0;                  // sparse: first entry of this item (ids[] index 0)
  const int* ids = nullptr;    // sparse: block id per entry - e0; null for dense
};

// Byte offset of 16-byte chunk `chunk` of stage row `row`: the chunk index is XORed with
// row % 8, so the 8 rows an ldmatrix phase reads hit 8 different bank groups.
template <bool kFp8>
__device__ __forceinline__ uint32_t tile_offset(int row, int chunk) {
  return uint32_t(row * kKVRowBytes<kFp8> + ((chunk ^ (row & 7)) << 4));
}

// The rows of a stage one producer thread copies: warp w covers rows [w R, w R + R), R =
// kRowsPerWarp; kLanesPerRow lanes share a row and each copies 4 of its 16-byte chunks, so a copy
// instruction reads whole 32-byte sectors and a thread looks up and addresses only 2 or 4 rows per
// stage (the per-row page lookup and 64-bit address math dominate the issue cost).
template <bool kFp8, int kW>
struct StageRows {
  using Tr = Traits<kFp8, kW>;
  static constexpr int kChunksPerLane = 4;
  static constexpr int kLanesPerRow = Tr::kChunks / kChunksPerLane;  // bf16 4, fp8 2
  static constexpr int kRowsPerPass = 32 / kLanesPerRow;             // bf16 8, fp8 16
  static constexpr int kPasses = Tr::kRowsPerWarp / kRowsPerPass;    // 4 warps: 2; 8: 4
  static_assert(Tr::kRowsPerWarp % kRowsPerPass == 0, "StageRows: whole passes per warp");
  int key[kPasses];   // logical key of the row, -1 for none
  int page[kPasses];  // its page id as read from the page table (checked at issue)

  __device__ __forceinline__ static int row(int pass) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    return warp * Tr::kRowsPerWarp + pass * kRowsPerPass + lane / kLanesPerRow;
  }
};

// First half of a stage load: the logical keys of the thread's rows of the stage starting at
// item slot `slot0`, and their page-table entries. Only global loads, no shared-memory writes,
// so the kernel issues it a stage ahead and the page-table latency hides behind the math.
template <bool kFp8, int kW>
__device__ __forceinline__ void lookup_stage(const DecodeParams& p, const TileSource& src,
                                             int slot0, StageRows<kFp8, kW>& r) {
#pragma unroll
  for (int pass = 0; pass < StageRows<kFp8, kW>::kPasses; ++pass) {
    const int slot = slot0 + StageRows<kFp8, kW>::row(pass);
    int j = -1;
    if (slot < src.slot_end) {
      if (src.ids == nullptr) {
        if (slot < src.lk) j = slot;
      } else {
        const int e = slot >> p.block_shift;
        if (e < src.union_size) {
          const int key = (src.ids[e - src.e0] << p.block_shift) + (slot & (p.kv_block_size - 1));
          if (key < src.lk) j = key;
        }
      }
    }
    r.key[pass] = j;
    r.page[pass] = j >= 0 ? p.page_table[int64_t(src.b) * p.page_table_stride + (j >> p.page_shift)] : 0;
  }
}

// Second half: checks the page ids (a bad one is reported and its slot zero-filled), issues the
// 16-byte copies of K and V of the stage to `stage_base` (its K rows; the V rows sit
// kStageKBytes further, Traits) and writes slot_key[row] = logical key or -1.
template <bool kFp8, int kW>
__device__ __forceinline__ void issue_stage(const DecodeParams& p, const TileSource& src,
                                            const StageRows<kFp8, kW>& r, uint32_t stage_base,
                                            int* slot_key) {
  using Tr = Traits<kFp8, kW>;
  using Rows = StageRows<kFp8, kW>;
  constexpr int kElem = kFp8 ? 1 : 2;
  const int sub = (threadIdx.x & 31) % Rows::kLanesPerRow;  // first chunk of this lane
  const auto* kbase = static_cast<const uint8_t*>(p.k);
  const auto* vbase = static_cast<const uint8_t*>(p.v);
#pragma unroll
  for (int pass = 0; pass < Rows::kPasses; ++pass) {
    const int row = Rows::row(pass);
    int j = r.key[pass];
    const int32_t page = r.page[pass];
    int64_t koff = 0, voff = 0;
    if (j >= 0) {
      const int slot = j & (p.page_size - 1);
      if (page < 0 || page >= p.num_pages) {
        if (sub == 0)
          report(p, Offence::page, uint64_t(src.b) * uint64_t(p.max_pages) + uint64_t(j >> p.page_shift),
                 StatusCode::page_id_out_of_range);
        j = -1;
      } else {
        koff = (page * p.k_stride_page + slot * p.k_stride_slot + src.h * p.k_stride_head) * kElem;
        voff = (page * p.v_stride_page + slot * p.v_stride_slot + src.h * p.v_stride_head) * kElem;
      }
    }
    const uint32_t bytes = j >= 0 ? 16u : 0u;
#pragma unroll
    for (int i = 0; i < Rows::kChunksPerLane; ++i) {
      const int chunk = sub + Rows::kLanesPerRow * i;
      const uint32_t dst = stage_base + tile_offset<kFp8>(row, chunk);
      cp_async_16(dst, kbase + koff + chunk * 16, bytes);
      cp_async_16(dst + Tr::kStageKBytes, vbase + voff + chunk * 16, bytes);
    }
    if (sub == 0) slot_key[row] = j;
  }
}

}  // namespace msa::cuda::decode
