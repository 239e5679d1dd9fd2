// The single-shape GPU benchmarks (IDX-32K and E2E-32K of bench/CASES.md; programs bench_indexer
// and bench_pipeline, and `msa bench`): their options, their inputs (one causal request of S
// tokens, D = 128, random normal bf16), the named case as they run it, and the programs' main().
// CUDA builds only (msa_workloads_gpu).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "msa/msa.h"
#include "workloads/cases.h"
#include "workloads/device_buffer.h"

namespace msa::bench {

// The shape and timing options the single-shape benchmark programs share (the defaults of
// bench/CASES.md: S 32768, Hq 64, Hkv 4, topK 16). `--fp8 1` and `--fp8-scales token|tensor` (FP8
// scales per token, the default, or one per tensor) only where `fp8_allowed`.
struct RunOptions {
  int64_t seq = 32768, hq = 64, hkv = 4, topk = 16;
  int warmup = 2, iters = 10;
  bool fp8 = false;
  bool fp8_per_tensor = false;  // --fp8-scales tensor
  std::string json;  // append one JSON record per case when set
  // The attention's partial outputs (AttentionParams::partial_dtype): bf16 as in bench_sparse_fwd,
  // or f32 (the library default); `--partial` only where `partial_allowed` (bench_pipeline).
  DType partial = DType::bf16;
  // bench_pipeline `--index m3`: E2E-32K-M3's index branch (4 FP8 index heads on 1 index key
  // head, per-token scales) instead of scoring with q and k.
  bool m3 = false;
};

RunOptions parse_run_options(int argc, char** argv, const char* program, bool fp8_allowed,
                             bool partial_allowed = false);

// main() of a single-shape program: its options, then `run`; an msa::Error is printed and exits 3.
int single_shape_main(int argc, char** argv, const char* program, int (*run)(const RunOptions&),
                      bool fp8_allowed, bool partial_allowed = false);

// The named case `name` with the options' shape (one request of o.seq tokens, o.hq, o.hkv, o.topk):
// the shape its records state.
BenchCase case_as_run(std::string_view name, const RunOptions& o);

// One request of `seq` tokens: q [seq, hq, 128], k and (with_v) v [seq, hkv, 128], random normal
// bf16 (streams 0, 1 and 2 of `seed`), kept on the host and uploaded on `s`, with cu_seqlens
// {0, seq} for queries and keys.
struct SingleRequestInputs {
  static constexpr int64_t kHeadDim = 128;
  SingleRequestInputs(int64_t seq, int64_t hq, int64_t hkv, uint64_t seed, bool with_v,
                      cudaStream_t s);

  Tensor q_view() const;  // [seq, hq, 128] on GPU 0
  KVCache kv() const;     // flat k, v (when uploaded) and cu_seqlens_k on GPU 0
  Tensor cu_seqlens() const;

  int64_t seq, hq, hkv;
  std::vector<uint16_t> q, k, v;  // bf16 bits
  DeviceBuffer dq, dk, dv, dcu;
};

}  // namespace msa::bench
