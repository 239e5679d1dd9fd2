// Stage index and phase parity of the mbarrier-guarded buffer rings that every sm_90a family's
// producers and consumers share (K/V stages, Q buffers, selector slots). Use n = 0, 1, 2, ... of
// a ring of kStages buffers takes buffer n % kStages in lap n / kStages. A buffer's full barrier
// completes once per lap, so its consumer waits with the lap's parity; its producer waits on the
// empty barrier with the opposite parity, which a fresh barrier passes at once (lap 0) and which
// afterwards waits for the consumers' release of the previous lap.
#pragma once

#include <cstdint>

// Host and device: traits headers that host files also include name their rings.
#if defined(__CUDACC__)
#define MSA_RING_FN __host__ __device__ __forceinline__
#else
#define MSA_RING_FN inline
#endif

namespace msa::cuda::sm90 {

// Counters are use counts (never negative) of the caller's integer type, kept as they are: in a
// producer warp that runs at 40 registers, widening them cost spills.
template <int kStages>
struct Ring {
  static_assert(kStages > 0, "Ring: at least one stage");
  template <typename I>
  MSA_RING_FN static int stage(I n) {
    return int(n % kStages);
  }
  template <typename I>
  MSA_RING_FN static uint32_t full_parity(I n) {
    return uint32_t((n / kStages) & 1);
  }
  template <typename I>
  MSA_RING_FN static uint32_t empty_parity(I n) {
    return uint32_t(((n / kStages) + 1) & 1);
  }
};

// The same ring stepped one use at a time (no division), for loops that take every use in order.
template <int kStages>
struct RingState {
  int stage = 0;
  uint32_t phase = 0;  // full parity of the current use; empty parity is phase ^ 1
  MSA_RING_FN void advance() {
    if (++stage == kStages) {
      stage = 0;
      phase ^= 1u;
    }
  }
};

}  // namespace msa::cuda::sm90

#undef MSA_RING_FN
