// MSA_CUDA_CHECK: turns a failed CUDA runtime call or launch into msa::Error with the call text.
#pragma once

#include <cuda_runtime.h>

#include "msa/error.h"

#define MSA_CUDA_CHECK(expr)                                                              \
  do {                                                                                    \
    cudaError_t msa_err_ = (expr);                                                        \
    if (msa_err_ != cudaSuccess)                                                          \
      ::msa::fail("CUDA error in ", #expr, ": ", cudaGetErrorString(msa_err_), " (",      \
                  __FILE__, ":", __LINE__, ")");                                          \
  } while (0)

// After a kernel launch: reports launch-configuration errors without synchronizing.
#define MSA_CUDA_CHECK_LAUNCH() MSA_CUDA_CHECK(cudaGetLastError())
