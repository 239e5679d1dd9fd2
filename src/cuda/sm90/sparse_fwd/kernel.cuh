// Entries of the sm_90a sparse attention forward (KV-major and uniform Q-major): shared-memory
// carve-out, barrier init and the warpgroup role switch (producers: load.cuh, uniform_load.cuh;
// consumers: mma.cuh, uniform_mma.cuh). Instantiated in launch.cu.
#pragma once

#include "cuda/common/pdl.cuh"
#include "cuda/sm90/sparse_fwd/load.cuh"
#include "cuda/sm90/sparse_fwd/mma.cuh"
#include "cuda/sm90/sparse_fwd/uniform_load.cuh"
#include "cuda/sm90/sparse_fwd/uniform_mma.cuh"

namespace msa::cuda::sparse_fwd {

// Shared-memory carve-out (1024-byte aligned) and barrier init, common to both kernels.
// q_empty_count: arrivals that free a Q buffer (q_empty_arrivals in mma.cuh). fp8 (FP8 QK): a K/V
// stage is published by lane 0 and every producer lane (kKScaleArrivals, kv_load.cuh) and freed
// by every consumer thread (kv_empty_arrivals, mma.cuh).
template <class Storage>
__device__ __forceinline__ Storage& init_shared(uint8_t* smem_raw, int group, int tokens_per_tile,
                                                int q_empty_count, bool fp8,
                                                const CUtensorMap* tm_q, const CUtensorMap* tm_k,
                                                const CUtensorMap* tm_v) {
  const uint32_t pad = (1024 - (sm90::smem_addr(smem_raw) & 1023)) & 1023;
  auto& sh = *reinterpret_cast<Storage*>(smem_raw + pad);
  constexpr int kQBuffers = Storage::kQBuffers;
  if (threadIdx.x == 0) {
    for (int s = 0; s < Storage::kStagesKV; ++s) {
      sm90::mbar_init(&sh.kv_full[s], 1 + (fp8 ? kKScaleArrivals : 0));
      sm90::mbar_init(&sh.kv_empty[s], kv_empty_arrivals(fp8, Storage::kConsumerGroups));
      sm90::mbar_init(&sh.v_full[s], 1);
      sm90::mbar_init(&sh.v_empty[s], Storage::kConsumerGroups * 4);
    }
    for (int c = 0; c < Storage::kConsumerGroups; ++c)
      for (int s = 0; s < kQBuffers; ++s) {
        // the producer lanes that own token slots; q_empty: see q_empty_count
        sm90::mbar_init(&sh.q_full[c][s], min(32, tokens_per_tile));
        sm90::mbar_init(&sh.q_empty[c][s], q_empty_count);
      }
    for (int s = 0; s < kQBuffers; ++s) sm90::mbar_init(&sh.unit_full[s], 1);
    sm90::fence_barrier_init();
    sm90::prefetch_tensor_map(tm_q);
    sm90::prefetch_tensor_map(tm_k);
    sm90::prefetch_tensor_map(tm_v);
  }
  __syncthreads();
  return sh;
}

// KV-major kernel over the chunk table. Persistent: gridDim.x CTAs walk the table with a static
// stride (chunk = blockIdx.x + k * gridDim.x), so the assignment, and with it every partial, is
// independent of timing. kMask: a call with a key mask (p.mask_bits). kBlk: keys per kv block.
// kD: the head dim, 128, 64 or 256 (16-bit q / K / V; KVMajorTraits).
// Its CTA is KVMajorTraits::kThreads (three consumer warpgroups at D = 64).
template <bool kF16, bool kFp8, bool kMask, int kBlk, int kD>
__global__ void __launch_bounds__(KVMajorTraits<kBlk, kD>::kThreads, 1)
    sparse_fwd_kernel(const __grid_constant__ CUtensorMap tm_q,
                      const __grid_constant__ CUtensorMap tm_k,
                      const __grid_constant__ CUtensorMap tm_v,
                      const __grid_constant__ MainParams p) {
  extern __shared__ uint8_t smem_raw[];
  using KT = KVMajorTraits<kBlk, kD>;
  using Storage = typename KT::Storage;
  // bf16 partials staged in the Q buffers (KVMajorTraits::kStagedPartials) free them later.
  constexpr bool kStaged = KT::kStagedPartials;
  Storage& sh = init_shared<Storage>(
      smem_raw, p.group, p.tokens_per_tile,
      q_empty_arrivals(p.group, p.tokens_per_tile, kStaged && p.part_bf16 != 0), kFp8, &tm_q,
      &tm_k, &tm_v);
  if (threadIdx.x == 0 && kStaged && p.part_bf16) sm90::prefetch_tensor_map(&p.tm_part);
  pdl_wait();     // the prep kernels' tables (pdl.cuh)
  pdl_trigger();  // the uniform kernel may take each SM this kernel leaves
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, wg = warp / 4;
  if (wg == 0) {
    sm90::regs_dealloc<KT::kProducerRegs>();
    run_producer<kFp8, kBlk, kD>(p, &tm_q, &tm_k, &tm_v, sh, warp, lane);
  } else {
    sm90::regs_alloc<KT::kConsumerRegs>();
    run_consumer<kF16, kFp8, kMask, kBlk, kD>(p, sh, wg - 1, threadIdx.x - 128 * wg);
  }
}

// Uniform (Q-major) kernel over the unit table: persistent, its units claimed from a cursor
// (uniform_load.cuh; each unit writes its own rows, so the bits do not depend on which CTA runs
// it), 64-key kernels and those on 64-column tiles (D = 32, 64) a static order. Launched right
// after the KV-major kernel with programmatic serialization (pdl.cuh), it runs ahead of its
// pdl_wait: that kernel triggers only after its own pdl_wait, so every prep kernel has completed
// once this one starts, and the two kernels touch disjoint memory (partials vs. the uniform rows
// of out / lse / tlse). Its CTAs thus take the SMs the KV-major kernel's tail leaves idle (P8K-tok
// -50 us). One warp per CTA waits, so this grid completes only after the KV-major one: the
// combine (a normal launch) finds every partial written, and without one (merge.cuh) the call's
// outputs are complete with this grid.
// kD: the head dim, 32 (dense), 64, 128 or 256; kBlk: keys per kv block (traits.h HeadDimTraits).
// kParts: sparse units over blocks of more keys than a stage (D = 256, 128-key blocks:
// uniform_load.cuh); the dense kernel of that shape is instantiated without their code.
// Its CTA is HeadDimTraits::kThreads (three consumer warpgroups at D = 32 and 64).
// kDenseQ: dense calls only (D = 128, 16-bit types), with a Q warp (uniform_load.cuh); the
// sparse producer code is not compiled into it.
template <bool kF16, bool kFp8, bool kMask, int kD, int kBlk, bool kParts = false,
          bool kDenseQ = false>
__global__ void __launch_bounds__(HeadDimTraits<kD, kBlk>::kThreads, 1)
    sparse_fwd_uniform_kernel(const __grid_constant__ CUtensorMap tm_q,
                              const __grid_constant__ CUtensorMap tm_k,
                              const __grid_constant__ CUtensorMap tm_v, const UniformParams p) {
  extern __shared__ uint8_t smem_raw[];
  using Storage = typename HeadDimTraits<kD, kBlk>::Storage;
  auto& sh = init_shared<Storage>(smem_raw, p.group, p.tokens_per_tile,
                                  q_empty_arrivals(p.group, p.tokens_per_tile, false), kFp8, &tm_q,
                                  &tm_k, &tm_v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, wg = warp / 4;
  if (wg == 0) {
    constexpr uint32_t kRegs = kFp8 ? kUniformFp8ProducerRegs : kUniformProducerRegs;
    sm90::regs_dealloc<kRegs>();
    // Warp 1 (idle otherwise) does the end wait: the grid completes only after every thread.
    // (A pdl_wait after the role code makes ptxas spill the consumer.) Dense: the unit table
    // comes from the direct predecessor, so the producer warp waits before reading it.
    if constexpr (kDenseQ) {
      // The Q warp (2) reads the unit table and warp 0 takes its descriptors: both wait.
      if (warp != 3) pdl_wait();
      if (warp == 2) run_uniform_q_warp<kFp8, kD, kBlk>(p, &tm_q, sh, lane);
      else run_uniform_producer<kFp8, kD, kBlk, kParts, true>(p, &tm_q, &tm_k, &tm_v, sh, warp, lane);
    } else {
      if (warp == 1 || (warp == 0 && p.dense)) pdl_wait();
      run_uniform_producer<kFp8, kD, kBlk, kParts>(p, &tm_q, &tm_k, &tm_v, sh, warp, lane);
    }
  } else {
    constexpr uint32_t kRegs = kFp8                            ? kUniformFp8ConsumerRegs
                               : HeadDimTraits<kD, kBlk>::kCons == 3 ? kUniform3ConsumerRegs
                                                                  : kUniformConsumerRegs;
    sm90::regs_alloc<kRegs>();
    run_uniform_consumer<kF16, kFp8, kMask, kD, kBlk>(p, sh, wg - 1, threadIdx.x - 128 * wg);
  }
}

}  // namespace msa::cuda::sparse_fwd
