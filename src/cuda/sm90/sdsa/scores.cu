// indexer_scores on CUDA: one block per (query row, tile of keys), each thread scoring a few keys
// through RowScorer (score_nvfp4.cuh), as the select does. Columns
// past the row's length are written -inf; a row longer than the scores' width is flagged and
// scored up to the width.
#include "cuda/device/check.h"
#include "cuda/sm90/sdsa/launch_kernels.h"
#include "cuda/sm90/sdsa/score_nvfp4.cuh"

namespace msa::cuda::sdsa_sm90 {
namespace {

template <KeyFormat F, int kMode>
__global__ void __launch_bounds__(kThreads) scores_kernel(ScoresParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  using Scorer = RowScorer<F, kMode>;
  constexpr int kKeys = Scorer::kKeys;
  Scorer scorer{smem};
  const int64_t t = blockIdx.x;
  const RowInfo row = scorer.begin(p.rows, p.cache, t, p.status);
  if (row.len > p.width && threadIdx.x == 0 && blockIdx.y == 0)
    flag_status(p.status, int32_t(StatusCode::row_past_scores), t, row.len, p.width);
  const int64_t len = row.len < p.width ? row.len : p.width;
  float* out = p.scores + t * p.out_s0;
  scorer.for_tiles(p.rows, p.cache, row.request, p.width, len, p.status,
                   [&](const int64_t (&j)[kKeys], const float (&s)[kKeys]) {
#pragma unroll
    for (int n = 0; n < kKeys; ++n)
      if (j[n] < p.width) out[j[n]] = s[n];
  });
}

template <KeyFormat F, int kMode>
void launch(const ScoresParams& p, cudaStream_t stream) {
  constexpr int kTile = RowScorer<F, kMode>::kTile;
  const int64_t tiles = (p.width + kTile - 1) / kTile;
  const dim3 grid(unsigned(p.rows.rows), row_blocks(kMode, tiles));
  scores_kernel<F, kMode><<<grid, kThreads, query_smem_bytes(kMode, p.cache.dim), stream>>>(p);
  MSA_CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_scores(const ScoresParams& p, KeyFormat f, cudaStream_t stream) {
  if (p.rows.rows == 0 || p.width == 0) return;
  with_variant(p.rows, p.cache, f, [&](auto v) {
    launch<decltype(v)::kFormat, decltype(v)::kMode>(p, stream);
  });
}

}  // namespace msa::cuda::sdsa_sm90
