// Device bodies of the q2k / cu_seqlens check (index_checks.cuh), shared by the check's own
// kernels (index_checks.cu) and the fused prep kernel of the sparse forward
// (sm90/sparse_fwd/prep_fused.cu): the cu_seqlens test of one entry, the staged q2k test over a
// grid's blocks, and the report of the first offence.
#pragma once

#include <climits>
#include <cstdint>

#include "cuda/common/index_checks.cuh"
#include "cuda/device/status.cuh"
#include "msa/common.h"

namespace msa::cuda {

// First-offence key: smaller is earlier. cu_seqlens offences (class 0) sort before q2k (class 1);
// within a class by linear index, then code. 0xffff... = no offence.
constexpr uint64_t kNoOffence = ~0ull;
__device__ __forceinline__ uint64_t offence_key(uint64_t cls, uint64_t index, uint64_t code) {
  return (cls << 60) | (index << 4) | code;
}

// Entry i of cu_seqlens_q / cu_seqlens_k (i in [0, B]; others return) and seqused_k[i].
__device__ __forceinline__ void check_cu_seqlens_entry(const Q2KCheckParams& p, int64_t i,
                                                       unsigned long long* first) {
  if (i > p.batch) return;
  for (int which = 0; which < 2; ++which) {
    const int32_t* cu = which == 0 ? p.cu_seqlens_q : p.keys.cu_seqlens_k;
    if (cu == nullptr) continue;
    const int64_t total = which == 0 ? p.total_q : p.keys.total_k;
    bool bad = (i == 0) ? cu[0] != 0 : cu[i] < cu[i - 1];
    if (i == p.batch && total >= 0 && cu[i] != total) bad = true;
    if (bad) {
      const uint64_t code = uint64_t(StatusCode::bad_cu_seqlens);
      atomicMin(first, offence_key(0, uint64_t(i) * 2 + which, code));
    }
  }
  if (p.keys.seqused_k && i < p.batch && p.keys.seqused_k[i] < 0)
    atomicMin(first, offence_key(0, uint64_t(i) * 2 + 1, uint64_t(StatusCode::bad_cu_seqlens)));
}

constexpr int kQ2KStagedThreads = 256;  // block size of the staged body
constexpr int kQ2KStagedEntries = 2048;  // q2k entries a block stages in shared memory per step

// Blocks of whole q2k rows staged in shared memory (coalesced loads), one thread per entry:
// range test against the row's batch, then a repeat test against the row's earlier slots. Run by
// blocks `block` of `blocks` (grid-stride over steps), kQ2KStagedThreads threads each, for
// topk <= kQ2KStagedMaxTopk (index_checks.cuh).
__device__ inline void check_q2k_staged_body(const Q2KCheckParams& p, unsigned long long* first,
                                      int64_t block, int64_t blocks) {
  constexpr int kThreads = kQ2KStagedThreads, kStagedEntries = kQ2KStagedEntries;
  __shared__ int32_t ids[kStagedEntries];
  __shared__ int32_t row_nblk[kStagedEntries];
  __shared__ int32_t head_valid[kStagedEntries];  // valid_per_head: counts of this step's heads
  __shared__ int32_t row_head[kStagedEntries];    // ... and each row's index among them
  const int topk = int(p.topk);
  const int per_step = kStagedEntries / topk;  // rows per step
  const int64_t rows = p.num_kv_heads * p.total_q;
  for (int64_t row0 = block * per_step; row0 < rows; row0 += blocks * per_step) {
    const int n_rows = int(rows - row0 < per_step ? rows - row0 : per_step), n = n_rows * topk;
    const int32_t* src = p.q2k + row0 * topk;
    int32_t v[kStagedEntries / kThreads];  // every load in flight before the stores
#pragma unroll
    for (int u = 0; u < kStagedEntries / kThreads; ++u) {
      const int e = u * kThreads + int(threadIdx.x);
      v[u] = e < n ? src[e] : 0;
    }
#pragma unroll
    for (int u = 0; u < kStagedEntries / kThreads; ++u) {
      const int e = u * kThreads + int(threadIdx.x);
      if (e < n) ids[e] = v[u];
    }
    for (int r = threadIdx.x; r < n_rows; r += kThreads) {
      const int64_t b = find_batch(p.cu_seqlens_q, p.batch, (row0 + r) % p.total_q);
      const int64_t lk = batch_keys(p.keys, b);
      const int64_t nblk = lk > 0 ? (lk + p.kv_block_size - 1) / p.kv_block_size : 0;
      row_nblk[r] = int(nblk < INT32_MAX ? nblk : INT32_MAX);
      row_head[r] = int((row0 + r) / p.total_q - row0 / p.total_q);
    }
    const int64_t h_first = row0 / p.total_q;
    const int n_heads = int((row0 + n_rows - 1) / p.total_q - h_first) + 1;
    if (p.valid_per_head)
      for (int i = threadIdx.x; i < n_heads; i += kThreads) head_valid[i] = 0;
    __syncthreads();
    for (int e = threadIdx.x; e < n; e += kThreads) {
      const int r = e / topk, s = e - r * topk;
      const int32_t id = ids[e];
      if (p.valid_per_head && id >= 0 && id < row_nblk[r])
        atomicAdd(&head_valid[row_head[r]], 1);
      if (id == -1) continue;
      uint64_t code = 0;
      if (id < -1 || id >= row_nblk[r]) {
        code = uint64_t(StatusCode::block_id_out_of_range);
      } else {
        for (int q = r * topk; q < e; ++q)
          if (ids[q] == id) { code = uint64_t(StatusCode::block_id_repeated); break; }
      }
      if (code) atomicMin(first, offence_key(1, uint64_t((row0 + r) * topk + s), code));
    }
    __syncthreads();
    if (p.valid_per_head)
      for (int i = threadIdx.x; i < n_heads; i += kThreads)
        if (head_valid[i]) atomicAdd(&p.valid_per_head[h_first + i], head_valid[i]);
    __syncthreads();  // the flush reads head_valid before the next step zeroes it
  }
}

// One thread: the first offence `key` into the status buffer (unless it already holds one).
__device__ __forceinline__ void report_q2k_offence(const Q2KCheckParams& p, uint64_t key,
                                                   int32_t* status) {
  if (key == kNoOffence) return;
  const int32_t code = int32_t(key & 0xf);
  const uint64_t index = (key & ((1ull << 60) - 1)) >> 4;
  if ((key >> 60) == 0) {  // cu_seqlens: index = batch * 2 + which
    flag_status(status, code, int64_t(index & 1), int64_t(index >> 1), 0);
  } else {  // q2k: index = (h * total_q + t) * topk + s
    const uint64_t s = index % uint64_t(p.topk), row = index / uint64_t(p.topk);
    flag_status(status, code, int64_t(row / uint64_t(p.total_q)),
                int64_t(row % uint64_t(p.total_q)), int64_t(s));
  }
}

}  // namespace msa::cuda
