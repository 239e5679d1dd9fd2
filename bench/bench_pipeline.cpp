// bench_pipeline: bench/CASES.md's E2E-32K; the benchmark itself is workloads/pipeline_bench.cpp.
// --json FILE appends one record per timed op (bench/SCHEMA.md).
//   bench_pipeline [--seq S] [--hq H] [--hkv H] [--topk K] [--iters N] [--warmup N] [--json FILE]
//                  [--partial bf16|f32]   (the attention's partial outputs; default bf16, as in
//                                          bench_sparse_fwd's cases)
#include <cstdio>

#include "workloads/gpu_benches.h"

int main(int argc, char** argv) {
  try {
    return msa_bench::run_pipeline_bench(msa::bench::parse_run_options(argc, argv, "bench_pipeline", false, true));
  } catch (const msa::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 3;
  }
}
