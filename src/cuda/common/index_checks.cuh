// Device-side index checks (docs/semantics.md: k2q CSR, Errors): q2k block ids and cu_seqlens are
// validated on the GPU without reading out of bounds. The first offence (cu_seqlens before q2k,
// then in (head, token, slot) order) is written to the op's status buffer. Called by GPU ops that
// take q2k (the CSR builder, attention); asynchronous and graph-capturable.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace msa::cuda {

// Where batch b's key count comes from: flat (cu_seqlens_k[b+1] - cu_seqlens_k[b]) or paged
// (seqused_k[b], or `max_keys` when seqused_k is null).
struct KeyLengths {
  const int32_t* cu_seqlens_k = nullptr;  // [B+1] or null (paged)
  const int32_t* seqused_k = nullptr;     // [B] or null
  int64_t max_keys = 0;                   // paged without seqused_k: max_pages * page_size
  int64_t total_k = -1;                   // flat: cu_seqlens_k[B] must equal this (-1: unchecked)
};

struct Q2KCheckParams {
  const int32_t* q2k = nullptr;           // [Hkv, total_q, topk], contiguous
  const int32_t* cu_seqlens_q = nullptr;  // [B+1]
  KeyLengths keys;
  int64_t batch = 0;
  int64_t num_kv_heads = 0;
  int64_t total_q = 0;
  int64_t topk = 0;
  int64_t kv_block_size = 128;
  // Optional [Hkv] device counts (zeroed by launch_q2k_check): the q2k ids in [0, nblk_b) of
  // each kv head, i.e. the entries an exact k2q CSR of this q2k holds per head.
  int32_t* valid_per_head = nullptr;
};

// Scratch the check needs (one 64-bit first-offence key).
constexpr size_t kQ2KCheckWorkspaceBytes = 256;

// q2k rows up to this topk are checked staged in shared memory, a thread per entry
// (index_check_device.cuh; also the fused prep of the sparse forward); longer rows by the row
// kernel's ascending test (a few shuffles an entry), cheaper once the staged repeat test reads
// topk / 2 earlier slots an entry on average. A crossover estimated from operation counts, not
// timed.
constexpr int kQ2KStagedMaxTopk = 256;

// Validates cu_seqlens_q / cu_seqlens_k (start at 0, non-decreasing, last == total) and every
// q2k id (in [-1, nblk_b), not repeated within a row). Leaves `status` untouched if it already
// holds an error; otherwise writes the first offence. `workspace`: kQ2KCheckWorkspaceBytes,
// 8-byte aligned, device memory.
void launch_q2k_check(const Q2KCheckParams& p, void* workspace, int32_t* status,
                      cudaStream_t stream);

// The last i in [0, n) with starts[i] <= x, for non-decreasing starts, by binary search over a
// possibly corrupt array (always returns i in [0, n) for n >= 1, never reads outside [0, n)).
__device__ __forceinline__ int64_t last_le(const int32_t* starts, int64_t n, int64_t x) {
  int64_t lo = 0, hi = n - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (starts[mid] <= x) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// Batch of token t (0 <= t < total): the b with cu[b] <= t < cu[b+1].
__device__ __forceinline__ int64_t find_batch(const int32_t* cu, int64_t batch, int64_t t) {
  return last_le(cu, batch, t);
}

__device__ __forceinline__ int64_t batch_keys(const KeyLengths& k, int64_t b) {
  if (k.cu_seqlens_k) return int64_t(k.cu_seqlens_k[b + 1]) - k.cu_seqlens_k[b];
  return k.seqused_k ? int64_t(k.seqused_k[b]) : k.max_keys;
}

}  // namespace msa::cuda
