// Shared GPU harness of the benchmark programs: buffers that are never empty, CUDA-event timing
// after warm-up with an L2 flush before every timed run (median and spread), and device views.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
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

// Work a captured graph holds: kernel nodes (launches), memset nodes and any other node. The
// launch budgets (bench_latency's counts, the GPU tests' bounds) are read from it.
struct GraphNodes {
  int kernels = 0, memsets = 0, others = 0;
};
inline GraphNodes graph_nodes(cudaGraph_t graph) {
  size_t n = 0;
  MSA_BENCH_CUDA(cudaGraphGetNodes(graph, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  MSA_BENCH_CUDA(cudaGraphGetNodes(graph, nodes.data(), &n));
  GraphNodes g;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType t;
    MSA_BENCH_CUDA(cudaGraphNodeGetType(node, &t));
    if (t == cudaGraphNodeTypeKernel) ++g.kernels;
    else if (t == cudaGraphNodeTypeMemset) ++g.memsets;
    else ++g.others;
  }
  return g;
}

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

// Host microseconds of one call of `op` (median, min, max over `calls`), each started after the
// stream drained, so the launches never wait for a full queue: what a caller's thread spends per
// call (bench_latency's host times, bench_decode's run()).
struct HostTiming {
  double median_us = 0, min_us = 0, max_us = 0;
};
template <typename F>
HostTiming time_host(F op, int calls, cudaStream_t s) {
  std::vector<double> us(size_t(std::max(calls, 1)), 0.0);
  for (double& t : us) {
    MSA_BENCH_CUDA(cudaStreamSynchronize(s));
    const auto t0 = std::chrono::steady_clock::now();
    op();
    t = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  }
  MSA_BENCH_CUDA(cudaStreamSynchronize(s));
  std::sort(us.begin(), us.end());
  return {us[us.size() / 2], us.front(), us.back()};
}

// A contiguous view of device memory on GPU 0.
inline Tensor gpu_view(void* p, DType dt, std::vector<int64_t> shape) {
  return Tensor(p, dt, shape, Device{DeviceType::cuda, 0});
}

}  // namespace msa::bench
