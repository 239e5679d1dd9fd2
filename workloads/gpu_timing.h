// Shared GPU harness of the benchmark programs: device buffers never empty, CUDA-event timing after
// warm-up with an L2 flush before every timed run (median and spread), device views, and the
// options of the single-shape programs.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "msa/error.h"
#include "msa/tensor.h"
#include "workloads/device_buffer.h"

namespace msa::bench {

// A failed CUDA call in benchmark code becomes msa::Error naming the call.
#define MSA_BENCH_CUDA(expr)                                                              \
  do {                                                                                    \
    cudaError_t e_ = (expr);                                                              \
    if (e_ != cudaSuccess) ::msa::fail("bench: CUDA error in ", #expr, ": ", cudaGetErrorString(e_));   \
  } while (0)

// A benchmark buffer: at least 256 bytes, so that even an empty tensor gets a real pointer.
inline DeviceBuffer gpu_buffer(size_t bytes) { return DeviceBuffer(std::max<size_t>(bytes, 256)); }

// The L2 flush before a timed run (flush.cu): a memset of `b` (MSA_BENCH_FLUSH unset, memset or
// write) or a kernel reading it (MSA_BENCH_FLUSH=read); flush_reads() says which, and
// flush_name() names it as the records do (bench/SCHEMA.md, flush).
void flush_l2(const DeviceBuffer& b, int i, cudaStream_t s);
bool flush_reads();
inline const char* flush_name() { return flush_reads() ? "read" : "memset"; }

struct Timing {
  double median = 0, min = 0, max = 0;  // milliseconds
};

// Runs op `warmup` times, then `iters` timed runs each preceded by an L2 flush over `flush` (a
// 256 MB buffer, > 4x the 60 MB L2; flush_l2) when it is non-null. With a label, says on stderr
// what it is about to do, since a slow op's runs can take seconds.
template <typename F>
Timing time_op(F op, int warmup, int iters, cudaStream_t s, const DeviceBuffer* flush,
               const char* label = nullptr) {
  if (label) {
    std::fprintf(stderr, "  %s: %d warm-up runs, then timing %d runs\n", label, warmup, iters);
    std::fflush(stderr);
  }
  for (int i = 0; i < warmup; ++i) op();
  cudaEvent_t a, b;
  MSA_BENCH_CUDA(cudaEventCreate(&a));
  MSA_BENCH_CUDA(cudaEventCreate(&b));
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    if (flush) flush_l2(*flush, i, s);
    MSA_BENCH_CUDA(cudaEventRecord(a, s));
    op();
    MSA_BENCH_CUDA(cudaEventRecord(b, s));
    MSA_BENCH_CUDA(cudaEventSynchronize(b));
    float t = 0;
    MSA_BENCH_CUDA(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return Timing{ms[ms.size() / 2], ms.front(), ms.back()};
}

// A contiguous view of device memory on GPU 0.
inline Tensor gpu_view(void* p, DType dt, std::vector<int64_t> shape) {
  return Tensor(p, dt, shape, Device{DeviceType::cuda, 0});
}

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
};

inline RunOptions parse_run_options(int argc, char** argv, const char* program, bool fp8_allowed,
                                    bool partial_allowed = false) {
  RunOptions o;
  for (int i = 1; i < argc; i += 2) {
    const std::string k = argv[i];
    MSA_CHECK(i + 1 < argc, program, ": option ", k, " needs a value");
    const char* v = argv[i + 1];
    if (k == "--seq") o.seq = std::atoll(v);
    else if (k == "--hq") o.hq = std::atoll(v);
    else if (k == "--hkv") o.hkv = std::atoll(v);
    else if (k == "--topk") o.topk = std::atoll(v);
    else if (k == "--iters") o.iters = std::atoi(v);
    else if (k == "--warmup") o.warmup = std::atoi(v);
    else if (k == "--json") o.json = v;
    else if (k == "--fp8" && fp8_allowed) o.fp8 = std::atoi(v) != 0;
    else if (k == "--fp8-scales" && fp8_allowed) {
      const std::string sv = v;
      MSA_CHECK(sv == "token" || sv == "tensor", program, ": --fp8-scales must be token or tensor, got ", sv);
      o.fp8_per_tensor = sv == "tensor";
    }
    else if (k == "--partial" && partial_allowed) {
      const std::string sv = v;
      MSA_CHECK(sv == "bf16" || sv == "f32", program, ": --partial must be bf16 or f32, got ", sv);
      o.partial = sv == "bf16" ? DType::bf16 : DType::f32;
    }
    else fail(program, ": unknown option ", k);
  }
  MSA_CHECK(o.seq > 0 && o.hkv > 0 && o.hq % o.hkv == 0 && o.iters > 0, program,
            ": need --seq > 0, --hkv > 0 dividing --hq, --iters > 0");
  return o;
}

}  // namespace msa::bench
