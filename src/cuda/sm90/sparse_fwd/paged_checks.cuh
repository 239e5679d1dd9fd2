// Device-side checks of a paged KV cache for the sparse forward (DESIGN.md s.6 and s.9), enqueued
// by launch.cu before the q2k check: seqused_k in [0, max_pages * page_size], and every page id
// that a batch's seqused_k uses in [0, num_pages). The first offence goes to the status buffer
// (lengths by batch, then page ids by (batch, column)); nothing reads outside the page table's
// used columns. The clamped lengths become a flat cu_seqlens_k (key_offsets) that the rest of
// the launch uses. Kernels included only by launch.cu.
#pragma once

#include <cub/block/block_scan.cuh>

#include <climits>

#include "cuda/sm90/sparse_fwd/params.h"
#include "cuda/sm90/sparse_fwd/scheduler.cuh"
#include "msa/common.h"

namespace msa::cuda::sparse_fwd {

// Offence key: class (0 lengths, 1 page ids), then linear index, then the status code; the
// smallest key is the first offence. ~0 = none.
constexpr unsigned long long kNoPagedOffence = ~0ull;
__device__ __forceinline__ void report_paged(const PagedCheckParams& p, uint64_t cls,
                                             uint64_t index, StatusCode code) {
  atomicMin(p.offence, static_cast<unsigned long long>((cls << 60) | (index << 4) | uint64_t(code)));
}

// One block: re-arms the offence key, checks and clamps each batch's length, and writes
// key_offsets = exclusive prefix of the clamped lengths (fits int32: B * max_keys < 2^31).
__global__ void __launch_bounds__(kPrepThreads) paged_lengths_kernel(PagedCheckParams p) {
  using Scan = cub::BlockScan<int, kPrepThreads>;
  __shared__ typename Scan::TempStorage tmp;
  if (threadIdx.x == 0) *p.offence = kNoPagedOffence;
  __syncthreads();
  int carry = 0;
  for (int64_t base = 0; base <= p.batch; base += kPrepThreads) {
    const int64_t b = base + threadIdx.x;
    int lk = 0;
    if (b < p.batch) {
      const int64_t want = p.seqused_k ? int64_t(p.seqused_k[b]) : p.max_keys;
      if (want < 0) report_paged(p, 0, uint64_t(b), StatusCode::bad_cu_seqlens);
      else if (want > p.max_keys) report_paged(p, 0, uint64_t(b), StatusCode::shape_mismatch);
      lk = int(min(max(want, int64_t(0)), p.max_keys));
    }
    int excl = 0, agg = 0;
    Scan(tmp).ExclusiveSum(lk, excl, agg);
    if (b <= p.batch) p.key_offsets[b] = carry + excl;
    carry += agg;
    __syncthreads();
  }
}

// One thread per page-table entry (grid-stride): columns [0, ceil(Lk_b / page_size)) of row b
// must hold ids in [0, num_pages); later columns are never read.
__global__ void page_check_kernel(PagedCheckParams p) {
  const int64_t n = p.batch * p.max_pages;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t b = i / p.max_pages, col = i % p.max_pages;
    const int64_t lk = int64_t(p.key_offsets[b + 1]) - p.key_offsets[b];
    if (col * p.page_size >= lk) continue;
    const int32_t id = p.page_table[b * p.page_table_stride + col];
    if (id < 0 || id >= p.num_pages) report_paged(p, 1, uint64_t(i), StatusCode::page_id_out_of_range);
  }
}

// One thread: the first offence into the status buffer, unless it already holds one.
__global__ void paged_finalize_kernel(PagedCheckParams p) {
  const unsigned long long key = *p.offence;
  if (key == kNoPagedOffence || p.status[0] != 0) return;
  const auto code = StatusCode(key & 0xf);
  const int64_t index = int64_t((key & ((1ull << 60) - 1)) >> 4);
  int32_t a = 0, b = 0, c = 0;
  if ((key >> 60) == 0) {  // lengths of batch `index`
    if (code == StatusCode::bad_cu_seqlens) {  // {which = 1 (keys), batch}, as the q2k check
      a = 1;
      b = int32_t(index);
    } else {  // shape_mismatch {batch, seqused_k, max_pages * page_size}
      a = int32_t(index);
      b = p.seqused_k[index];
      c = int32_t(min(p.max_keys, int64_t(INT_MAX)));
    }
  } else {  // page_id_out_of_range {batch, column, id}
    a = int32_t(index / p.max_pages);
    b = int32_t(index % p.max_pages);
    c = p.page_table[(index / p.max_pages) * p.page_table_stride + index % p.max_pages];
  }
  set_status(p.status, code, a, b, c);
}

}  // namespace msa::cuda::sparse_fwd
