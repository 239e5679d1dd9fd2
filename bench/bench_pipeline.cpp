// bench_pipeline: BENCHMARKS.md E2E-32K; the benchmark itself is bench/pipeline_bench.cpp.
//   bench_pipeline [--seq S] [--hq H] [--hkv H] [--topk K] [--iters N] [--warmup N] [--json FILE]
#include <cstdio>

#include "bench/gpu_benches.h"

int main(int argc, char** argv) {
  try {
    return msa_bench::run_pipeline_bench(msa::bench::parse_run_options(argc, argv, "bench_pipeline", false));
  } catch (const msa::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 3;
  }
}
