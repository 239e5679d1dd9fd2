// Entry of the sm_90a sparse attention forward: shared-memory carve-out, barrier init and the
// warpgroup role switch (producer: load.cuh; consumers: mma.cuh). Instantiated in launch.cu.
#pragma once

#include "cuda/sm90/sparse_fwd/load.cuh"
#include "cuda/sm90/sparse_fwd/mma.cuh"

namespace msa::cuda::sparse_fwd {

// Persistent: gridDim.x CTAs walk the chunk table with a static stride (chunk = blockIdx.x +
// k * gridDim.x), so the assignment, and with it every partial, is independent of timing.
template <bool kF16>
__global__ void __launch_bounds__(kThreads, 1)
    sparse_fwd_kernel(const __grid_constant__ CUtensorMap tm_q,
                      const __grid_constant__ CUtensorMap tm_k,
                      const __grid_constant__ CUtensorMap tm_v, const MainParams p) {
  extern __shared__ uint8_t smem_raw[];
  const uint32_t pad = (1024 - (sm90::smem_addr(smem_raw) & 1023)) & 1023;
  SharedStorage& sh = *reinterpret_cast<SharedStorage*>(smem_raw + pad);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, wg = warp / 4;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kKVStages; ++s) {
      sm90::mbar_init(&sh.kv_full[s], 1);
      sm90::mbar_init(&sh.kv_empty[s], kConsumers * 128);  // every consumer thread
    }
    for (int c = 0; c < kConsumers; ++c)
      for (int s = 0; s < kQStages; ++s) {
        sm90::mbar_init(&sh.q_full[c][s], 32);   // every lane of the buffer's producer warp
        sm90::mbar_init(&sh.q_empty[c][s], 128);  // every thread of consumer c
      }
    sm90::fence_barrier_init();
    sm90::prefetch_tensor_map(&tm_q);
    sm90::prefetch_tensor_map(&tm_k);
    sm90::prefetch_tensor_map(&tm_v);
  }
  __syncthreads();
  if (wg == 0) {
    sm90::regs_dealloc<kProducerRegs>();
    run_producer(p, &tm_q, &tm_k, &tm_v, sh, warp, lane);
  } else {
    sm90::regs_alloc<kConsumerRegs>();
    run_consumer<kF16>(p, sh, wg - 1, threadIdx.x - 128 * wg);
  }
}

}  // namespace msa::cuda::sparse_fwd
