// Compile-time shape of the decode kernel per KV element type and CTA width: stage bytes,
// pipeline depth and the shared-memory plan. Read by kernel.cuh, launch.cu and the planner
// (plan.cpp sizes CTAs per SM from smem_bytes).
//
// A CTA is one producer warpgroup (page lookups, the TMA boxes and the cp.async copies of partial
// boxes of every stage, at few registers) and kW consumer warps (the math, at many), handing stages
// over by mbarriers, so a consumer's step is its math alone. Two widths (plan.cpp picks one per
// plan): 8 consumer warps for up to 128 query rows (dense multi-query), one CTA per SM; 4 for up to
// 64 rows, with half the stage bytes so that two CTAs share an SM and one's prologue (union build,
// first loads) and epilogue (merge, partial write) hide behind the other's streaming.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda/sm90/decode/plan.h"

namespace msa::cuda::decode {

constexpr int kOutStride = kHeadDim + 8;  // f32 row stride of the merge scratch: no bank conflicts

// Named barriers of the decode kernel (bar.sync / bar.arrive ids; 0 is __syncthreads). Stage s of
// the pipeline is freed through kStageEmpty0 + s (kernel.cuh empty_barrier): consumers arrive,
// producers sync before refilling it.
enum class NamedBarrier : uint32_t {
  kConsumers = 1,      // the consumer warps: merge scratch hand-over, merge, split combine
  kProducersExit = 2,  // the producer warpgroup after its last copy, before the CTA is counted
  kStageEmpty0 = 3,    // stage 0 consumed
  kStageEmpty1 = 4,    // stage 1 consumed
  kStageEmpty2 = 5,    // stage 2 consumed (Traits::kStages = 3)
};

// The K/V element kinds of the pool, one kernel each.
//   native: K/V of q's type (bf16 / f16); the MMAs run on q's type.
//   fp8:    e4m3 bytes staged as they are; the consumers convert them to f16 in registers
//           (attend.cuh), with per-tensor or per-slot scales.
//   nvfp4:  packed e2m1 with an e4m3 scale per 16 values (and a per-tensor global scale); the
//           producers copy the packed rows into a ring of their own and write value * scale, exact
//           in f16, into stages of the native layout (load_fp4.cuh). The consumers then read f16
//           stages as the native path reads bf16 ones.
enum class KV : int { native, fp8, nvfp4 };
// Stage rows of e4m3 bytes (the fp8 layout of load.cuh tile_offset and attend's conversions).
template <KV kKV>
constexpr bool kByteStage = kKV == KV::fp8;
// f16 MMAs over scaled K/V, q brought to f16 (attend.cuh prescale_q_f16).
template <KV kKV>
constexpr bool kF16Math = kKV != KV::native;

template <KV kKV>
constexpr int kKVRowBytes = kByteStage<kKV> ? kHeadDim : 2 * kHeadDim;  // one K or V row in a stage

template <KV kKV, int kW>
struct Traits {
  static constexpr int kConsumerThreads = 32 * kW;
  static constexpr int kProducerThreads = 128;                      // warpgroup 0
  static constexpr int kThreads = kProducerThreads + kConsumerThreads;
  // Registers after setmaxnreg: 4 consumer warps launch 2 CTAs per SM at 128 registers
  // (128 x 56 + 128 x 200 = 2 x 128 x 128); 8 launch one at 168 (128 x 72 + 256 x 216 <= 64K).
  // Fewer producer registers spill its lookahead (ptxas).
  static constexpr uint32_t kProducerRegs = kW == 4 ? 56 : 72;
  static constexpr uint32_t kConsumerRegs = kW == 4 ? 200 : 216;
  static constexpr int kMaxRows = 16 * kW;                          // 16-row tiles, one per warp
  static constexpr int kRowBytes = kKVRowBytes<kKV>;
  static constexpr int kChunks = kRowBytes / 16;                    // 16-byte chunks per row
  // A pipeline stage holds K then V of kStageKeys consecutive key slots of the item, 8 KB per
  // warp (64 KB for 8 warps, 32 KB for 4), and each loop step (one barrier, one softmax update
  // per warp) consumes one stage. The step's fixed cost (the stage wait and release, the
  // page-table lookahead, the softmax shuffles and exp chain) does not shrink with the element
  // size: with 32 KB fp8 steps in the 8-warp CTA, fp8 ran at bf16's time per tile (DEC-MTP 389 vs
  // 366 us), so a step moves the same bytes for both kinds, i.e. fp8 steps cover
  // twice the keys. Slots: 8 warps bf16 128 (one tile), fp8 256; 4 warps bf16 64, fp8 128.
  static constexpr int kStageBytes = kW * 8 * 1024;
  static constexpr int kStageKeys = kStageBytes / (2 * kRowBytes);
  static constexpr int kStageKBytes = kStageKeys * kRowBytes;       // K of a stage; V follows
  // Each producer warp copies kRowsPerWarp rows of every stage (load.cuh).
  static constexpr int kRowsPerWarp = kStageKeys / 4;
  // Pipeline depth: kStages - 1 stages in flight while one is consumed, per SM 128 KB with
  // either width (one 8-warp CTA or two 4-warp CTAs): enough to cover HBM latency at a 1/132
  // share of the bandwidth (~32 KB in flight needed). 8 warps: 3 x 64 KB = 192 KB (+ slot keys +
  // union scratch <= 227 KB: smem_bytes below, checked in launch_kernels.cuh); 4 warps: 96 KB.
  //
  // NVFP4 converts into 2 stages: its latency hiding is the packed ring below, 3 deep, and a
  // third 64 KB f16 stage would not fit beside it.
  static constexpr int kStages = kKV == KV::nvfp4 ? 2 : 3;
  static constexpr size_t kPipeBytes = size_t(kStages) * kStageBytes;
  // NVFP4: the producers' ring of packed stages (load_fp4.cuh Fp4Ring), after the pipeline.
  static constexpr int kRawStages = kKV == KV::nvfp4 ? 3 : 0;
  static constexpr size_t kRawStageBytes =
      size_t(kStageKeys) * (2 * (kHeadDim / 2 + kHeadDim / 16) + sizeof(int));
  static constexpr size_t kRawBytes = size_t(kRawStages) * kRawStageBytes;
  static constexpr size_t kSlotKeyBytes = size_t(kStages) * kStageKeys * sizeof(int);
  static constexpr size_t kBarrierBytes = size_t(kStages) * sizeof(uint64_t);  // full
  // FP8 with per-slot scales (params.h slot_scales): each stage's K then V scale of every slot.
  static constexpr size_t kScaleBytes =
      kKV == KV::fp8 ? size_t(kStages) * 2 * kStageKeys * sizeof(float) : 0;
  // Merge scratch (reuses the pipeline after the last stage): O rows of every warp plus (m, l) and
  // a merge weight per row.
  static constexpr size_t kMergeBytes =
      size_t(kMaxRows) * kOutStride * sizeof(float) + 3 * size_t(kMaxRows) * sizeof(float);

  static_assert(kW == 4 || kW == 8, "Traits: CTAs of 4 or 8 warps");
  static_assert(uint32_t(NamedBarrier::kStageEmpty0) + kStages - 1 <=
                    uint32_t(NamedBarrier::kStageEmpty2),
                "Traits: one NamedBarrier::kStageEmpty id per stage");
  static_assert(kChunks == 8 || kChunks == 16, "Traits: a row is 8 (fp8) or 16 (bf16) chunks");
  static_assert(kMergeBytes <= kPipeBytes, "Traits: merge scratch must fit in the pipeline smem");
  // A warp's key window within a stage (kStageKeys / kp keys, kp >= 1, in steps of at most 64)
  // never straddles two kv blocks (64 or 128 keys), so one union mask covers it.
  static_assert(kStageKeys % 64 == 0, "Traits: 64-key attend windows must not straddle blocks");
  static_assert(kTileKeys % kStageKeys == 0 || kStageKeys % kTileKeys == 0,
                "Traits: stages and 128-slot tiles nest");
};

// Sparse union scratch (union.cuh: ids, masks, 8 warps also pages; bitmap, prefix, scan).
template <int kW>
constexpr size_t union_bytes(int bitmap_words) {
  const size_t entry_arrays = kW == 8 ? 3 : 2;
  return bitmap_words > 0
             ? (entry_arrays * kMaxItemEntries + 2 * size_t(bitmap_words) + 64) * sizeof(int)
             : 0;
}

// Dynamic shared memory of one CTA: pipeline, slot keys, stage barriers, the union scratch, then
// the FP8 slot scales (last, so that kernels without them address everything as before), plus
// the slack that puts the pipeline on a 1024-byte boundary (kernel.cuh). Every FP8 plan reserves
// the scales' room: the planner sizes CTAs per SM without knowing the scales' kind. NVFP4's packed
// ring follows the pipeline (kRawBytes, 0 for the other kinds).
template <KV kKV, int kW>
constexpr size_t smem_bytes(int bitmap_words) {
  using Tr = Traits<kKV, kW>;
  return 1024 + Tr::kPipeBytes + Tr::kRawBytes + Tr::kSlotKeyBytes + Tr::kBarrierBytes +
         union_bytes<kW>(bitmap_words) + Tr::kScaleBytes;
}

}  // namespace msa::cuda::decode
