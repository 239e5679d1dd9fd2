// Compile-time shape of the decode kernel per KV element type, CTA width and head dim: stage
// bytes, pipeline depth, warp roles and the shared-memory plan. Read by kernel.cuh, launch.cu
// and the planner (plan.cpp sizes CTAs per SM from smem_bytes).
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

// f32 row stride of the merge scratch: D + 8 words puts the 8 rows of a store phase 8 banks
// apart (D is a multiple of 32), so the 8-byte stores are conflict-free.
template <int kD>
constexpr int kOutStride = kD + 8;

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

template <KV kKV, int kD>
constexpr int kKVRowBytes = kByteStage<kKV> ? kD : 2 * kD;  // one K or V row in a stage
// 128-byte lines per K or V row, one TMA box each; a stage keeps line l of every row in a region
// of its own (load.cuh tile_offset). bf16: D / 64; fp8: D / 128.
template <KV kKV, int kD>
constexpr int kRowLines = kKVRowBytes<kKV, kD> / 128;

template <KV kKV, int kW, int kD>
struct Traits {
  static constexpr int kConsumerThreads = 32 * kW;
  static constexpr int kProducerThreads = 128;                      // warpgroup 0
  static constexpr int kThreads = kProducerThreads + kConsumerThreads;
  // Registers after setmaxnreg: 4 consumer warps launch 2 CTAs per SM at 128 registers
  // (128 x 56 + 128 x 200 = 2 x 128 x 128); 8 launch one at 168 (128 x 72 + 256 x 216 <= 64K).
  // Fewer producer registers spill its lookahead (ptxas). D = 256 moves 16 producer registers to
  // the consumers (48 / 208, 56 / 224; the same totals), whose warps hold 64 Q and 64 O
  // registers. ptxas: FP8 at 4 warps put 1-7 spill instructions into the consumers' step loop at
  // 56 / 200, 0-1 at 48 / 208, and every D = 256 kernel spilled fewer bytes in all.
  static constexpr uint32_t kProducerRegs = kD == 256 ? (kW == 4 ? 48 : 56) : (kW == 4 ? 56 : 72);
  static constexpr uint32_t kConsumerRegs =
      kD == 256 ? (kW == 4 ? 208 : 224) : (kW == 4 ? 200 : 216);
  // Warps sharing a 16-row tile, each with the O of kOutDims head dims (plan.h dim_parts).
  static constexpr int kDimParts = dim_parts(kD);
  static constexpr int kOutDims = kD / kDimParts;
  static constexpr int kMaxRows = 16 * kW / kDimParts;              // 16-row tiles
  // Whether a CTA may hold a chunk of a query's heads (plan.h Geometry::head_chunks): where the
  // 8-warp CTA's rows are fewer than the largest group, 128 (D = 256).
  static constexpr bool kHeadChunks = max_rows(kD) < 128;
  static constexpr int kRowBytes = kKVRowBytes<kKV, kD>;
  static constexpr int kChunks = kRowBytes / 16;                    // 16-byte chunks per row
  static constexpr int kLines = kRowLines<kKV, kD>;
  // A pipeline stage holds K then V of kStageKeys consecutive key slots of the item, 8 KB per
  // warp (64 KB for 8 warps, 32 KB for 4), and each loop step (one barrier, one softmax update
  // per warp) consumes one stage. The step's fixed cost (the stage wait and release, the
  // page-table lookahead, the softmax shuffles and exp chain) does not shrink with the element
  // size: with 32 KB fp8 steps in the 8-warp CTA, fp8 ran at bf16's time per tile (DEC-MTP 389 vs
  // 366 us), so a step moves the same bytes for every kind and head dim, i.e. fp8 steps cover
  // twice the keys, D = 64 twice and D = 256 half those of D = 128. Slots at D = 128: 8 warps
  // bf16 128 (one tile), fp8 256; 4 warps bf16 64, fp8 128.
  static constexpr int kStageBytes = kW * 8 * 1024;
  static constexpr int kStageKeys = kStageBytes / (2 * kRowBytes);
  static constexpr int kStageKBytes = kStageKeys * kRowBytes;       // K of a stage; V follows
  // Key slots of a consumer warp's attend window (kernel.cuh consume, attend.cuh): 64, so that
  // the window's fixed cost (slot-key loads, reductions, the softmax update) spreads over 64 keys;
  // 32 for FP8 at D = 256, whose 64-key window (its e4m3 conversions beside 64 Q, 64 O and 32 S
  // registers) spilled in the step loop (ptxas: 4-25 spill instructions at either width, with
  // the consumer registers below; none at 8 warps and one reload per step at 4 with 32 keys).
  static constexpr int kWindowKeys = kByteStage<kKV> && kD == 256 ? 32 : 64;
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
      size_t(kStageKeys) * (2 * (kD / 2 + kD / 16) + sizeof(int));
  static constexpr size_t kRawBytes = size_t(kRawStages) * kRawStageBytes;
  static constexpr size_t kSlotKeyBytes = size_t(kStages) * kStageKeys * sizeof(int);
  static constexpr size_t kBarrierBytes = size_t(kStages) * sizeof(uint64_t);  // full
  // FP8 with per-slot scales (params.h slot_scales): each stage's K then V scale of every slot.
  static constexpr size_t kScaleBytes =
      kKV == KV::fp8 ? size_t(kStages) * 2 * kStageKeys * sizeof(float) : 0;
  // Merge scratch (reuses the pipeline after the last stage): O rows of every warp plus (m, l) and
  // a merge weight per row.
  static constexpr size_t kMergeBytes =
      size_t(kMaxRows) * kOutStride<kD> * sizeof(float) + 3 * size_t(kMaxRows) * sizeof(float);

  static_assert(kW == 4 || kW == 8, "Traits: CTAs of 4 or 8 warps");
  static_assert(is_decode_head_dim(kD), "Traits: head dim 64, 128 or 256");
  static_assert(kKV != KV::nvfp4 || kD == 128, "Traits: NVFP4 KV at head dim 128 only");
  // FP8 rows of 64 bytes would fill half a 128-byte swizzle line, a layout neither the TMA boxes
  // nor the consumers' ldmatrix addressing have (api/decode.cpp refuses FP8 KV at D = 64).
  static_assert(kRowBytes % 128 == 0, "Traits: rows of whole 128-byte lines");
  static_assert(uint32_t(NamedBarrier::kStageEmpty0) + kStages - 1 <=
                    uint32_t(NamedBarrier::kStageEmpty2),
                "Traits: one NamedBarrier::kStageEmpty id per stage");
  static_assert(kMergeBytes <= kPipeBytes, "Traits: merge scratch must fit in the pipeline smem");
  // A warp's key window within a stage (kStageKeys / kp keys, kp >= 1, in steps of at most 64)
  // never straddles two kv blocks (64 or 128 keys), so one union mask covers it.
  static_assert(kStageKeys % 64 == 0 || 64 % kStageKeys == 0,
                "Traits: 64-key attend windows must not straddle blocks");
  // Every warp of a one-row-tile CTA (kW / kDimParts key partitions) attends whole 16-key
  // k-steps of P V: 16 keys each at D = 256 (4 warps bf16: 32 slots over 2 partitions).
  static_assert(kStageKeys % (16 * kW / kDimParts) == 0,
                "Traits: a one-row-tile CTA's warps split a stage into windows of 16 keys or more");
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
template <KV kKV, int kW, int kD>
constexpr size_t smem_bytes(int bitmap_words) {
  using Tr = Traits<kKV, kW, kD>;
  return 1024 + Tr::kPipeBytes + Tr::kRawBytes + Tr::kSlotKeyBytes + Tr::kBarrierBytes +
         union_bytes<kW>(bitmap_words) + Tr::kScaleBytes;
}

}  // namespace msa::cuda::decode
