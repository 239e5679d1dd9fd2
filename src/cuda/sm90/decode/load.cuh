// Producer side of the decode kernel: one pipeline stage (K and V of kStageKeys consecutive key
// slots of the item, traits.h) from the page pool into shared memory: whole boxes of keys by TMA
// (one lane of warp 0 per box), the rest row by row with 16-byte cp.async by the producer
// warpgroup's 128 threads; with token ids (kv_block_size 1, issue_token_stage) every row by
// cp.async. Slots without a key (past the length, past the union or the item, bad page id) are
// zero-filled and marked -1 in slot_key, so no byte of an unused page slot ever reaches the math.
// Used by kernel.cuh.
#pragma once

#include <cstdint>

#include "cuda/sm90/decode/params.h"
#include "cuda/sm90/decode/status.cuh"
#include "cuda/sm90/decode/traits.h"
#include "cuda/device/sm80.cuh"
#include "cuda/device/sm90.cuh"

namespace msa::cuda::decode {

// The query of CTA row r (DecodeParams::group_shift: a shift for power-of-two groups).
__device__ __forceinline__ int query_of(const DecodeParams& p, int r) {
  return p.group_shift >= 0 ? r >> p.group_shift : r / p.group;
}

// Where the keys of an item's slots come from. Slot s of a request is key s (dense) or key
// s % blk of union entry s / blk's block (sparse); tile t holds slots [128 t, 128 t + 128).
struct TileSource {
  int b = 0, h = 0;
  int lk = 0;                  // keys of the request
  int slot_end = 0;            // first slot past the item's tiles
  int union_size = 0;          // sparse: entries in the union
  int e0 = 0;                  // sparse: first entry of this item (ids[] index 0)
  const int* ids = nullptr;    // sparse: block id per entry - e0; null for dense
  const int* pages = nullptr;  // sparse: page per entry - e0, or null (union.cuh union_has_pages)
};

// Byte offset of 16-byte chunk `chunk` of row `row` in a stage of kS key slots: the layout that
// TMA's 128-byte swizzle writes. A row is cut into kLines 128-byte lines (traits.h kRowLines; at
// D = 128 bf16 two, columns 0-63 in the first kS * 128 bytes of the K region, 64-127 in the next;
// fp8 one), and the 16-byte chunk index within a line is XORed with row % 8, so the 8 rows an
// ldmatrix phase reads hit 8 different bank groups.
template <int kLines, int kS>
__device__ __forceinline__ uint32_t tile_offset(int row, int chunk) {
  if constexpr (kLines == 1) return uint32_t(row * 128 + ((chunk ^ (row & 7)) << 4));
  else
    return uint32_t((chunk >> 3) * (kS * 128) + row * 128 + (((chunk & 7) ^ (row & 7)) << 4));
}

// The rows of a stage one producer thread copies when its box is not loaded by TMA (issue_stage):
// warp w covers rows [w R, w R + R), R = kRowsPerWarp; kLanesPerRow lanes share a row and each
// copies 4 of its 16-byte chunks, so a copy instruction reads whole 32-byte sectors.
template <KV kKV, int kW, int kD>
struct StageRows {
  using Tr = Traits<kKV, kW, kD>;
  static constexpr int kChunksPerLane = 4;
  static constexpr int kLanesPerRow = Tr::kChunks / kChunksPerLane;  // D = 128: bf16 4, fp8 2
  static constexpr int kRowsPerPass = 32 / kLanesPerRow;             // D = 128: bf16 8, fp8 16
  // 4 warps: 2; 8: 4 (kRowsPerWarp and kRowsPerPass scale alike with D)
  static constexpr int kPasses = Tr::kRowsPerWarp / kRowsPerPass;
  static_assert(Tr::kRowsPerWarp % kRowsPerPass == 0, "StageRows: whole passes per warp");

  __device__ __forceinline__ static int row(int pass) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    return warp * Tr::kRowsPerWarp + pass * kRowsPerPass + lane / kLanesPerRow;
  }
};

// The key in item slot `slot` (sparse: through the union; -1: none) and its page (from the union's
// pages when it carries them, else from the page table).
struct RowSource {
  int key = -1;
  int page = 0;
};

__device__ __forceinline__ RowSource lookup_row(const DecodeParams& p, const TileSource& src,
                                                int slot) {
  RowSource r;
  if (slot < src.slot_end) {
    if (src.ids == nullptr) {
      if (slot < src.lk) r.key = slot;
    } else {
      const int e = slot >> p.block_shift;
      if (e < src.union_size) {
        const int key = (src.ids[e - src.e0] << p.block_shift) + (slot & (p.kv_block_size - 1));
        if (key < src.lk) {
          r.key = key;
          if (src.pages) r.page = src.pages[e - src.e0];
        }
      }
    }
  }
  if (r.key >= 0 && src.pages == nullptr)
    r.page = p.page_table[int64_t(src.b) * p.page_table_stride + (r.key >> p.page_shift)];
  return r;
}

// A stage is cut into boxes of B = 2^p.box_shift consecutive slots (B divides the page size, the
// kv block and the stage, so a box's keys are consecutive and lie in one page). Lane b < kS / B of
// every producer warp describes box b: its first key (-1: none) and that key's page-table entry.
struct StageBox {
  int key0 = -1;
  int page = 0;
};

// First half of a stage load: the boxes of the stage starting at item slot `slot0` and their
// page-table entries. Only global loads, no shared-memory writes, so the kernel issues it a stage
// ahead and the page-table latency hides behind the wait for a free stage.
template <KV kKV, int kW, int kD>
__device__ __forceinline__ StageBox lookup_stage(const DecodeParams& p, const TileSource& src,
                                                 int slot0) {
  constexpr int kS = Traits<kKV, kW, kD>::kStageKeys;
  const int lane = threadIdx.x & 31;
  StageBox bx;
  if (lane < (kS >> p.box_shift)) {
    const RowSource r = lookup_row(p, src, slot0 + (lane << p.box_shift));
    bx.key0 = r.key;
    bx.page = r.page;
  }
  return bx;
}

// One slot's FP8 scale of one tensor into shared memory (params.h kinds): from the pool slot's
// entry (per slot, per slot and head) or the per-tensor scale by 4-byte cp.async, 1 without a
// scale; 0 for a slot without a key (never a read past the scales, and no NaN of an unused slot).
__device__ __forceinline__ void stage_scale(const float* scale, int kind, int64_t token, int h,
                                            int heads, bool key, float* dst) {
  if (kind == 0) {
    *dst = key ? 1.f : 0.f;
    return;
  }
  const float* src = kind == 1 ? scale : kind == 2 ? scale + token : scale + token * heads + h;
  sm90::cp_async_4(sm90::smem_addr(dst), key ? src : scale, key ? 4u : 0u);
}

// Second half, by the whole producer warpgroup. A box whose B keys all exist (below the request's
// length) on a page id in range is loaded by TMA: lane b of warp 0 issues box b's K and V boxes
// (under L2 policy `policy` when evict_first), after lane 0 announced the stage's TMA bytes on
// `full`. Every other box (the last, partial page of a request, slots past the union or the
// item, a bad page id: reported) is copied row by row with 16-byte cp.async that zero-fill the
// slots without a key, so no byte past a request's keys ever reaches the math (docs/semantics.md,
// Attention: unused page slots may hold NaN). slot_key[row] gets the logical key of every row or
// -1, and with per-slot FP8 scales (slot_scale non-null) slot_scale[row] its K scale,
// slot_scale[kS + row] its V scale (stage_scale).
template <KV kKV, int kW, int kD>
__device__ __forceinline__ void issue_stage(const DecodeParams& p, const TileSource& src,
                                            const StageBox& bx, const CUtensorMap* tm_k,
                                            const CUtensorMap* tm_v, uint64_t* full,
                                            uint32_t stage_base, int* slot_key, float* slot_scale,
                                            bool evict_first, uint64_t policy) {
  static_assert(kKV != KV::nvfp4, "issue_stage: NVFP4 stages are written by load_fp4.cuh");
  using Tr = Traits<kKV, kW, kD>;
  using Rows = StageRows<kKV, kW, kD>;
  constexpr int kS = Tr::kStageKeys;
  constexpr int kElem = kByteStage<kKV> ? 1 : 2;
  constexpr int kLines = Tr::kLines;          // 128-byte lines per row: one TMA box each
  constexpr int kLineCols = 128 / kElem;      // elements of a line: the boxes' column step
  const int lane = threadIdx.x & 31;
  const int box = 1 << p.box_shift;
  const bool tma = bx.key0 >= 0 && bx.key0 + box <= src.lk && bx.page >= 0 && bx.page < p.num_pages;
  const unsigned tma_boxes = __ballot_sync(0xffffffffu, tma);
  if (threadIdx.x < 32) {
    if (lane == 0 && tma_boxes)
      sm90::mbar_expect_tx(full, uint32_t(__popc(tma_boxes)) * uint32_t(2 * box * Tr::kRowBytes));
    __syncwarp();  // the bytes are announced before any box can complete
    if (tma) {
      const int slot = bx.key0 & (p.page_size - 1);
      const int c1 = p.head_major ? slot : src.h, c2 = p.head_major ? src.h : slot;
      const uint32_t dst = stage_base + uint32_t(lane * box * 128);
      if (evict_first) {  // the loop twice: a branch per box instruction costs 32 instructions
#pragma unroll
        for (int line = 0; line < kLines; ++line) {
          const int col = line * kLineCols;
          sm90::tma_load_4d(dst + line * (kS * 128), tm_k, full, col, c1, c2, bx.page, policy);
          sm90::tma_load_4d(dst + line * (kS * 128) + Tr::kStageKBytes, tm_v, full, col, c1, c2,
                            bx.page, policy);
        }
      } else {
#pragma unroll
        for (int line = 0; line < kLines; ++line) {
          const int col = line * kLineCols;
          sm90::tma_load_4d(dst + line * (kS * 128), tm_k, full, col, c1, c2, bx.page);
          sm90::tma_load_4d(dst + line * (kS * 128) + Tr::kStageKBytes, tm_v, full, col, c1, c2,
                            bx.page);
        }
      }
    }
  }
  const int sub = lane % Rows::kLanesPerRow;  // first chunk of this lane
  const auto* kbase = static_cast<const uint8_t*>(p.k);
  const auto* vbase = static_cast<const uint8_t*>(p.v);
#pragma unroll
  for (int pass = 0; pass < Rows::kPasses; ++pass) {
    const int row = Rows::row(pass);
    const int b = row >> p.box_shift;
    const int key0 = __shfl_sync(0xffffffffu, bx.key0, b);
    const int32_t page = __shfl_sync(0xffffffffu, bx.page, b);
    int j = key0 >= 0 && key0 + (row & (box - 1)) < src.lk ? key0 + (row & (box - 1)) : -1;
    if (!((tma_boxes >> b) & 1u)) {
      int64_t koff = 0, voff = 0;
      if (j >= 0) {
        const int slot = j & (p.page_size - 1);
        if (page < 0 || page >= p.num_pages) {
          if (sub == 0)
            report(p, Offence::page,
                   uint64_t(src.b) * uint64_t(p.max_pages) + uint64_t(j >> p.page_shift),
                   StatusCode::page_id_out_of_range);
          j = -1;
        } else {
          koff =
              (page * p.k_stride_page + slot * p.k_stride_slot + src.h * p.k_stride_head) * kElem;
          voff =
              (page * p.v_stride_page + slot * p.v_stride_slot + src.h * p.v_stride_head) * kElem;
        }
      }
      const uint32_t bytes = j >= 0 ? 16u : 0u;
#pragma unroll
      for (int i = 0; i < Rows::kChunksPerLane; ++i) {
        const int chunk = sub + Rows::kLanesPerRow * i;
        const uint32_t dst = stage_base + tile_offset<kLines, kS>(row, chunk);
        sm80::cp_async_16(dst, kbase + koff + chunk * 16, bytes);
        sm80::cp_async_16(dst + Tr::kStageKBytes, vbase + voff + chunk * 16, bytes);
      }
    }
    if (sub == 0) {
      slot_key[row] = j;
      if (slot_scale) {  // j >= 0: its page is in range (a TMA box, or checked above)
        const int64_t token = j >= 0 ? int64_t(page) * p.page_size + (j & (p.page_size - 1)) : 0;
        stage_scale(p.k_scale, p.k_scale_kind, token, src.h, p.num_kv_heads, j >= 0,
                    slot_scale + row);
        stage_scale(p.v_scale, p.v_scale_kind, token, src.h, p.num_kv_heads, j >= 0,
                    slot_scale + kS + row);
      }
    }
  }
}

// Token ids (kv_block_size 1, sparse; docs/semantics.md, Token-sparse attention): every slot of a
// stage is a union entry of its own, one key anywhere in the request, so a stage has no run of
// consecutive keys for a TMA box, and sm_90's TMA has no gather. Every row is copied by the
// 16-byte cp.async (copy_token_row), as issue_stage copies the rows of partial boxes, spread over
// the warpgroup's 128 threads. TMA boxes of one row were the alternative: 2 x kLines single-line
// box instructions per key (e.g. 512 a stage for 8 warps at D = 128, bf16), all issued by few
// lanes, where cp.async spreads the same rows over 128 threads at 16 per thread and keeps the
// zero fill, the page check and the slot keys of the existing copy path.
//
// Each producer thread looks up the key and page of the rows it copies itself (StageRows: its
// kPasses rows; the kLanesPerRow lanes of a row read the same words, served as one), a stage
// ahead as lookup_stage is, so the page-table latency hides behind the wait for a free stage.
template <KV kKV, int kW, int kD>
struct TokenRows {
  RowSource r[StageRows<kKV, kW, kD>::kPasses];
};

template <KV kKV, int kW, int kD>
__device__ __forceinline__ TokenRows<kKV, kW, kD> lookup_token_rows(const DecodeParams& p,
                                                                    const TileSource& src,
                                                                    int slot0) {
  using Rows = StageRows<kKV, kW, kD>;
  TokenRows<kKV, kW, kD> t;
#pragma unroll
  for (int pass = 0; pass < Rows::kPasses; ++pass)
    t.r[pass] = lookup_row(p, src, slot0 + Rows::row(pass));
  return t;
}

// One row of a token stage, by the kLanesPerRow lanes that own it (StageRows): its K and V by
// 16-byte cp.async that zero-fill a row without a key (j = -1; a key on a page id out of range is
// reported and its row left empty), then, by the row's first lane, its slot key (-1: none) and,
// with per-slot FP8 scales (slot_scale non-null), its K and V scales (stage_scale). The same steps
// as issue_stage's rows outside TMA boxes, kept apart so that the block kernels' code stays as it
// is (issue_stage calling this function changed their register allocation and stack frames).
template <KV kKV, int kW, int kD>
__device__ __forceinline__ void copy_token_row(const DecodeParams& p, const TileSource& src,
                                               int row, int j, int32_t page, uint32_t stage_base,
                                               int* slot_key, float* slot_scale) {
  using Tr = Traits<kKV, kW, kD>;
  using Rows = StageRows<kKV, kW, kD>;
  constexpr int kS = Tr::kStageKeys;
  constexpr int kElem = kByteStage<kKV> ? 1 : 2;
  constexpr int kLines = Tr::kLines;
  const int sub = (threadIdx.x & 31) % Rows::kLanesPerRow;  // first chunk of this lane
  int64_t koff = 0, voff = 0;
  if (j >= 0) {
    const int slot = j & (p.page_size - 1);
    if (page < 0 || page >= p.num_pages) {
      if (sub == 0)
        report(p, Offence::page,
               uint64_t(src.b) * uint64_t(p.max_pages) + uint64_t(j >> p.page_shift),
               StatusCode::page_id_out_of_range);
      j = -1;
    } else {
      koff = (page * p.k_stride_page + slot * p.k_stride_slot + src.h * p.k_stride_head) * kElem;
      voff = (page * p.v_stride_page + slot * p.v_stride_slot + src.h * p.v_stride_head) * kElem;
    }
  }
  const auto* kbase = static_cast<const uint8_t*>(p.k);
  const auto* vbase = static_cast<const uint8_t*>(p.v);
  const uint32_t bytes = j >= 0 ? 16u : 0u;
#pragma unroll
  for (int i = 0; i < Rows::kChunksPerLane; ++i) {
    const int chunk = sub + Rows::kLanesPerRow * i;
    const uint32_t dst = stage_base + tile_offset<kLines, kS>(row, chunk);
    sm80::cp_async_16(dst, kbase + koff + chunk * 16, bytes);
    sm80::cp_async_16(dst + Tr::kStageKBytes, vbase + voff + chunk * 16, bytes);
  }
  if (sub == 0) {
    slot_key[row] = j;
    if (slot_scale) {  // j >= 0: its page is in range (checked above)
      const int64_t token = j >= 0 ? int64_t(page) * p.page_size + (j & (p.page_size - 1)) : 0;
      stage_scale(p.k_scale, p.k_scale_kind, token, src.h, p.num_kv_heads, j >= 0,
                  slot_scale + row);
      stage_scale(p.v_scale, p.v_scale_kind, token, src.h, p.num_kv_heads, j >= 0,
                  slot_scale + kS + row);
    }
  }
}

// Second half of a token stage: every row by cp.async (copy_token_row), no TMA bytes announced,
// so the stage completes with the producers' two arrivals alone (kernel.cuh produce_tokens).
template <KV kKV, int kW, int kD>
__device__ __forceinline__ void issue_token_stage(const DecodeParams& p, const TileSource& src,
                                                  const TokenRows<kKV, kW, kD>& t,
                                                  uint32_t stage_base, int* slot_key,
                                                  float* slot_scale) {
  using Rows = StageRows<kKV, kW, kD>;
#pragma unroll
  for (int pass = 0; pass < Rows::kPasses; ++pass)
    copy_token_row<kKV, kW, kD>(p, src, Rows::row(pass), t.r[pass].key, t.r[pass].page,
                                stage_base, slot_key, slot_scale);
}

}  // namespace msa::cuda::decode
