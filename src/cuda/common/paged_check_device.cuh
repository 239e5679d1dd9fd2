// Device bodies of the paged-KV checks (paged_checks.cuh), shared by the checks' own kernels
// (paged_checks.cu) and the fused prep kernel of the sparse forward (sm90/sparse_fwd/prep.cu).
#pragma once

#include <cub/block/block_scan.cuh>

#include <climits>
#include <cstdint>

#include "cuda/common/paged_checks.cuh"
#include "cuda/device/status.cuh"
#include "msa/common.h"

namespace msa::cuda {

// Offence key: class (0 lengths, 1 page ids), then linear index, then the status code; the
// smallest key is the first offence. ~0 = none.
constexpr unsigned long long kNoPagedOffence = ~0ull;
__device__ __forceinline__ unsigned long long paged_offence_key(uint64_t cls, uint64_t index,
                                                                StatusCode code) {
  return static_cast<unsigned long long>((cls << 60) | (index << 4) | uint64_t(code));
}

// Batch b's key count, clamped to [0, max_keys]; an out-of-range seqused_k lowers `offence`.
__device__ __forceinline__ int64_t checked_length(const PagedCheckParams& p, int64_t b,
                                                  unsigned long long& offence) {
  const int64_t want = p.seqused_k ? int64_t(p.seqused_k[b]) : p.max_keys;
  if (want < 0) offence = min(offence, paged_offence_key(0, uint64_t(b), StatusCode::bad_cu_seqlens));
  else if (want > p.max_keys)
    offence = min(offence, paged_offence_key(0, uint64_t(b), StatusCode::kv_length_past_table));
  return min(max(want, int64_t(0)), p.max_keys);
}

// Page-table entry i = b * max_pages + column of a batch with `lk` keys: its offence key when
// the column holds keys and its id is outside [0, num_pages); later columns are never read.
__device__ __forceinline__ unsigned long long page_offence(const PagedCheckParams& p, int64_t i,
                                                            int64_t lk) {
  const int64_t b = i / p.max_pages, col = i % p.max_pages;
  if (col * p.page_size >= lk) return kNoPagedOffence;
  const int32_t id = p.page_table[b * p.page_table_stride + col];
  return id < 0 || id >= p.num_pages ? paged_offence_key(1, uint64_t(i), StatusCode::page_id_out_of_range)
                                     : kNoPagedOffence;
}

// One thread: offence `key` into the status buffer, unless it already holds one.
__device__ inline void report_paged_offence(const PagedCheckParams& p, unsigned long long key) {
  if (key == kNoPagedOffence) return;
  const auto code = StatusCode(key & 0xf);
  const int64_t index = int64_t((key & ((1ull << 60) - 1)) >> 4);
  if ((key >> 60) == 0 && code == StatusCode::bad_cu_seqlens)  // {which = 1 (keys), batch}
    flag_status(p.status, int32_t(code), 1, index, 0);
  else if ((key >> 60) == 0)  // kv_length_past_table {batch, seqused_k, max_pages * page_size}
    flag_status(p.status, int32_t(code), index, p.seqused_k[index], min(p.max_keys, int64_t(INT_MAX)));
  else  // page_id_out_of_range {batch, column, id}
    flag_status(p.status, int32_t(code), index / p.max_pages, index % p.max_pages,
                p.page_table[(index / p.max_pages) * p.page_table_stride + index % p.max_pages]);
}

// One block of kT threads: re-arms the offence key, checks and clamps each batch's length, and
// writes key_offsets = exclusive prefix of the clamped lengths (fits int32: B * max_keys < 2^31,
// a host check).
template <int kT>
__device__ void paged_lengths_body(const PagedCheckParams& p) {
  using Scan = cub::BlockScan<int, kT>;
  __shared__ typename Scan::TempStorage tmp;
  if (threadIdx.x == 0) *p.offence = kNoPagedOffence;
  __syncthreads();
  unsigned long long offence = kNoPagedOffence;
  int carry = 0;
  for (int64_t base = 0; base <= p.batch; base += kT) {
    const int64_t b = base + threadIdx.x;
    const int lk = b < p.batch ? int(checked_length(p, b, offence)) : 0;
    int excl = 0, agg = 0;
    Scan(tmp).ExclusiveSum(lk, excl, agg);
    if (b <= p.batch) p.key_offsets[b] = carry + excl;
    carry += agg;
    __syncthreads();
  }
  if (offence != kNoPagedOffence) atomicMin(p.offence, offence);
}

// Page-table entries thread, thread + threads, ... (lengths from key_offsets).
__device__ __forceinline__ void page_check_body(const PagedCheckParams& p, int64_t thread,
                                                int64_t threads) {
  const int64_t n = p.batch * p.max_pages;
  for (int64_t i = thread; i < n; i += threads) {
    const int64_t b = i / p.max_pages;
    const unsigned long long key = page_offence(p, i, int64_t(p.key_offsets[b + 1]) - p.key_offsets[b]);
    if (key != kNoPagedOffence) atomicMin(p.offence, key);
  }
}

}  // namespace msa::cuda
