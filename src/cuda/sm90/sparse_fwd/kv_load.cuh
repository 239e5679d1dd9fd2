// K/V block loads of the sparse forward producers (load.cuh, uniform_load.cuh): one 128-key block
// of one kv head into a K/V stage, from flat KV or from a page pool (docs/semantics.md, Paged KV).
// The KV-major path loads K and V on one barrier (load_kv_block); the uniform path locates the
// block once and loads K and V on their own barriers (locate_kv_block + load_kv_tile).
//
// Flat: per 64-column half one 128-row box of the 3-D map [total_k, Hkv, D] (4 boxes, 64 KB).
// Paged: boxes of R = min(page_size, 128) slots, one per lane (cuda/common/paged_kv.cuh).
#pragma once

#include "cuda/common/paged_kv.cuh"
#include "cuda/device/sm90.cuh"
#include "cuda/sm90/sparse_fwd/params.h"
#include "cuda/sm90/sparse_fwd/traits.h"

namespace msa::cuda::sparse_fwd {

// Issues this lane's boxes of one tensor (K or V) into the two 64-column halves `dst`,
// completing on `bar`. Call after lane 0 announced the bytes (arrive.expect_tx) and a __syncwarp.
__device__ __forceinline__ void load_kv_tile(const KVBlockSource& src, const CUtensorMap* tm,
                                             uint8_t (&dst)[2][kKVHalfBytes], uint64_t* bar) {
  if (!src.issue) return;
  for (int half = 0; half < 2; ++half) {
    if (src.paged)
      sm90::tma_load_4d(dst[half] + src.row_bytes, tm, bar, half * kHalfCols, src.c1, src.c2,
                        src.c3);
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
  const KVBlockSource src = locate_kv_block(pk, head, k_start, kb, k_len, 2, lane);
  if (lane == 0) sm90::mbar_arrive_expect_tx(&sh.kv_full[s], 2 * src.bytes);
  __syncwarp();  // the bytes are announced before any box can complete
  load_kv_tile(src, tm_k, sh.k[s], &sh.kv_full[s]);
  load_kv_tile(src, tm_v, sh.v[s], &sh.kv_full[s]);
}

}  // namespace msa::cuda::sparse_fwd
