// indexer_scores on CUDA: one block per (query row, tile of kTileKeys keys), each thread scoring
// kKeysPerThread keys through score_keys (score.cuh), the function the select uses too. Columns
// past the row's length are written -inf; a row longer than the scores' width is flagged and
// scored up to the width.
#include "cuda/device/check.h"
#include "cuda/sm90/sdsa/launch_kernels.h"
#include "cuda/sm90/sdsa/score.cuh"

namespace msa::cuda::sdsa_sm90 {
namespace {

template <KeyFormat F>
__global__ void __launch_bounds__(kThreads) scores_kernel(ScoresParams p) {
  extern __shared__ double q[];
  const int64_t t = blockIdx.x;
  const RowInfo row = begin_row(p.rows, p.cache, t, p.status, q);
  if (row.len > p.width && threadIdx.x == 0 && blockIdx.y == 0)
    flag_status(p.status, int32_t(StatusCode::row_past_scores), t, row.len, p.width);
  const int64_t len = row.len < p.width ? row.len : p.width;
  float* out = p.scores + t * p.out_s0;
  for (int64_t tile = blockIdx.y; tile * kTileKeys < p.width; tile += gridDim.y) {
    int64_t j[kKeysPerThread];
    bool ok[kKeysPerThread];
#pragma unroll
    for (int n = 0; n < kKeysPerThread; ++n) {
      j[n] = tile * kTileKeys + n * kThreads + threadIdx.x;
      ok[n] = j[n] < len;
    }
    float s[kKeysPerThread];
    score_keys<F, kKeysPerThread>(q, p.cache, row.request, j, ok, p.status, s);
#pragma unroll
    for (int n = 0; n < kKeysPerThread; ++n)
      if (j[n] < p.width) out[j[n]] = s[n];
  }
}

template <KeyFormat F>
void launch(const ScoresParams& p, cudaStream_t stream) {
  const int64_t tiles = (p.width + kTileKeys - 1) / kTileKeys;
  const dim3 grid(unsigned(p.rows.rows), unsigned(tiles < 65535 ? tiles : 65535));
  scores_kernel<F><<<grid, kThreads, size_t(p.cache.dim) * sizeof(double), stream>>>(p);
  MSA_CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_scores(const ScoresParams& p, KeyFormat f, cudaStream_t stream) {
  if (p.rows.rows == 0 || p.width == 0) return;
  switch (f) {
    case KeyFormat::bf16: return launch<KeyFormat::bf16>(p, stream);
    case KeyFormat::f16: return launch<KeyFormat::f16>(p, stream);
    case KeyFormat::nvfp4: return launch<KeyFormat::nvfp4>(p, stream);
  }
}

}  // namespace msa::cuda::sdsa_sm90
