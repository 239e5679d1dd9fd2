// FP8 e4m3 or FP4 (NVFP4, MXFP4) K/V, and FP8 q, to bf16 for the sparse prefill (docs/semantics.md,
// Quantized attention): each key the call can read, value * scale rounded to bf16, into a flat [rows, Hkv, D] copy in the
// workspace that the bf16 kernels then read as flat KV. Flat caches keep their key rows; a page
// pool's batches land at the paged check's key_offsets (its clamped lengths). Launched by
// sm90/sparse_fwd/launch.cu after the prep chain (PDL), before the main kernels.
//
// Bytes at P32K (32768 keys x 4 kv heads x 128): 33.6 MB of e4m3 read, 67 MB of bf16 written,
// ~25 us at the 4.27 TB/s copy rate next to the 3.6-7.7 ms attention it feeds.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/paged_kv.cuh"

namespace msa::cuda {

enum class KVFormat : int32_t { fp8, nvfp4, mxfp4 };

struct DequantKVParams {
  KVFormat format = KVFormat::fp8;
  // FP8: e4m3 [.., D] with f32 scales by kind; FP4: packed e2m1 [.., D / 2] bytes with byte
  // scales laid out like the values, [.., D / group] (NVFP4: e4m3 per 16 values, times the
  // global scale; MXFP4: e8m0 per 32), element strides in k_scale_stride / v_scale_stride.
  const uint8_t* k = nullptr;      // e4m3: flat [total_k, Hkv, D]; paged pool nhd
  const uint8_t* v = nullptr;      // [pages, slots, Hkv, D] or hnd [pages, Hkv, slots, D]
  int32_t head_dim = 128;          // D: 64, 128 or 256 (k_raw: 128)
  int64_t k_stride[3] = {};        // elements of dims 0-2 (the last is contiguous)
  int64_t v_stride[3] = {};
  int32_t paged = 0;               // 0 flat, 1 pool nhd, 2 pool hnd
  const void* k_scale = nullptr;   // FP8: f32 [1] | [T] | [T, Hkv] (T: flat keys or pool slots),
  const void* v_scale = nullptr;   // or null; FP4: the byte scales
  int32_t k_scale_kind = 0, v_scale_kind = 0;  // FP8: common/problem.h fp8_scale_kind
  int64_t k_scale_stride[3] = {}, v_scale_stride[3] = {};  // FP4: elements of dims 0-2
  float k_global = 1.f, v_global = 1.f;                     // NVFP4 global scales
  const int32_t* cu_seqlens_k = nullptr;  // flat: [B+1] source rows
  int64_t total_k = 0;                    // flat: rows of k / v
  PagedKV pool;                           // paged: the page table, page count and size
  const int32_t* out_offsets = nullptr;   // [B+1] first output row of each batch (flat: cu_seqlens_k)
  int64_t out_rows = 0;                   // rows of k_out / v_out
  int32_t batch = 0, num_kv_heads = 0;
  int64_t max_keys = 0;                   // keys of one batch at most (grid size)
  void* k_out = nullptr;                  // [out_rows, Hkv, D] bf16 (k_raw: e4m3)
  void* v_out = nullptr;
  // FP8 QK (the sparse forward's kFp8 kernels take e4m3 K): K's bytes copied as they are and its
  // scales, one per (head, key), into k_scale_out [Hkv, k_scale_out_stride] f32; V as above.
  int32_t k_raw = 0;
  float* k_scale_out = nullptr;
  int64_t k_scale_out_stride = 0;
};

// FP8 e4m3 queries for the sparse prefill: their values, exactly (every e4m3 value is a bf16),
// into a contiguous bf16 [total_q, Hq, D] copy in the workspace, which the bf16 kernels read as
// q; the q scales join each row's score scale there (sparse_fwd/params.h row_scale_log2). At
// P32K (32768 x 64 heads x 128): 268 MB read, 537 MB written, ~0.2 ms beside the 3.6-7.7 ms
// attention.
struct DequantQParams {
  const uint8_t* q = nullptr;  // e4m3 [total_q, Hq, D], rows 16-byte aligned
  int64_t stride_t = 0, stride_h = 0;  // elements
  int32_t heads = 0;
  int32_t head_dim = 128;              // D: 64, 128 or 256
  int64_t total_q = 0;
  void* out = nullptr;                 // [total_q, Hq, D] bf16, contiguous
};
void launch_dequant_q(const DequantQParams& p, cudaStream_t stream);

// Enqueued with PDL; reads out_offsets (and the page table) only after the earlier kernels.
// Bad lengths or page ids (reported by the checks before it) are skipped, never read.
void launch_dequant_kv(const DequantKVParams& p, cudaStream_t stream);

}  // namespace msa::cuda
