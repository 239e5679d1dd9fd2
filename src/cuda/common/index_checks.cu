// Kernels of the device-side index checks (index_checks.cuh): short q2k rows staged per block in
// shared memory (one thread per entry), long rows one CTA per row (an ascending test, else a sort
// in shared memory), rows too long for that one thread per row; one thread per cu_seqlens entry,
// and a single-thread finalize that turns the first-offence key into the status buffer.
#include <algorithm>
#include <atomic>
#include <bit>
#include <climits>
#include <cstdint>

#include "cuda/common/block_sort.cuh"
#include "cuda/common/index_checks.cuh"
#include "cuda/common/index_check_device.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/device/check.h"
#include "cuda/device/info.h"
#include "cuda/device/status.cuh"
#include "cuda/device/smem_limit.h"
#include "msa/common.h"

namespace msa::cuda {
namespace {

__global__ void check_cu_seqlens_kernel(Q2KCheckParams p, unsigned long long* first) {
  pdl_wait();
  pdl_trigger();
  check_cu_seqlens_entry(p, int64_t(blockIdx.x) * blockDim.x + threadIdx.x, first);
}

constexpr int kThreads = kQ2KStagedThreads;

__global__ void __launch_bounds__(kThreads) check_q2k_staged_kernel(Q2KCheckParams p,
                                                                    unsigned long long* first) {
  pdl_wait();
  pdl_trigger();
  check_q2k_staged_body(p, first, blockIdx.x, gridDim.x);
}

// The row kernel: one CTA per q2k row (grid-stride over rows), for kQ2KStagedMaxTopk < topk <=
// kRowMaxTopk. Each warp reads a contiguous segment of the row (coalesced, kRowUnroll loads in
// flight a lane), tests each entry's range and whether the row's in-range ids are strictly
// ascending (each greater than the largest in-range id of every earlier slot: a prefix max over
// the lanes, carried along the segment, then across the segments); -1 and out-of-range entries
// do not take part. An ascending row has no repeat, so its first offence is its first
// out-of-range slot: the usual rows (ascending, -1 padded) need no shared-memory pass. Any other
// row is sorted in shared memory as (id, slot) keys: within a run of equal ids every key after
// the first is a repeat of an earlier slot, and the smallest such slot is the row's first repeat.
// The earlier of the first repeat and the first out-of-range slot is exactly the slot and code
// check_q2k_kernel reports for the row.
constexpr int kRowThreads = 256;
constexpr int kRowWarps = kRowThreads / 32;
constexpr int kRowUnroll = 8;
// The sort buffer holds bit_ceil(topk) 64-bit keys: 16384 of them are 128 KB of shared memory
// (sm_90 allows 227 KB a CTA). On a device with less, rows whose buffer does not fit take
// check_q2k_kernel.
constexpr int64_t kRowMaxTopk = 16384;
constexpr unsigned long long kNoKey = ~0ull;  // sorts after every (id, slot) key

__device__ __forceinline__ int32_t warp_min(int32_t x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = min(x, __shfl_xor_sync(~0u, x, o));
  return x;
}

__device__ __forceinline__ int32_t warp_sum(int32_t x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(~0u, x, o);
  return x;
}

// Each warp's partial results for one row.
struct RowPartials {
  int32_t valid[kRowWarps];      // in-range ids
  int32_t first_bad[kRowWarps];  // first out-of-range slot (INT32_MAX: none)
  int32_t min_id[kRowWarps];     // smallest in-range id (INT32_MAX: none)
  int32_t max_id[kRowWarps];     // largest in-range id (-1: none)
  int32_t ascending[kRowWarps];  // in-range ids strictly ascending within the segment
  int32_t first_repeat[kRowWarps];
};

__global__ void __launch_bounds__(kRowThreads) check_q2k_row_kernel(Q2KCheckParams p, int sort_n,
                                                                    unsigned long long* first) {
  extern __shared__ unsigned long long keys[];  // [sort_n]: (id << 32 | slot), kNoKey
  __shared__ RowPartials part;
  pdl_wait();
  pdl_trigger();
  const int topk = int(p.topk), warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int seg = (topk + kRowWarps - 1) / kRowWarps;
  const int lo = min(topk, warp * seg), hi = min(topk, lo + seg);
  const int64_t rows = p.num_kv_heads * p.total_q;
  int64_t head = 0;
  int32_t head_valid = 0;  // thread 0: in-range ids of `head` not yet added to valid_per_head
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t b = find_batch(p.cu_seqlens_q, p.batch, row % p.total_q);
    const int64_t lk = batch_keys(p.keys, b);
    const int64_t nblk = lk > 0 ? (lk + p.kv_block_size - 1) / p.kv_block_size : 0;
    const int32_t* ids = p.q2k + row * topk;
    int32_t valid = 0, first_bad = INT32_MAX, min_id = INT32_MAX, run_max = -1;
    bool ascending = true;
    for (int base = lo; base < hi; base += 32 * kRowUnroll) {  // warp-uniform bounds
      int32_t v[kRowUnroll];
#pragma unroll
      for (int u = 0; u < kRowUnroll; ++u) {
        const int s = base + u * 32 + lane;
        v[u] = s < hi ? ids[s] : -1;
      }
#pragma unroll
      for (int u = 0; u < kRowUnroll; ++u) {
        const int s = base + u * 32 + lane;
        const bool in_range = v[u] >= 0 && v[u] < nblk;
        valid += in_range;
        if (v[u] != -1 && !in_range) first_bad = min(first_bad, s);
        int32_t incl = in_range ? v[u] : -1;  // max in-range id of lanes <= this one
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
          const int32_t x = __shfl_up_sync(~0u, incl, o);
          if (lane >= o) incl = max(incl, x);
        }
        const int32_t below = __shfl_up_sync(~0u, incl, 1);
        const int32_t earlier = lane == 0 ? run_max : max(run_max, below);
        if (in_range) {
          ascending = ascending && v[u] > earlier;
          min_id = min(min_id, v[u]);
        }
        run_max = max(run_max, __shfl_sync(~0u, incl, 31));
      }
    }
    valid = warp_sum(valid);
    first_bad = warp_min(first_bad);
    min_id = warp_min(min_id);
    ascending = __all_sync(~0u, ascending);
    if (lane == 0) {
      part.valid[warp] = valid;
      part.first_bad[warp] = first_bad;
      part.min_id[warp] = min_id;
      part.max_id[warp] = run_max;
      part.ascending[warp] = ascending;
    }
    __syncthreads();
    // The row: every segment ascending, each above all earlier ones. The same in every thread.
    int32_t row_valid = 0, row_bad = INT32_MAX, earlier = -1;
    bool row_ascending = true;
    for (int w = 0; w < kRowWarps; ++w) {
      row_valid += part.valid[w];
      row_bad = min(row_bad, part.first_bad[w]);
      row_ascending = row_ascending && part.ascending[w] && part.min_id[w] > earlier;
      earlier = max(earlier, part.max_id[w]);
    }
    if (!row_ascending) {
      for (int s = int(threadIdx.x); s < sort_n; s += kRowThreads) {
        const int32_t id = s < topk ? ids[s] : -1;
        keys[s] = id >= 0 && id < nblk ? (uint64_t(id) << 32) | uint32_t(s) : kNoKey;
      }
      block_bitonic_sort(keys, sort_n);
      int32_t repeat = INT32_MAX;
      for (int i = int(threadIdx.x) + 1; i < sort_n; i += kRowThreads)
        if (keys[i] != kNoKey && (keys[i] >> 32) == (keys[i - 1] >> 32))
          repeat = min(repeat, int32_t(uint32_t(keys[i])));
      repeat = warp_min(repeat);
      if (lane == 0) part.first_repeat[warp] = repeat;
      __syncthreads();
    }
    if (threadIdx.x == 0) {
      int32_t repeat = INT32_MAX;
      if (!row_ascending)
        for (int w = 0; w < kRowWarps; ++w) repeat = min(repeat, part.first_repeat[w]);
      const int32_t s = min(row_bad, repeat);
      if (s != INT32_MAX) {
        const uint64_t code = uint64_t(s == row_bad ? StatusCode::block_id_out_of_range
                                                    : StatusCode::block_id_repeated);
        atomicMin(first, offence_key(1, uint64_t(row) * uint64_t(topk) + uint64_t(s), code));
      }
      // Rows of a CTA come in ascending order, so each head's count is added once.
      if (p.valid_per_head) {
        if (row / p.total_q != head) {
          if (head_valid) atomicAdd(&p.valid_per_head[head], head_valid);
          head = row / p.total_q;
          head_valid = 0;
        }
        head_valid += row_valid;
      }
    }
    __syncthreads();  // the next row rewrites part and keys
  }
  if (threadIdx.x == 0 && p.valid_per_head && head_valid)
    atomicAdd(&p.valid_per_head[head], head_valid);
}

// Rows above kRowMaxTopk (or whose sort buffer exceeds the device's shared memory): one thread
// per row with an O(topk^2) repeat test, slow but correct. The row kernel has no room to sort
// them, and rows that long are not what the ops produce.
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
  report_q2k_offence(p, *first, status);
}

// The row kernel's largest sort buffer on the current device (its limit raised once per device,
// smem_limit.h); each launch's own size sets its occupancy.
int64_t row_kernel_smem_limit() {
  return std::min<int64_t>(int64_t(dynamic_smem_limit(check_q2k_row_kernel)), kRowMaxTopk * 8);
}

// CTAs of the row kernel an SM holds with a sort buffer of sort_n keys (a power of two up to
// kRowMaxTopk), asked of the runtime once per size per process: the check runs before every
// token-sparse attention call, and an occupancy query per call is host time on that path.
int row_kernel_ctas_per_sm(int64_t sort_n) {
  static std::atomic<int> cache[64] = {};
  std::atomic<int>& slot = cache[std::countr_zero(uint64_t(sort_n))];
  int per_sm = slot.load(std::memory_order_relaxed);
  if (per_sm == 0) {
    MSA_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &per_sm, check_q2k_row_kernel, kRowThreads, size_t(sort_n) * 8));
    per_sm = std::max(per_sm, 1);
    slot.store(per_sm, std::memory_order_relaxed);
  }
  return per_sm;
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
    const int64_t sort_n = int64_t(std::bit_ceil(uint64_t(p.topk)));
    if (p.topk <= kQ2KStagedMaxTopk) {
      const int64_t per_step = kQ2KStagedEntries / p.topk;
      const int64_t blocks = std::min<int64_t>((rows + per_step - 1) / per_step, 132 * 16);
      launch_pdl(check_q2k_staged_kernel, unsigned(blocks), kThreads, 0, stream, p, first);
    } else if (p.topk <= kRowMaxTopk && sort_n * 8 <= row_kernel_smem_limit()) {
      const size_t smem = size_t(sort_n) * 8;
      const int64_t blocks =
          std::min<int64_t>(rows, int64_t(current_sm_count()) * row_kernel_ctas_per_sm(sort_n));
      launch_pdl(check_q2k_row_kernel, unsigned(blocks), kRowThreads, smem, stream, p, int(sort_n),
                 first);
    } else {
      launch_pdl(check_q2k_kernel, unsigned((rows + kThreads - 1) / kThreads), kThreads, 0, stream,
                 p, first);
    }
  }
  launch_pdl(finalize_kernel, 1, 1, 0, stream, p, first, status);
}

}  // namespace msa::cuda
