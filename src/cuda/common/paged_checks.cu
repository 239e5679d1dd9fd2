// Kernels of the paged-KV checks (paged_checks.cuh) and their launches.

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include <climits>
#include <cstdint>

#include "cuda/common/paged_checks.cuh"
#include "cuda/common/paged_check_device.cuh"
#include "cuda/common/topk_select.cuh"
#include "cuda/device/check.h"
#include "msa/common.h"

namespace msa::cuda {
namespace {

constexpr int kPagedCheckThreads = 1024;  // threads of the single-block kernels

__global__ void __launch_bounds__(kPagedCheckThreads) paged_lengths_kernel(PagedCheckParams p) {
  paged_lengths_body<kPagedCheckThreads>(p);
}

// One thread per page-table entry (grid-stride).
__global__ void page_check_kernel(PagedCheckParams p) {
  page_check_body(p, int64_t(blockIdx.x) * blockDim.x + threadIdx.x,
                  int64_t(gridDim.x) * blockDim.x);
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
