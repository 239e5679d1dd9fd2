// Kernels of the paged-KV checks (paged_checks.cuh) and their launches.

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include <climits>
#include <cstdint>

#include "cuda/common/paged_checks.cuh"
#include "cuda/common/topk_select.cuh"
#include "cuda/device/check.h"
#include "msa/common.h"

namespace msa::cuda {
namespace {

constexpr int kPagedCheckThreads = 1024;  // threads of the single-block kernels

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
__device__ void report_paged_offence(const PagedCheckParams& p, unsigned long long key) {
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

// One block of kPagedCheckThreads: re-arms the offence key, checks and clamps each batch's
// length, and writes key_offsets = exclusive prefix of the clamped lengths (fits int32:
// B * max_keys < 2^31, a host check).
__global__ void __launch_bounds__(kPagedCheckThreads) paged_lengths_kernel(PagedCheckParams p) {
  using Scan = cub::BlockScan<int, kPagedCheckThreads>;
  __shared__ typename Scan::TempStorage tmp;
  if (threadIdx.x == 0) *p.offence = kNoPagedOffence;
  __syncthreads();
  unsigned long long offence = kNoPagedOffence;
  int carry = 0;
  for (int64_t base = 0; base <= p.batch; base += kPagedCheckThreads) {
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

// One thread per page-table entry (grid-stride), lengths from key_offsets.
__global__ void page_check_kernel(PagedCheckParams p) {
  const int64_t n = p.batch * p.max_pages;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t b = i / p.max_pages;
    const unsigned long long key = page_offence(p, i, int64_t(p.key_offsets[b + 1]) - p.key_offsets[b]);
    if (key != kNoPagedOffence) atomicMin(p.offence, key);
  }
}

// One thread: the first offence of the two kernels above into the status buffer.
__global__ void paged_finalize_kernel(PagedCheckParams p) {
  report_paged_offence(p, *p.offence);
}

// The whole check in one block of kPagedCheckThreads, for ops without scratch memory: each
// thread keeps its smallest offence key and a block reduction picks the first. Writes no
// lengths (key_offsets and offence unused). A page-table entry re-reads its batch's seqused_k
// (cached) instead of a stored prefix.
__global__ void __launch_bounds__(kPagedCheckThreads)
    paged_check_block_kernel(PagedCheckParams p) {
  using Reduce = cub::BlockReduce<unsigned long long, kPagedCheckThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  unsigned long long offence = kNoPagedOffence, unused = kNoPagedOffence;
  for (int64_t b = threadIdx.x; b < p.batch; b += kPagedCheckThreads) checked_length(p, b, offence);
  const int64_t n = p.batch * p.max_pages;
  for (int64_t i = threadIdx.x; i < n; i += kPagedCheckThreads)
    offence = min(offence, page_offence(p, i, checked_length(p, i / p.max_pages, unused)));
  const auto smaller = [](unsigned long long a, unsigned long long b) { return a < b ? a : b; };
  const unsigned long long first = Reduce(tmp).Reduce(offence, smaller);
  if (threadIdx.x == 0) report_paged_offence(p, first);
}

}  // namespace

void launch_paged_checks_with_offsets(const PagedCheckParams& c, cudaStream_t stream) {
  paged_lengths_kernel<<<1, kPagedCheckThreads, 0, stream>>>(c);
  MSA_CUDA_CHECK_LAUNCH();
  const int64_t entries = c.batch * c.max_pages;
  if (entries > 0) {
    const int64_t blocks = (entries + 255) / 256 < 1024 ? (entries + 255) / 256 : 1024;
    page_check_kernel<<<unsigned(blocks), 256, 0, stream>>>(c);
    MSA_CUDA_CHECK_LAUNCH();
  }
  paged_finalize_kernel<<<1, 1, 0, stream>>>(c);
  MSA_CUDA_CHECK_LAUNCH();
}

void launch_paged_check_block(const PagedCheckParams& c, cudaStream_t stream) {
  paged_check_block_kernel<<<1, kPagedCheckThreads, 0, stream>>>(c);
  MSA_CUDA_CHECK_LAUNCH();
}

}  // namespace msa::cuda
