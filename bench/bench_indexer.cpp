// bench_indexer: bench/CASES.md's IDX-32K-bf16 (and IDX-32K-fp8 with --fp8 1); the benchmark
// itself is workloads/indexer_bench.cpp. --json FILE appends one record per timed op (bench/SCHEMA.md).
//   bench_indexer [--seq S] [--hq H] [--hkv H] [--topk K] [--fp8 0|1] [--fp8-scales token|tensor]
//                 [--iters N] [--warmup N] [--json FILE]
#include "workloads/gpu_benches.h"

int main(int argc, char** argv) {
  return msa::bench::single_shape_main(argc, argv, "bench_indexer", msa_bench::run_indexer_bench,
                                       /*fp8_allowed=*/true);
}
