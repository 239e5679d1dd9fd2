// Kernels of the device-side index checks (index_checks.cuh): q2k rows staged per block in shared
// memory (one thread per entry; one thread per row for very long rows), one thread per
// cu_seqlens entry, and a single-thread finalize that turns the first-offence key into the
// status buffer.
#include <algorithm>
#include <climits>
#include <cstdint>

#include "cuda/common/index_checks.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/device/check.h"
#include "cuda/device/status.cuh"
#include "msa/common.h"

namespace msa::cuda {
namespace {

// First-offence key: smaller is earlier. cu_seqlens offences (class 0) sort before q2k (class 1);
// within a class by linear index, then code. 0xffff... = no offence.
constexpr uint64_t kNoOffence = ~0ull;
__device__ __forceinline__ uint64_t offence_key(uint64_t cls, uint64_t index, uint64_t code) {
  return (cls << 60) | (index << 4) | code;
}

__global__ void check_cu_seqlens_kernel(Q2KCheckParams p, unsigned long long* first) {
  pdl_wait();
  pdl_trigger();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
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

constexpr int kThreads = 256;
constexpr int kStagedEntries = 2048;  // q2k entries a block stages in shared memory per step

// Blocks of whole q2k rows staged in shared memory (coalesced loads), one thread per entry:
// range test against the row's batch, then a repeat test against the row's earlier slots.
// For topk <= kStagedEntries; check_q2k_kernel below takes larger rows one thread per row.
__global__ void __launch_bounds__(kThreads) check_q2k_staged_kernel(Q2KCheckParams p,
                                                                    unsigned long long* first) {
  __shared__ int32_t ids[kStagedEntries];
  __shared__ int32_t row_nblk[kStagedEntries];
  __shared__ int32_t head_valid[kStagedEntries];  // valid_per_head: counts of this step's heads
  __shared__ int32_t row_head[kStagedEntries];    // ... and each row's index among them
  pdl_wait();
  pdl_trigger();
  const int topk = int(p.topk);
  const int per_step = kStagedEntries / topk;  // rows per step
  const int64_t rows = p.num_kv_heads * p.total_q;
  for (int64_t row0 = int64_t(blockIdx.x) * per_step; row0 < rows;
       row0 += int64_t(gridDim.x) * per_step) {
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

__global__ void check_q2k_kernel(Q2KCheckParams p, unsigned long long* first) {
  pdl_wait();
  pdl_trigger();
  const int64_t row = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;  // h * total_q + t
  if (row >= p.num_kv_heads * p.total_q) return;
  const int64_t t = row % p.total_q;
  const int64_t b = find_batch(p.cu_seqlens_q, p.batch, t);
  const int64_t lk = batch_keys(p.keys, b);
  const int64_t nblk = lk > 0 ? (lk + p.kv_block_size - 1) / p.kv_block_size : 0;
  const int32_t* ids = p.q2k + row * p.topk;
  if (p.valid_per_head) {
    int32_t valid = 0;
    for (int64_t s = 0; s < p.topk; ++s) valid += ids[s] >= 0 && ids[s] < nblk;
    if (valid) atomicAdd(&p.valid_per_head[row / p.total_q], valid);
  }
  for (int64_t s = 0; s < p.topk; ++s) {
    const int32_t id = ids[s];
    if (id == -1) continue;
    uint64_t code = 0;
    if (id < -1 || id >= nblk) {
      code = uint64_t(StatusCode::block_id_out_of_range);
    } else {
      for (int64_t r = 0; r < s; ++r)
        if (ids[r] == id) code = uint64_t(StatusCode::block_id_repeated);
    }
    if (code) {
      atomicMin(first, offence_key(1, uint64_t(row * p.topk + s), code));
      return;  // later slots of this row cannot be earlier offences
    }
  }
}

__global__ void finalize_kernel(Q2KCheckParams p, const unsigned long long* first,
                                int32_t* status) {
  pdl_wait();
  pdl_trigger();
  const uint64_t key = *first;
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

}  // namespace

void launch_q2k_check(const Q2KCheckParams& p, void* workspace, int32_t* status,
                      cudaStream_t stream) {
  auto* first = static_cast<unsigned long long*>(workspace);
  MSA_CUDA_CHECK(cudaMemsetAsync(first, 0xff, sizeof(*first), stream));
  if (p.valid_per_head && p.num_kv_heads > 0)
    MSA_CUDA_CHECK(cudaMemsetAsync(p.valid_per_head, 0, size_t(p.num_kv_heads) * 4, stream));
  const int64_t cu_threads = p.batch + 1;
  launch_pdl(check_cu_seqlens_kernel, unsigned((cu_threads + kThreads - 1) / kThreads), kThreads, 0,
             stream, p, first);
  const int64_t rows = p.num_kv_heads * p.total_q;
  if (rows > 0 && p.topk > 0 && p.batch > 0) {
    if (p.topk <= kStagedEntries) {
      const int64_t per_step = kStagedEntries / p.topk;
      const int64_t blocks = std::min<int64_t>((rows + per_step - 1) / per_step, 132 * 16);
      launch_pdl(check_q2k_staged_kernel, unsigned(blocks), kThreads, 0, stream, p, first);
    } else {
      launch_pdl(check_q2k_kernel, unsigned((rows + kThreads - 1) / kThreads), kThreads, 0, stream,
                 p, first);
    }
  }
  launch_pdl(finalize_kernel, 1, 1, 0, stream, p, first, status);
}

}  // namespace msa::cuda
