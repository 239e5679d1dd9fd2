// Producer side of the decode kernel: one tile of 128 key slots (K and V) from the page pool into
// a pipeline stage (one tile for bf16 / f16, two for fp8: traits.h) with 16-byte cp.async, every
// thread taking part. Slots without a key (past the length, past the union, bad page id) are
// zero-filled and marked -1 in slot_key, so no byte of an unused page slot ever reaches the
// math. Used by kernel.cuh.
#pragma once

#include <cstdint>

#include "cuda/decode/ptx.cuh"
#include "cuda/decode/params.h"
#include "cuda/decode/status.cuh"
#include "cuda/decode/traits.h"

namespace msa::cuda::decode {

// Where the keys of a tile come from.
struct TileSource {
  int b = 0, h = 0;
  int lk = 0;                  // keys of the request
  int union_size = 0;          // sparse: entries in the union
  int e0 = 0;                  // sparse: first entry of this item (ids[] index 0)
  const int* ids = nullptr;    // sparse: block id per entry - e0; null for dense
};

// Byte offset of 16-byte chunk `chunk` of tile row `row` in a stage: the chunk index is XORed
// with row % 8, so the 8 rows an ldmatrix phase reads hit 8 different bank groups.
template <bool kFp8>
__device__ __forceinline__ uint32_t tile_offset(int row, int chunk) {
  return uint32_t(row * Traits<kFp8>::kRowBytes + ((chunk ^ (row & 7)) << 4));
}

// The rows of a tile one thread copies: warp w covers rows [16 w, 16 w + 16); kLanesPerRow lanes
// share a row and each copies 4 of its 16-byte chunks, so a copy instruction reads whole 32-byte
// sectors and a thread looks up and addresses only 2 (bf16) or 1 (fp8) rows per tile (the
// per-row page lookup and 64-bit address math dominate the issue cost).
template <bool kFp8>
struct TileRows {
  static constexpr int kChunksPerLane = 4;
  static constexpr int kLanesPerRow = Traits<kFp8>::kChunks / kChunksPerLane;  // bf16 4, fp8 2
  static constexpr int kRowsPerPass = 32 / kLanesPerRow;                      // bf16 8, fp8 16
  static constexpr int kPasses = 16 / kRowsPerPass;                           // bf16 2, fp8 1
  int key[kPasses];   // logical key of the row, -1 for none
  int page[kPasses];  // its page id as read from the page table (checked at issue)

  __device__ __forceinline__ static int row(int pass) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    return warp * 16 + pass * kRowsPerPass + lane / kLanesPerRow;
  }
};

// First half of a tile load: the logical keys of the thread's rows and their page-table entries.
// Only global loads, no shared-memory writes, so the kernel issues it a tile ahead and the
// page-table latency hides behind the math.
template <bool kFp8>
__device__ __forceinline__ void lookup_tile(const DecodeParams& p, const TileSource& src, int tile,
                                            TileRows<kFp8>& r) {
#pragma unroll
  for (int pass = 0; pass < TileRows<kFp8>::kPasses; ++pass) {
    const int row = TileRows<kFp8>::row(pass);
    int j = -1;
    if (src.ids == nullptr) {
      const int key = tile * kTileKeys + row;
      if (key < src.lk) j = key;
    } else {
      const int e = tile * (kTileKeys >> p.block_shift) + (row >> p.block_shift);
      if (e < src.union_size) {
        const int key = (src.ids[e - src.e0] << p.block_shift) + (row & (p.kv_block_size - 1));
        if (key < src.lk) j = key;
      }
    }
    r.key[pass] = j;
    r.page[pass] = j >= 0 ? p.page_table[int64_t(src.b) * p.page_table_stride + (j >> p.page_shift)] : 0;
  }
}

// Second half: checks the page ids (a bad one is reported and its slot zero-filled), issues the
// 16-byte copies of K and V of one tile to `tile_base` (its K rows; the V rows sit kStageKBytes
// further, Traits) and writes slot_key[row] = logical key or -1. A stage of two fp8 tiles takes
// its second tile at stage base + kTileBytes, i.e. stage rows 128..255: tile_offset swizzles by
// row % 8, the same for row and row + 128.
template <bool kFp8>
__device__ __forceinline__ void issue_tile(const DecodeParams& p, const TileSource& src,
                                           const TileRows<kFp8>& r, uint32_t tile_base,
                                           int* slot_key) {
  using Tr = Traits<kFp8>;
  using Rows = TileRows<kFp8>;
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
      const uint32_t dst = tile_base + tile_offset<kFp8>(row, chunk);
      cp_async_16(dst, kbase + koff + chunk * 16, bytes);
      cp_async_16(dst + Tr::kStageKBytes, vbase + voff + chunk * 16, bytes);
    }
    if (sub == 0) slot_key[row] = j;
  }
}

}  // namespace msa::cuda::decode
