// Launchers of the SDSA indexer kernels (one compile unit each: scores.cu, select.cu, rows.cu,
// writes.cu), called by launch.cu with filled parameters. None synchronizes or allocates.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/sm90/sdsa/params.h"

namespace msa::cuda::sdsa_sm90 {

// Head dims whose decoded query (D doubles) fits the scoring block's shared memory.
constexpr int kMaxDim = 4096;

void launch_scores(const ScoresParams& p, KeyFormat f, cudaStream_t stream);
void launch_select(const SelectParams& p, KeyFormat f, cudaStream_t stream);

struct TopKParams {
  const int32_t* candidates = nullptr;  // [T, cap, 2]
  const int32_t* ties = nullptr;        // [T, tie_cap]
  const int32_t* counts = nullptr;      // [T, 3]
  int32_t* ids = nullptr;               // [T, topk]
  int32_t* row_status = nullptr;        // [T]
  int64_t rows = 0, cap = 1, tie_cap = 0;
  int32_t topk = 1;
};
void launch_top_k(const TopKParams& p, cudaStream_t stream);

struct ThresholdParams {
  const float* scores = nullptr;  // [T, width], row stride s0
  int64_t s0 = 0, width = 0, rows = 0;
  int64_t rank = 1;               // sdsa::threshold_rank
  float* thresholds = nullptr;    // [T]
  int32_t* counts = nullptr;      // [T, 3]
};
void launch_thresholds(const ThresholdParams& p, cudaStream_t stream);

struct GatherParams {
  CacheView cache;
  int32_t stride = 1;
  const int32_t* offsets = nullptr;  // [B] or null
  uint8_t* sample = nullptr;         // [B, S, row bytes], strides in bytes
  int64_t sample_s0 = 0, sample_s1 = 0;
  uint8_t* sample_scale = nullptr;   // NVFP4: [B, S, D / 16] bytes
  int64_t sscale_s0 = 0, sscale_s1 = 0;
  int64_t capacity = 0;              // S
  int32_t row_bytes = 0, scale_bytes = 0;
  int64_t key_s0_bytes = 0, key_s1_bytes = 0;
  bool vec = false;                  // every row 16-byte aligned and a multiple of 16 bytes
  int32_t* sample_lens = nullptr;    // [B]
  int32_t* status = nullptr;
};
void launch_gather(const GatherParams& p, cudaStream_t stream);

// NVFP4 encoding of [n, D] rows (f32 | bf16 | f16) into codes and scales; with slots, row i goes
// to pool slot slots[i] (page slot / page_size).
struct EncodeParams {
  const void* x = nullptr;
  DType dtype = DType::f32;
  int64_t x_s0 = 0, n = 0;
  int32_t dim = 0;
  const int32_t* slots = nullptr;  // null: row i to output row i
  int64_t page_size = 1, pool = 0;
  uint8_t* codes = nullptr;
  int64_t codes_s0 = 0, codes_s1 = 0;  // bytes: (page, slot) or (row, -)
  uint8_t* scales = nullptr;
  int64_t scales_s0 = 0, scales_s1 = 0;
  float global_scale = 1.f;
  int32_t* status = nullptr;
};
void launch_encode(const EncodeParams& p, cudaStream_t stream);

}  // namespace msa::cuda::sdsa_sm90
