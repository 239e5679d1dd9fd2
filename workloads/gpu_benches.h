// The GPU benchmarks of the indexer (IDX-32K), the whole pipeline (E2E-32K), the decode (DEC-*),
// the MQA logits (MQAL-*) and the latency cases (LAT-*), as functions: called by their programs (bench_indexer, bench_pipeline, bench_decode)
// and by `msa bench --case NAME` (tools/cli). Each checks its results first, prints a table and
// appends JSON records to a file when asked. CUDA builds only.
#pragma once

#include <string>
#include <vector>

#include "workloads/single_shape.h"

namespace msa_bench {

// Block scores, top-K on them and the fused indexer + top-K at o.seq (o.fp8: FP8 e4m3 q and k
// with per-token scales). Returns 0, or 1 when the check failed.
int run_indexer_bench(const msa::bench::RunOptions& o);

// sparse_attention_pipeline in one call and stage by stage. Returns 0, or 1 when the check failed.
int run_pipeline_bench(const msa::bench::RunOptions& o);

struct DecodeBenchOptions {
  int warmup = 5, iters = 50;
  bool check = true;     // three requests against the CPU decode of the same bits first
  std::string json;      // append one JSON record per case and KV dtype when set
  bool hnd = false;      // page layout [pages, Hkv, page_size, D] instead of [pages, page_size, Hkv, D]
  int warps = 0;         // decode CTA width forced (4 or 8; 0: the planner's choice)
  int topk = 0;          // sparse cases: blocks selected per query instead of the case's (0: the case's)
  bool slot_scales = false;  // FP8 KV: K and V scales per pool slot [pages * page_size] (else per tensor)
};

// The named decode cases (all of them when `names` is empty), bf16 and FP8 KV where the case
// has them. Returns 0, 1 when a check failed, 2 for an unknown case or no GPU.
int run_decode_bench(std::vector<std::string> names, const DecodeBenchOptions& o);

struct LogitsBenchOptions {
  int warmup = 3, iters = 20;
  bool check = true;   // rows against the CPU reference on the same bits first
  std::string json;    // append one JSON record per case when set
  int64_t seq = 32768; // MQAL-PREFILL-32K and TOPK2048-32K: T = S
};

// MQAL-PAGED-B64, MQAL-PREFILL-32K, TOPK2048-B64 and TOPK2048-32K (all when `names` is empty). Returns 0, 1 when a check
// failed, 2 for an unknown case or no GPU.
int run_logits_bench(std::vector<std::string> names, const LogitsBenchOptions& o);

struct LatencyBenchOptions {
  int calls = 200;     // timed calls per op (host time: each alone; GPU time: back to back)
  int warmup = 20;     // untimed calls first
  std::string json;    // append one JSON record per case and op when set
  std::vector<std::string> ops;  // time only these ops (all when empty)
  bool gpu_loop = true;          // false: host times only (no back-to-back loop; GPU time 0)
  bool check = true;             // false: no output check (host times under bench/host_sim.cpp's
                                 // stand-in runtime, where no kernel runs)
};
// The LAT-* cases of bench/CASES.md (kind latency).
std::vector<std::string> latency_case_names();
// The named latency cases (all of them when `names` is empty): per op, host and GPU time per call
// and the launches, memsets and other nodes of a CUDA graph capture of one call, after a check of
// the outputs. Returns 0, 1 when a check failed, or 2 for an unknown case or no GPU.
int run_latency_bench(std::vector<std::string> names, const LatencyBenchOptions& o);
}  // namespace msa_bench
