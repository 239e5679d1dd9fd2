// The L2 flush before each timed run (gpu_timing.h), over a 256 MB buffer (> 4x the 60 MB L2).
// MSA_BENCH_FLUSH picks how:
//   memset (the default; `write` is its older name; records and printed tables name the flush):
//         as triton's do_bench flushes. It leaves the L2 full of dirty lines, whose write-back
//         then shares DRAM with the timed kernel (DEC-B32 on the H200: about 8 us of 48);
//   read: a kernel that reads the buffer, leaving the L2 full of clean lines of other data, the
//         state that rotating input buffers (bench/CASES.md, Counting) would leave.
#include <cstdlib>
#include <string>

#include "workloads/gpu_timing.h"

namespace msa::bench {
namespace {

__global__ void read_all(const uint4* __restrict__ p, size_t n, unsigned* sink) {
  unsigned acc = 0;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint4 v = p[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) *sink = acc;  // keeps the loads; the buffer's bytes are irrelevant
}

}  // namespace

bool flush_reads() {
  static const bool reads = [] {
    const char* e = std::getenv("MSA_BENCH_FLUSH");
    const std::string m = e ? e : "memset";
    MSA_CHECK(m == "memset" || m == "write" || m == "read",
              "MSA_BENCH_FLUSH must be memset (or write, its older name) or read, got ", m);
    return m == "read";
  }();
  return reads;
}

void flush_l2(const DeviceBuffer& b, int i, cudaStream_t s) {
  if (!flush_reads()) {
    MSA_BENCH_CUDA(cudaMemsetAsync(b.get(), i & 0xff, b.bytes(), s));
    return;
  }
  // The last 16 bytes are the sink, not read.
  read_all<<<1024, 512, 0, s>>>(static_cast<const uint4*>(b.get()), b.bytes() / 16 - 1,
                                reinterpret_cast<unsigned*>(static_cast<char*>(b.get()) + b.bytes() - 16));
  MSA_BENCH_CUDA(cudaGetLastError());
}

}  // namespace msa::bench
