// The decode main kernel: one CTA per (work item, kv head). It checks its request, builds the
// sparse union (union.cuh), streams the item's tiles through a cp.async pipeline (load.cuh),
// lets each warp attend its (row tile, key partition) share of every tile (attend.cuh) and
// merges the warps (epilogue.cuh); the last CTA to finish writes the status (status.cuh).
// Included by launch_kernels.cuh only.
//
// Warp roles: rows = queries x G (<= 128) form nrt 16-row tiles; the 8 warps split as
// nrt row tiles x kp key partitions (kp = 8, 4, 2, 1 for nrt = 1, 2, 3-4, 5-8), warp w taking
// row tile w % nrt and keys [kpi * 128 / kp, ...) of every tile, kpi = w / nrt.
#pragma once

#include "cuda/decode/epilogue.cuh"
#include "cuda/decode/union.cuh"

namespace msa::cuda::decode {

template <typename TQ, bool kFp8>
__global__ void __launch_bounds__(kThreads, 1) decode_kernel(const __grid_constant__ DecodeParams p) {
  using Tr = Traits<kFp8>;
  extern __shared__ __align__(128) uint8_t smem[];
  const int hkv = p.num_kv_heads;
  const int64_t item_index = blockIdx.x / hkv;
  const int h = int(blockIdx.x % hkv);
  const DecodeItem item = p.items[item_index];
  const Request rq = load_request(p, item.batch, threadIdx.x == 0);
  const int q0 = item.chunk * p.queries_per_chunk;
  const int nq = min(p.queries_per_chunk, rq.lq - q0);
  if (!rq.ok || nq <= 0) {  // bad cu_seqlens (reported), or fewer queries than this chunk
    arrive_and_finalize(p);
    return;
  }
  const int rows = nq << p.group_shift;
  const int64_t t0 = rq.q_begin + q0;

  const uint32_t pipe = smem_u32(smem);
  int* slot_key = reinterpret_cast<int*>(smem + Tr::kPipeBytes);
  TileSource src;
  src.b = item.batch;
  src.h = h;
  src.lk = rq.lk;
  const uint32_t* masks = nullptr;
  const int epb = kTileKeys >> p.block_shift;  // sparse: union entries per tile
  int last_tile;                               // tiles at or past it hold no key
  if (p.q2k) {
    const UnionSmem u = union_smem(smem + Tr::kPipeBytes + Tr::kSlotKeyBytes, p.bitmap_words);
    src.e0 = item.tile_begin * epb;
    src.union_size = build_union(p, u, h, t0, nq, rq.lk, src.e0, item.tile_end * epb);
    src.ids = u.ids;
    masks = u.masks;
    last_tile = (src.union_size + epb - 1) / epb;
  } else {
    last_tile = (rq.lk + kTileKeys - 1) / kTileKeys;
  }
  const int tiles = max(0, min(item.tile_end, last_tile) - item.tile_begin);

  // Pipeline steps: one stage of kTps consecutive tiles each (traits.h); with an odd tile count
  // the last fp8 stage holds one tile and its second half is never issued nor read.
  constexpr int kTps = Tr::kTilesPerStage;
  const int steps = (tiles + kTps - 1) / kTps;

  // Prologue: the page-table reads of the first kStages - 1 stages in flight together, then
  // their copies; then the reads of the next stage, consumed by the first loop iteration.
  TileRows<kFp8> first[Tr::kStages - 1][kTps], ahead[kTps];
#pragma unroll
  for (int s = 0; s < Tr::kStages - 1; ++s)
#pragma unroll
    for (int u = 0; u < kTps; ++u)
      if (s * kTps + u < tiles) lookup_tile<kFp8>(p, src, item.tile_begin + s * kTps + u, first[s][u]);
#pragma unroll
  for (int s = 0; s < Tr::kStages - 1; ++s) {
#pragma unroll
    for (int u = 0; u < kTps; ++u)
      if (s * kTps + u < tiles)
        issue_tile<kFp8>(p, src, first[s][u], pipe + s * Tr::kStageBytes + u * Tr::kTileBytes,
                         slot_key + s * Tr::kStageKeys + u * kTileKeys);
    cp_async_commit();
  }
#pragma unroll
  for (int u = 0; u < kTps; ++u)
    if ((Tr::kStages - 1) * kTps + u < tiles)
      lookup_tile<kFp8>(p, src, item.tile_begin + (Tr::kStages - 1) * kTps + u, ahead[u]);

  const int nrt = (rows + 15) >> 4;
  const int kp = nrt == 1 ? 8 : nrt == 2 ? 4 : nrt <= 4 ? 2 : 1;
  const int kw = Tr::kStageKeys / kp;  // keys per warp per stage: bf16 16..128, fp8 32..256
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const bool active = warp < nrt * kp;
  const int rt = warp % nrt, kpi = warp / nrt;
  const float k_mult = kFp8 && p.k_scale ? *p.k_scale : 1.f;
  const float v_mult = kFp8 && p.v_scale ? *p.v_scale : 1.f;
  WarpTile<TQ, kFp8> w;
  load_q(w, p, active ? rt : 0, active ? rows : 0, t0, h, q0, rq.lq, rq.lk, k_mult);

  for (int it = 0; it < steps; ++it) {
    cp_async_wait<Tr::kStages - 2>();
    __syncthreads();  // stage it landed for all threads; stage (it - 1) % kStages is free
    const int next = it + Tr::kStages - 1;
    if (next < steps) {
#pragma unroll
      for (int u = 0; u < kTps; ++u)
        if (next * kTps + u < tiles)
          issue_tile<kFp8>(p, src, ahead[u],
                           pipe + (next % Tr::kStages) * Tr::kStageBytes + u * Tr::kTileBytes,
                           slot_key + (next % Tr::kStages) * Tr::kStageKeys + u * kTileKeys);
    }
    cp_async_commit();
    if (next + 1 < steps) {
#pragma unroll
      for (int u = 0; u < kTps; ++u)
        if ((next + 1) * kTps + u < tiles)
          lookup_tile<kFp8>(p, src, item.tile_begin + (next + 1) * kTps + u, ahead[u]);
    }
    if (!active) continue;
    const int stage = it % Tr::kStages, tile = item.tile_begin + it * kTps;
    const uint32_t k_stage = pipe + stage * Tr::kStageBytes;
    const int* sk = slot_key + stage * Tr::kStageKeys;
    for (int kb = kpi * kw; kb < (kpi + 1) * kw; kb += 64) {
      // The window's tile was never issued (odd tile count): its slot keys are stale.
      if constexpr (kTps > 1)
        if (it * kTps + kb / kTileKeys >= tiles) continue;
      const int nn = min(8, kw / 8);
      bool sel0 = true, sel1 = true;
      if (masks) {  // union entries run on across the stage's tiles: entry of slot kb
        const uint32_t m = masks[tile * epb + (kb >> p.block_shift) - src.e0];
        sel0 = (m & w.qbit[0]) != 0;
        sel1 = (m & w.qbit[1]) != 0;
      }
      const bool has_key = (lane < 8 * nn && sk[kb + lane] >= 0) ||
                           (lane + 32 < 8 * nn && sk[kb + lane + 32] >= 0);
      if (!__any_sync(0xffffffffu, has_key) || !__any_sync(0xffffffffu, sel0 || sel1)) continue;
      attend(w, k_stage, k_stage + Tr::kStageKBytes, sk, kb, nn, sel0, sel1);
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // pipeline drained: its smem becomes the merge scratch

  const MergeSmem ms = merge_smem(smem);
  if (active) store_warp(w, ms, kpi * 16 * nrt + rt * 16 + (lane >> 2));
  __syncthreads();
  merge_and_write<TQ>(p, ms, rows, nrt, kp, item.partial, h, t0, v_mult);
  arrive_and_finalize(p);
}

}  // namespace msa::cuda::decode
