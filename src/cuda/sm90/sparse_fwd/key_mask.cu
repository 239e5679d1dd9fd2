// The key-mask packing kernel of dense attention on CUDA (key_mask.h).
#include "cuda/sm90/sparse_fwd/key_mask.h"

#include <algorithm>

#include "cuda/common/index_checks.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/device/info.h"
#include "cuda/device/status.cuh"

namespace msa::cuda::sparse_fwd {
namespace {

constexpr int kThreads = 256;

// A warp per 32-word (1024-column) segment of a row: 32 coalesced byte loads, each step's ballot
// one word, kept by the lane of its index. Then, grid-stride, each token's mask row (per-batch
// masks) and each request's length against the mask's columns.
__global__ void __launch_bounds__(kThreads) key_mask_pack_kernel(const KeyMaskParams p) {
  pdl_wait();  // pdl.cuh: the lengths come from the prep chain (paged: the checked offsets)
  pdl_trigger();
  const int lane = int(threadIdx.x) & 31;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t threads = int64_t(gridDim.x) * blockDim.x;
  const int64_t segs = (p.words + 31) / 32;
  for (int64_t item = tid >> 5; item < p.rows * segs; item += threads >> 5) {
    const int64_t r = item / segs, w0 = (item % segs) * 32;
    const uint8_t* row = p.mask + r * p.row_stride;
    uint32_t mine = 0;
    for (int i = 0; i < 32; ++i) {
      const int64_t c = (w0 + i) * 32 + lane;
      const uint32_t word = __ballot_sync(0xffffffffu, c < p.cols && row[c] != 0);
      if (lane == i) mine = word;
    }
    if (w0 + lane < p.words) p.bits[r * p.words + w0 + lane] = mine;
  }
  if (!p.per_query)
    for (int64_t t = tid; t < p.total_q; t += threads)
      p.token_row[t] = int32_t(find_batch(p.cu_seqlens_q, p.batch, t));
  for (int64_t b = tid; b < p.batch; b += threads) {
    const int64_t lk = int64_t(p.cu_seqlens_k[b + 1]) - p.cu_seqlens_k[b];
    if (lk > p.cols) flag_status(p.status, int32_t(StatusCode::key_mask_short), b, lk, p.cols);
  }
}

}  // namespace

void launch_key_mask(const KeyMaskParams& p, cudaStream_t stream) {
  const int64_t work = std::max<int64_t>({p.rows * ((p.words + 31) / 32) * 32, p.total_q, p.batch, 1});
  const int64_t blocks = std::min<int64_t>((work + kThreads - 1) / kThreads, 8 * current_sm_count());
  launch_pdl(key_mask_pack_kernel, dim3(unsigned(blocks)), dim3(kThreads), 0, stream, p);
}

}  // namespace msa::cuda::sparse_fwd
