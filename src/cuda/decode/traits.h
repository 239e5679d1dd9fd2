// Compile-time shape of the decode kernel per KV element type: tile bytes, pipeline depth and the
// shared-memory plan. Read by decode/kernel.cuh and decode/launch.cu.
#pragma once

#include <cstddef>

#include "cuda/decode/plan.h"

namespace msa::cuda::decode {

constexpr int kThreads = 256;  // 8 warps: row tiles x key partitions (kernel.cuh)
constexpr int kWarps = kThreads / 32;
constexpr int kOutStride = kHeadDim + 8;  // f32 row stride of the merge scratch: no bank conflicts

template <bool kFp8>
struct Traits {
  static constexpr int kRowBytes = kFp8 ? kHeadDim : 2 * kHeadDim;  // one K or V row
  static constexpr int kChunks = kRowBytes / 16;                    // 16-byte chunks per row
  static constexpr int kTileBytes = kTileKeys * kRowBytes;          // K (or V) of one tile
  // A pipeline stage holds kTilesPerStage consecutive tiles (K rows of all of them, then their
  // V rows), and each loop step (one barrier, one softmax update per warp) consumes one stage.
  // The step's fixed cost (cp.async wait + __syncthreads, the page-table lookahead, the softmax
  // shuffles and exp chain) does not shrink with the element size: with one 32 KB fp8 tile per
  // step, fp8 ran at bf16's time per tile (DEC-MTP 389 vs 366 us, RESULTS.md). Two fp8 tiles
  // per stage make a step move 64 KB, as a bf16 step does.
  static constexpr int kTilesPerStage = kFp8 ? 2 : 1;
  static constexpr int kStageKeys = kTilesPerStage * kTileKeys;     // key slots of a stage
  static constexpr int kStageKBytes = kStageKeys * kRowBytes;       // K of a stage; V follows
  // Pipeline depth: kStages - 1 stages (128 KB, bf16 2 tiles, fp8 4 tiles) in flight while one
  // is consumed; two 64 KB tiles in flight per SM cover HBM latency at a 1/132 share of the
  // bandwidth (~32 KB in flight needed). Both kinds: 3 x 64 KB = 192 KB (+ slot keys + union
  // scratch <= 227 KB: smem_bytes below, checked in launch_kernels.cuh).
  static constexpr int kStages = 3;
  static constexpr int kStageBytes = 2 * kStageKBytes;              // K then V
  static constexpr size_t kPipeBytes = size_t(kStages) * kStageBytes;
  static constexpr size_t kSlotKeyBytes = size_t(kStages) * kStageKeys * sizeof(int);
  // Merge scratch (reuses the pipeline after the last tile): O rows of every warp plus (m, l).
  static constexpr size_t kMergeBytes =
      size_t(kMaxRows) * kOutStride * sizeof(float) + 2 * size_t(kMaxRows) * sizeof(float);

  static_assert(kChunks == 8 || kChunks == 16, "Traits: a row is 8 (fp8) or 16 (bf16) chunks");
  static_assert(kStageBytes == 64 * 1024, "Traits: a stage is 64 KB of K and V for both kinds");
  static_assert(kMergeBytes <= kPipeBytes, "Traits: merge scratch must fit in the pipeline smem");
  static_assert(kWarps * 16 == kTileKeys, "Traits: each warp issues the copies of 16 tile rows");
  // A warp's key window within a stage (kStageKeys / kp keys, kp >= 1, in steps of at most 64)
  // never straddles two tiles, so one tile index (and one union mask) covers it.
  static_assert(kTileKeys % 64 == 0, "Traits: 64-key attend windows must not straddle tiles");
};

// Dynamic shared memory of one CTA: pipeline, slot keys, then (sparse) the union scratch.
template <bool kFp8>
constexpr size_t smem_bytes(int bitmap_words) {
  return Traits<kFp8>::kPipeBytes + Traits<kFp8>::kSlotKeyBytes +
         (bitmap_words > 0 ? size_t(2 * kMaxItemEntries + 2 * bitmap_words + 64) * sizeof(int) : 0);
}

}  // namespace msa::cuda::decode
