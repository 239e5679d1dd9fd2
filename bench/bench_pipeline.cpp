// bench_pipeline: bench/CASES.md's E2E-32K, and E2E-32K-M3 with its indexer stage IDX-32K-M3-fp8
// (`--index m3`); the benchmark itself is workloads/pipeline_bench.cpp.
// --json FILE appends one record per timed op (bench/SCHEMA.md).
//   bench_pipeline [--seq S] [--hq H] [--hkv H] [--topk K] [--iters N] [--warmup N] [--json FILE]
//                  [--partial bf16|f32]   (the attention's partial outputs; default bf16, as in
//                                          bench_sparse_fwd's cases)
//                  [--index shared|m3]    (m3: 4 FP8 index heads on 1 index key head)
#include "workloads/gpu_benches.h"

int main(int argc, char** argv) {
  return msa::bench::single_shape_main(argc, argv, "bench_pipeline", msa_bench::run_pipeline_bench,
                                       /*fp8_allowed=*/false, /*partial_allowed=*/true);
}
