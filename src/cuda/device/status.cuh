// The one device-side writer of the int32[4] status buffer (docs/semantics.md, Errors): word 0
// the StatusCode, words 1-3 its details. The first offence wins whichever thread, CTA or kernel
// of the stream reports it; check_status() turns it into an msa::Error. Kernels that must report
// the first offence in a fixed order (not the first to arrive) fold their offences into one
// atomicMin key and let a single thread report the winner.
#pragma once

#include <cstdint>

#include "msa/common.h"  // StatusCode, for the callers

namespace msa::cuda {

__device__ __forceinline__ void flag_status(int32_t* status, int32_t code, int64_t a, int64_t b,
                                            int64_t c) {
  if (atomicCAS(status, 0, code) == 0) {
    status[1] = int32_t(a);
    status[2] = int32_t(b);
    status[3] = int32_t(c);
  }
}

}  // namespace msa::cuda
