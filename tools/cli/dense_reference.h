// The dense reference `msa demo` compares its sparse pipeline with on the GPU: the time dense
// causal attention needs at least, its FLOP at the bf16 matrix rate this GPU reaches in the same
// run (a cuBLAS GEMM). No dense attention kernel runs faster than its FLOP at the GEMM rate, so a
// sparse pipeline under this bound beats every dense kernel (FA4 reaches about 96% of it).
#pragma once

#include <string>

namespace msa::cli {

struct GemmRate {
  double tflops = 0;   // 0 when unavailable
  std::string error;   // why, when unavailable (e.g. cuBLAS not found)
};

// bf16 GEMM, fp32 accumulate, M = N = K = 8192 on device 0: median of 10 timed runs after 3
// warm-ups, on random inputs. cuBLAS is loaded at run time (libcublas.so.13), so the CLI does
// not depend on it; without it the reference is reported as unavailable.
GemmRate measure_bf16_gemm_rate();

}  // namespace msa::cli
