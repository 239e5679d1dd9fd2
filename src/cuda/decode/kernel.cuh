// The decode main kernel: one CTA per (work item, kv head). It checks its request, builds the
// sparse union (union.cuh), streams the item's key slots through a cp.async pipeline of stages
// (load.cuh), lets each warp attend its (row tile, key partition) share of every stage
// (attend.cuh) and merges the warps (epilogue.cuh); the last split of a request merges the splits
// (combine.cuh) and the last CTA to finish writes the status (status.cuh). Included by
// launch_kernels.cuh only.
//
// Warp roles: rows = queries x G (<= 16 kW) form nrt 16-row tiles; the kW warps split as
// nrt row tiles x kp key partitions (kp the largest power of two <= kW / nrt), warp w taking
// row tile w % nrt and keys [kpi * S / kp, ...) of every stage of S slots, kpi = w / nrt.
#pragma once

#include "cuda/decode/combine.cuh"
#include "cuda/decode/union.cuh"

namespace msa::cuda::decode {

template <typename TQ, bool kFp8, int kW>
__global__ void __launch_bounds__(Traits<kFp8, kW>::kThreads, kW == 4 ? 2 : 1)
    decode_kernel(const __grid_constant__ DecodeParams p) {
  using Tr = Traits<kFp8, kW>;
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
    src.union_size = build_union<kW>(p, u, h, t0, nq, rq.lk, src.e0, item.tile_end * epb);
    src.ids = u.ids;
    masks = u.masks;
    last_tile = (src.union_size + epb - 1) / epb;
  } else {
    last_tile = (rq.lk + kTileKeys - 1) / kTileKeys;
  }
  const int tiles = max(0, min(item.tile_end, last_tile) - item.tile_begin);
  const int s0 = item.tile_begin * kTileKeys;  // the item's first slot
  src.slot_end = s0 + tiles * kTileKeys;

  // Pipeline steps: one stage of kStageKeys consecutive slots each; the slots of a last stage
  // past the item are zero-filled with key -1 (lookup_stage) and skipped by the math.
  constexpr int kS = Tr::kStageKeys;
  const int steps = (tiles * kTileKeys + kS - 1) / kS;

  // Prologue: the page-table reads of the first kStages - 1 stages in flight together, then
  // their copies; then the reads of the next stage, consumed by the first loop iteration.
  StageRows<kFp8, kW> first[Tr::kStages - 1], ahead;
#pragma unroll
  for (int s = 0; s < Tr::kStages - 1; ++s)
    if (s < steps) lookup_stage(p, src, s0 + s * kS, first[s]);
#pragma unroll
  for (int s = 0; s < Tr::kStages - 1; ++s) {
    if (s < steps) issue_stage(p, src, first[s], pipe + s * Tr::kStageBytes, slot_key + s * kS);
    cp_async_commit();
  }
  if (Tr::kStages - 1 < steps) lookup_stage(p, src, s0 + (Tr::kStages - 1) * kS, ahead);

  const int nrt = (rows + 15) >> 4;
  const int kp_max = kW / nrt;
  const int kp = kp_max >= 8 ? 8 : kp_max >= 4 ? 4 : kp_max >= 2 ? 2 : 1;
  const int kw = kS / kp;  // keys per warp per stage: 16..256
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
    if (next < steps)
      issue_stage(p, src, ahead, pipe + (next % Tr::kStages) * Tr::kStageBytes,
                  slot_key + (next % Tr::kStages) * kS);
    cp_async_commit();
    if (next + 1 < steps) lookup_stage(p, src, s0 + (next + 1) * kS, ahead);
    if (!active) continue;
    const int stage = it % Tr::kStages, slot0 = s0 + it * kS;
    const uint32_t k_stage = pipe + stage * Tr::kStageBytes;
    const int* sk = slot_key + stage * kS;
    for (int kb = kpi * kw; kb < (kpi + 1) * kw; kb += 64) {
      if (slot0 + kb >= src.slot_end) break;  // past the item (a last, partial stage)
      const int nn = min(8, kw / 8);
      bool sel0 = true, sel1 = true;
      if (masks) {  // the union entry of the window's slots
        const uint32_t m = masks[((slot0 + kb) >> p.block_shift) - src.e0];
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

  const MergeSmem ms = merge_smem(smem, Tr::kMaxRows);
  if (active) store_warp(w, ms, kpi * 16 * nrt + rt * 16 + (lane >> 2));
  __syncthreads();
  merge_and_write<TQ, Tr::kThreads>(p, ms, rows, nrt, kp, item.partial, h, t0, v_mult);
  if (item.partial >= 0) finish_split<TQ, Tr::kThreads>(p, item.job, h, rows, t0);
  arrive_and_finalize(p);
}

}  // namespace msa::cuda::decode
