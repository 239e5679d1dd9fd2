// What the CUDA token-sparse builders (token_sparse_slots.cu, group_union.cu) share: the
// fixed-order offence report without scratch memory, the per-row position checks (a hash set of
// the row in shared memory) and the sorted-row lookup (the sort: block_sort.cuh).
//
// Reporting. The ops take no workspace, yet must report the first offence in a fixed order (the
// CPU's), not the first to arrive. The order is a 64-bit key, (class << 56) | index within the
// class, smaller = earlier. A kernel that finds an offence claims the status buffer (word 0: ok ->
// offence_pending; a buffer holding an earlier op's offence is left alone) and folds its key into
// the buffer's aligned 8-byte word (words 2-3, or 1-2 for a buffer only 4-byte aligned) with
// atomicMax of ~key, so the zeroed word means "none". The op's first kernel zeroes that word while
// word 0 is ok; its last kernel (one CTA) turns a pending key into {code, a, b, c}, reading the
// offending values again (the repeat's smallest position is only located there).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "msa/common.h"

namespace msa::cuda::token_sparse {

constexpr unsigned long long kNoOffence = ~0ull;

__device__ __forceinline__ unsigned long long offence_key(uint32_t cls, uint64_t index) {
  return (static_cast<unsigned long long>(cls) << 56) | index;
}
__device__ __forceinline__ uint32_t key_class(unsigned long long key) { return uint32_t(key >> 56); }
__device__ __forceinline__ int64_t key_index(unsigned long long key) {
  return int64_t(key & ((1ull << 56) - 1));
}

__device__ __forceinline__ unsigned long long* key_word(int32_t* status) {
  const bool words23 = reinterpret_cast<uintptr_t>(status + 2) % 8 == 0;
  return reinterpret_cast<unsigned long long*>(words23 ? status + 2 : status + 1);
}

// One thread of the op's first kernel, before any report of the op (the kernel's own reports
// after a __syncthreads).
__device__ __forceinline__ void arm(int32_t* status) {
  if (status[0] == 0) *key_word(status) = 0ull;
}

// Any thread: offence `key` (kNoOffence: nothing).
__device__ __forceinline__ void report(int32_t* status, unsigned long long key) {
  if (key == kNoOffence) return;
  const int32_t pending = int32_t(StatusCode::offence_pending);
  const int32_t old = atomicCAS(status, 0, pending);
  if (old != 0 && old != pending) return;  // an earlier op's offence stays
  atomicMax(key_word(status), ~key);
}

// The finalize kernel, every thread of its CTA: the first key when this op found an offence,
// else kNoOffence (read by one thread, `shared` one word of shared memory). Ends synchronized.
__device__ __forceinline__ unsigned long long pending_key(const int32_t* status,
                                                         unsigned long long* shared) {
  if (threadIdx.x == 0)
    *shared = status[0] == int32_t(StatusCode::offence_pending)
                  ? ~*key_word(const_cast<int32_t*>(status)) : kNoOffence;
  __syncthreads();
  return *shared;
}

// The located offence, word 0 last (it was offence_pending until now).
__device__ __forceinline__ void write_status(int32_t* status, StatusCode code, int64_t a, int64_t b,
                                             int64_t c) {
  status[1] = int32_t(a);
  status[2] = int32_t(b);
  status[3] = int32_t(c);
  __threadfence();
  status[0] = int32_t(code);
}

// Smallest key over the CTA (blockDim.x a multiple of 32, at most 1024); every thread gets it.
// `scratch`: 32 words of shared memory. Ends synchronized.
__device__ __forceinline__ unsigned long long block_min(unsigned long long v,
                                                        unsigned long long* scratch) {
  for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : kNoOffence;
  for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  return v;
}

// Open-addressing set of non-negative int32 keys in shared memory (-1 = empty), `mask + 1`
// slots (a power of two). Returns 1 if `key` was inserted, 0 if it was present, -1 if the table
// is full.
__device__ __forceinline__ int hash_insert(int32_t* table, uint32_t mask, int32_t key) {
  uint32_t h = uint32_t(key) * 0x9E3779B1u;
  h = (h ^ (h >> 15)) & mask;
  for (uint32_t probe = 0; probe <= mask; ++probe) {
    const int32_t old = atomicCAS(&table[h], -1, key);
    if (old == -1) return 1;
    if (old == key) return 0;
    h = (h + 1) & mask;
  }
  return -1;
}

// The power of two >= max(n, lo).
__host__ __device__ __forceinline__ int64_t pow2_at_least(int64_t n, int64_t lo) {
  int64_t p = lo;
  while (p < n) p *= 2;
  return p;
}

// Hash-set slots for a row of k positions: load factor at most 1/2.
__host__ __device__ __forceinline__ int64_t row_table_slots(int64_t k) { return pow2_at_least(2 * k, 64); }

// Offence classes shared by both ops: a position outside [-1, n) (index: the flat entry) before
// a repeat in a row (index: the flat row).
enum RowClass : uint32_t { kRange = 0, kRepeat = 1 };

// The whole CTA checks flat row r (k entries at `row`): every entry in [-1, n), no repeat of an
// in-range position. Returns this thread's smallest offence key (the caller reduces).
// `table`: row_table_slots(k) int32 of shared memory; `flag`: a shared int.
__device__ __forceinline__ unsigned long long check_row(const int32_t* row, int64_t k, int64_t n,
                                                        int64_t r, int32_t* table, int* flag) {
  const uint32_t slots = uint32_t(row_table_slots(k));
  for (uint32_t i = threadIdx.x; i < slots; i += blockDim.x) table[i] = -1;
  if (threadIdx.x == 0) *flag = 0;
  __syncthreads();
  unsigned long long off = kNoOffence;
  for (int64_t e = threadIdx.x; e < k; e += blockDim.x) {
    const int32_t v = row[e];
    if (v == -1) continue;
    if (v < -1 || int64_t(v) >= n) {
      off = min(off, offence_key(kRange, uint64_t(r * k + e)));
      continue;
    }
    if (hash_insert(table, slots - 1, v) == 0) *flag = 1;  // at most k keys: never full
  }
  __syncthreads();
  if (*flag) off = min(off, offence_key(kRepeat, uint64_t(r)));
  return off;
}

// The repeat of flat row r (k entries, bound n) the CPU names: its smallest repeated position
// and the entry of its second occurrence. The whole CTA (a quadratic scan: the error path only);
// `scratch` as for block_min.
__device__ __forceinline__ void locate_repeat(const int32_t* row, int64_t k, int64_t n,
                                              int64_t& value, int64_t& entry,
                                              unsigned long long* scratch) {
  unsigned long long best = kNoOffence;
  for (int64_t e = threadIdx.x; e < k; e += blockDim.x) {
    const int32_t v = row[e];
    if (v < 0 || int64_t(v) >= n) continue;
    for (int64_t j = 0; j < e; ++j)
      if (row[j] == v) {
        best = min(best, (static_cast<unsigned long long>(v) << 32) | uint64_t(e));
        break;
      }
  }
  best = block_min(best, scratch);
  value = int64_t(best >> 32);
  entry = int64_t(best & 0xffffffffu);
}

// The index of `v` in the ascending s[0, n) (v present).
__device__ __forceinline__ int lower_bound(const int32_t* s, int n, int32_t v) {
  int lo = 0, hi = n;
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    if (s[mid] < v) lo = mid + 1; else hi = mid;
  }
  return lo;
}

}  // namespace msa::cuda::token_sparse
