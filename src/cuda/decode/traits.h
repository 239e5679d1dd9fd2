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
  // Pipeline depth: two tiles in flight per SM are needed to cover HBM latency at a 1/132 share
  // of the bandwidth (~32 KB in flight); bf16 3 x 64 KB stages, fp8 5 x 32 KB.
  static constexpr int kStages = kFp8 ? 5 : 3;
  static constexpr int kStageBytes = 2 * kTileBytes;                // K then V
  static constexpr size_t kPipeBytes = size_t(kStages) * kStageBytes;
  static constexpr size_t kSlotKeyBytes = size_t(kStages) * kTileKeys * sizeof(int);
  // Merge scratch (reuses the pipeline after the last tile): O rows of every warp plus (m, l).
  static constexpr size_t kMergeBytes =
      size_t(kMaxRows) * kOutStride * sizeof(float) + 2 * size_t(kMaxRows) * sizeof(float);

  static_assert(kChunks == 8 || kChunks == 16, "Traits: a row is 8 (fp8) or 16 (bf16) chunks");
  static_assert(kMergeBytes <= kPipeBytes, "Traits: merge scratch must fit in the pipeline smem");
  static_assert(kWarps * 16 == kTileKeys, "Traits: each warp issues the copies of 16 tile rows");
};

// Dynamic shared memory of one CTA: pipeline, slot keys, then (sparse) the union scratch.
template <bool kFp8>
constexpr size_t smem_bytes(int bitmap_words) {
  return Traits<kFp8>::kPipeBytes + Traits<kFp8>::kSlotKeyBytes +
         (bitmap_words > 0 ? size_t(2 * kMaxItemEntries + 2 * bitmap_words + 64) * sizeof(int) : 0);
}

}  // namespace msa::cuda::decode
