// indexer_threshold_select on CUDA: one block per (query row, tile of keys), scoring
// through RowScorer (score_nvfp4.cuh), as indexer_scores does, so a key is kept exactly when
// a sort of indexer_scores' row ranks it above (or equal to) the threshold. No score is written
// but the candidates'. Each warp takes its slots in a store with one atomicAdd on the row's
// counter for all its lanes (ballot + popc); a slot at or past the capacity is counted and not
// written, so a store never overflows, and the counts are exact whatever the slot order. The
// candidate and tie slots come out in no fixed order; top_k_from_candidates sorts them.
#include "cuda/device/check.h"
#include "cuda/sm90/sdsa/launch_kernels.h"
#include "cuda/sm90/sdsa/score_nvfp4.cuh"

namespace msa::cuda::sdsa_sm90 {
namespace {

// The warp's lanes with `pred` take consecutive slots of *counter (one atomic for the warp);
// returns this lane's slot, or -1 without pred. Every lane of the warp calls it.
__device__ __forceinline__ int64_t warp_take(bool pred, int32_t* counter) {
  const unsigned mask = __ballot_sync(0xffffffffu, pred);
  if (mask == 0) return -1;
  const int lane = threadIdx.x & 31;
  const int leader = __ffs(mask) - 1;
  int32_t base = 0;
  if (lane == leader) base = atomicAdd(counter, __popc(mask));
  base = __shfl_sync(0xffffffffu, base, leader);
  return pred ? int64_t(base) + __popc(mask & ((1u << lane) - 1u)) : -1;
}

template <KeyFormat F, int kMode>
__global__ void __launch_bounds__(kThreads) select_kernel(SelectParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  using Scorer = RowScorer<F, kMode>;
  constexpr int kKeys = Scorer::kKeys;
  Scorer scorer{smem};
  const int64_t t = blockIdx.x;
  const RowInfo row = scorer.begin(p.rows, p.cache, t, p.status);
  const uint32_t bar = sdsa::rank_key(p.thresholds[t]);
  int32_t* count = p.counts + 3 * t;
  int32_t* cand = p.candidates + t * int64_t(p.cap) * 2;
  int32_t* ties = p.ties + t * int64_t(p.tie_cap);
  scorer.for_tiles(p.rows, p.cache, row.request, row.len, row.len, p.status,
                   [&](const int64_t (&j)[kKeys], const float (&s)[kKeys]) {
#pragma unroll
    for (int n = 0; n < kKeys; ++n) {
      const uint32_t key = sdsa::rank_key(s[n]);  // -inf (and every key past the row) is 0
      const int64_t c = warp_take(key > bar, &count[0]);
      // A count non-zero on entry (the CPU rejects it) shifts the slots; the bounds keep every
      // write inside the store.
      if (c >= 0 && c < p.cap) {
        cand[2 * c] = int32_t(j[n]);
        cand[2 * c + 1] = int32_t(codec::float_bits(s[n]));
      }
      const int64_t e = warp_take(key == bar && key != 0, &count[1]);
      if (e >= 0 && e < p.tie_cap) ties[e] = int32_t(j[n]);
      const unsigned below = __ballot_sync(0xffffffffu, key < bar && key != 0);
      if (below != 0 && (threadIdx.x & 31) == __ffs(below) - 1) atomicAdd(&count[2], __popc(below));
    }
  });
}

template <KeyFormat F, int kMode>
void launch(const SelectParams& p, cudaStream_t stream) {
  constexpr int kTile = RowScorer<F, kMode>::kTile;
  const int64_t keys = int64_t(p.cache.max_pages) * p.cache.page_size;  // the longest row possible
  const int64_t tiles = (keys + kTile - 1) / kTile;
  const dim3 grid(unsigned(p.rows.rows), row_blocks(kMode, tiles));
  select_kernel<F, kMode><<<grid, kThreads, query_smem_bytes(kMode, p.cache.dim), stream>>>(p);
  MSA_CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_select(const SelectParams& p, KeyFormat f, cudaStream_t stream) {
  if (p.rows.rows == 0) return;
  with_variant(p.rows, p.cache, f, [&](auto v) {
    launch<decltype(v)::kFormat, decltype(v)::kMode>(p, stream);
  });
}

}  // namespace msa::cuda::sdsa_sm90
