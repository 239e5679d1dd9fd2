// Opt-in per-CTA timeline of the decode kernel, for profiling builds only: configure with
// -DMSA_DECODE_TRACE=ON (e.g. `cmake -S . -B build-trace -G Ninja -DMSA_DECODE_TRACE=ON` and build
// bench_decode there), then run with the environment variable MSA_DECODE_TRACE set. Each launch
// then synchronizes and prints, over its first kTraceCtas CTAs, the spread of the time from each
// CTA's entry to each phase (%globaltimer, comparable across SMs), which ncu's whole-kernel
// counters cannot show. Without the option every stamp compiles
// to nothing. Included by kernel.cuh and launch_kernels.cuh.
#pragma once

#include <cstdint>

namespace msa::cuda::decode {

enum TracePoint : int {
  kTraceEntry = 0,     // thread 0 at entry
  kTraceRequest,       // thread 0: work item and request lengths loaded
  kTraceUnion,         // thread 0: sparse union built (dense: barrier init done)
  kTraceFirstIssue,    // producer thread 0: first stage's copies issued
  kTraceFirstLanded,   // consumer thread 0: first stage landed
  kTraceLoopEnd,       // consumer thread 0: every consumer warp past its last stage
  kTraceMerged,        // consumer thread 0: merge written (out / lse or the partial)
  kTracePoints
};

#ifdef MSA_DECODE_TRACE
constexpr int kTraceCtas = 4096;
// One table per translation unit that instantiates kernels (launch_kernels.cuh reads its own).
static __device__ unsigned long long decode_trace[kTraceCtas][kTracePoints];

__device__ __forceinline__ unsigned long long trace_now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
#define MSA_DECODE_STAMP(point, cond)                                   \
  do {                                                                  \
    if ((cond) && blockIdx.x < ::msa::cuda::decode::kTraceCtas)         \
      ::msa::cuda::decode::decode_trace[blockIdx.x][point] =            \
          ::msa::cuda::decode::trace_now();                             \
  } while (0)
#else
#define MSA_DECODE_STAMP(point, cond) \
  do {                                \
  } while (0)
#endif

}  // namespace msa::cuda::decode
