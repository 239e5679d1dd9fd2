// K/V block loads of the sparse forward producers (load.cuh, uniform_load.cuh): one block (128 or
// 64 keys) of one kv head into a K/V stage, from flat KV or from a page pool (docs/semantics.md,
// Paged KV).
// The KV-major path loads K and V on one barrier (load_kv_block); the uniform path locates the
// block once and loads K and V on their own barriers (locate_kv_block + load_kv_tile).
//
// Flat: per 64-column half one box of the block's rows of the 3-D map [total_k, Hkv, D] (128 keys:
// 4 boxes, 64 KB). Paged: boxes of R = min(page_size, keys) slots, one per lane
// (cuda/common/paged_kv.cuh).
#pragma once

#include "cuda/common/paged_kv.cuh"
#include "cuda/device/sm90.cuh"
#include "cuda/sm90/sparse_fwd/params.h"
#include "cuda/sm90/sparse_fwd/traits.h"

namespace msa::cuda::sparse_fwd {

// Issues this lane's boxes of one tensor (K or V) into the kHalves 64-column halves `dst` (D / 64),
// completing on `bar`. Call after lane 0 announced the bytes (arrive.expect_tx) and a __syncwarp.
// kAt: a flat block lands at src.row_bytes too (the second block of a 64-key pair; a paged box
// always lands at its row_bytes).
template <int kHalves, int kBytes, bool kAt = false>
__device__ __forceinline__ void load_kv_tile(const KVBlockSource& src, const CUtensorMap* tm,
                                             uint8_t (&dst)[kHalves][kBytes], uint64_t* bar) {
  if (!src.issue) return;
  for (int half = 0; half < kHalves; ++half) {
    if (src.paged)
      sm90::tma_load_4d(dst[half] + src.row_bytes, tm, bar, half * kHalfCols, src.c1, src.c2,
                        src.c3);
    else
      sm90::tma_load_3d(dst[half] + (kAt ? src.row_bytes : 0), tm, bar, half * kHalfCols, src.c1,
                        src.c2);
  }
}

// One query token's G rows (heads head_row ..) into a Q buffer at row_bytes: a 64-column box of
// 16-bit q per half, or one 128-byte box of e4m3 q (half 0; kFp8, D = 128). q_bytes_per_row: its
// barrier's bytes.
template <bool kFp8, int kHalves>
constexpr uint32_t q_bytes_per_row() { return (kFp8 ? 1 : 2) * kHalves * kHalfCols; }
template <bool kFp8, int kHalves>
__device__ __forceinline__ void load_q_token(uint8_t (&buf)[kHalves][kQHalfBytes], int row_bytes,
                                             const CUtensorMap* tm_q, uint64_t* bar,
                                             int32_t head_row, int32_t tok) {
  sm90::tma_load_3d(buf[0] + row_bytes, tm_q, bar, 0, head_row, tok);
  if constexpr (!kFp8)
    for (int half = 1; half < kHalves; ++half)
      sm90::tma_load_3d(buf[half] + row_bytes, tm_q, bar, half * kHalfCols, head_row, tok);
}

// Bytes of K's boxes on its barrier: a 16-bit tile (src.bytes, located for 16-bit rows), or with
// kFp8 the e4m3 tile, one 128-byte row per key: half of that.
template <bool kFp8>
__device__ __forceinline__ uint32_t k_tile_bytes(const KVBlockSource& src) {
  return kFp8 ? src.bytes / 2 : src.bytes;
}

// K of a block into a stage: the 16-bit tile (load_kv_tile), or with kFp8 the e4m3 tile (one box
// of 128-byte rows into half 0). kFp8 kernels read the flat copy that launch.cu makes (src.c1 =
// head, src.c2 = the block's first key row). kAt: as load_kv_tile (the e4m3 rows of a pair's
// second block land at src.row_bytes of half 0, 64 rows of 128 bytes in).
template <bool kFp8, bool kAt = false, int kHalves, int kBytes>
__device__ __forceinline__ void load_k_tile(const KVBlockSource& src, const CUtensorMap* tm_k,
                                            uint8_t (&dst)[kHalves][kBytes], uint64_t* bar) {
  if constexpr (kFp8) {
    if (src.issue)
      sm90::tma_load_3d(dst[0] + (kAt ? src.row_bytes : 0), tm_k, bar, 0, src.c1, src.c2);
  } else {
    load_kv_tile<kHalves, kBytes, kAt>(src, tm_k, dst, bar);
  }
}

// FP8 QK: kv_full counts, besides lane 0's arrive.expect_tx, one arrival of each producer lane
// made when its cp.async copies have landed (kKScaleArrivals). Every publish makes them: with
// `copy`, the key scales of a stage of kKeys keys (128, or 64: a 64-key block of the KV-major
// kernel) go to `dst` first, kKeys / 32 per lane (zeros past the copy's rows). Rows [0, kKeys / 2)
// are those from key row `key0` of kv head `head` on, rows [kKeys / 2, kKeys) those from `key0_hi`
// on: key0 + kKeys / 2 for one block, a 64-key pair's second block (uniform_load.cuh) otherwise.
// Warp-collective.
constexpr uint32_t kKScaleArrivals = 32;
template <int kKeys>
__device__ __forceinline__ void load_key_scales(const AttnProblem& p, bool copy, int32_t head,
                                                int32_t key0, int32_t key0_hi, float* dst,
                                                uint64_t* bar, int lane) {
  static_assert(kKeys == 128 || kKeys == 64, "a stage's scales: 4 or 2 per lane");
  constexpr int kPerLane = kKeys / 32;
  if (copy) {
    const float* row = p.kscale + int64_t(head) * p.kscale_stride;
    const uint32_t d = sm90::smem_addr(dst) + lane * 4 * kPerLane;
    // Lanes 0-15 copy rows [0, kKeys / 2), lanes 16-31 the rest (key0_hi - kKeys / 2 + their row).
    const int32_t first = (lane < 16 ? key0 : key0_hi - kKeys / 2) + lane * kPerLane;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int32_t key = first + i;
      const bool in = key < p.kscale_rows;
      sm90::cp_async_4(d + 4 * i, row + (in ? key : 0), in ? 4u : 0u);
    }
  }
  sm90::cp_async_mbar_arrive(bar);
}

// K and V of a block of kBlk keys into stage s (the KV-major path): lane 0 arrives with the exact
// byte count, then the boxes. Warp-collective, after the stage's kv_empty wait and after lane 0
// wrote the stage's info struct (released by the same arrive). Both on kv_full[s]; with a V ring
// of its own (KVMajorTraits::kSplitV) K and the key scales there, then V into its one stage on
// v_full[0] once v_empty[0] passes with v_empty_parity (every consumer done with the previous
// chunk's V).
template <bool kFp8, int kBlk, int kD>
__device__ __forceinline__ void load_kv_block(const AttnProblem& p, const CUtensorMap* tm_k,
                                              const CUtensorMap* tm_v,
                                              KVMajorStorage<kBlk, kD>& sh, int s,
                                              int32_t head, int32_t k_start, int32_t kb,
                                              int32_t k_len, int lane, uint32_t v_empty_parity) {
  static_assert(!kFp8 || kD == kHeadDim, "FP8 K tiles are 128-byte rows: D = 128");
  const KVBlockSource src =
      locate_kv_block<kBlk>(p.paged, head, k_start, kb, k_len, kD / 64, lane);
  if constexpr (kFp8)
    load_key_scales<kBlk>(p, true, head, src.c2, src.c2 + kBlk / 2, sh.kscale[s], &sh.kv_full[s],
                          lane);
  if constexpr (KVMajorTraits<kBlk, kD>::kSplitV) {
    static_assert(block_keys_of(kD, kBlk) == kBlk, "one box of keys a block");
    if (lane == 0) sm90::mbar_arrive_expect_tx(&sh.kv_full[s], k_tile_bytes<kFp8>(src));
    __syncwarp();
    load_k_tile<kFp8>(src, tm_k, sh.k[s], &sh.kv_full[s]);
    sm90::mbar_wait(&sh.v_empty[0], v_empty_parity);
    if (lane == 0) sm90::mbar_arrive_expect_tx(&sh.v_full[0], src.bytes);
    __syncwarp();
    load_kv_tile(src, tm_v, sh.v[0], &sh.v_full[0]);
    return;
  }
  if (lane == 0) sm90::mbar_arrive_expect_tx(&sh.kv_full[s], k_tile_bytes<kFp8>(src) + src.bytes);
  __syncwarp();  // the bytes are announced before any box can complete
  constexpr int kBoxKeys = block_keys_of(kD, kBlk);
  if constexpr (kBoxKeys < kBlk) {
    // Flat maps of 64-row boxes (D = 256: the uniform kernel's stages, launch.cu) under a 128-key
    // block: two boxes a half, the second 64 rows on. (Pool boxes already hold at most 64 slots,
    // one a lane.)
    if (!src.paged && src.issue)
      for (int half = 0; half < kD / kHalfCols; ++half)
        for (int b = 0; b < kBlk / kBoxKeys; ++b)
          for (int t = 0; t < 2; ++t)
            sm90::tma_load_3d((t ? sh.v[s][half] : sh.k[s][half]) + b * kBoxKeys * 128,
                              t ? tm_v : tm_k, &sh.kv_full[s], half * kHalfCols, src.c1,
                              src.c2 + b * kBoxKeys);
    if (!src.paged) return;
  }
  load_k_tile<kFp8>(src, tm_k, sh.k[s], &sh.kv_full[s]);
  load_kv_tile(src, tm_v, sh.v[s], &sh.kv_full[s]);
}

}  // namespace msa::cuda::sparse_fwd
