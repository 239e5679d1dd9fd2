// Kernel arguments of the SDSA indexer's CUDA ops (msa/sdsa.h). Device pointers; strides in
// elements of the tensor's dtype (bytes for fp4x2 values and e4m3 scales). Filled by launch.cu.
#pragma once

#include <cstdint>

#include "msa/common.h"

namespace msa::cuda::sdsa_sm90 {

// The key formats a score kernel is instantiated for.
enum class KeyFormat : int { bf16, f16, nvfp4 };

// The paged key cache of one key head.
struct CacheView {
  const void* keys = nullptr;       // [num_pages, page_size, D] (fp4x2: D / 2 bytes a row)
  const uint8_t* scale = nullptr;   // NVFP4: e4m3 [num_pages, page_size, D / 16]
  int64_t key_s0 = 0, key_s1 = 0;
  int64_t scale_s0 = 0, scale_s1 = 0;
  float global_scale = 1.f;
  bool vec = false;                 // rows 16-byte (bf16/f16) or 8-byte (NVFP4) aligned
  bool vec16 = false;               // NVFP4: D % 64 == 0, code rows 16-byte, scale rows 4-byte aligned
  const int32_t* block_table = nullptr;  // [B, W]
  int64_t bt_s0 = 0;
  const int32_t* seq_lens = nullptr;     // [B]
  int32_t batch = 0, max_pages = 0, page_size = 1;
  int32_t page_shift = -1;               // log2(page_size) when a power of two
  int64_t num_pages = 0;
  int32_t dim = 0;
};

// Query rows and the keys each one sees.
struct RowsView {
  const void* query = nullptr;      // [T, D] bf16 | f16, or fp4x2 [T, D / 2]
  const uint8_t* scale = nullptr;   // NVFP4: e4m3 [T, D / 16]
  int64_t q_s0 = 0, scale_s0 = 0;
  float global_scale = 1.f;
  DType dtype = DType::bf16;
  const int32_t* row_requests = nullptr;  // [T]
  const int32_t* row_lens = nullptr;      // [T] or null: the request's seq_len
  int32_t rows = 0;
};

struct ScoresParams {
  RowsView rows;
  CacheView cache;
  float* scores = nullptr;  // [T, width], row stride out_s0
  int64_t out_s0 = 0;
  int64_t width = 0;
  int32_t* status = nullptr;
};

struct SelectParams {
  RowsView rows;
  CacheView cache;
  const float* thresholds = nullptr;  // [T]
  int32_t* candidates = nullptr;      // [T, cap, 2]
  int32_t* ties = nullptr;            // [T, tie_cap]
  int32_t* counts = nullptr;          // [T, 3]
  int32_t cap = 1, tie_cap = 0;
  int32_t* status = nullptr;
};

}  // namespace msa::cuda::sdsa_sm90
