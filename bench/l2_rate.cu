// l2_rate: the L2 read and write rates the per-token prefill design leans on
// (docs/kernels/sparse_fwd.md, "Per-token prefill past the byte floor": partials combined while they
// sit in L2). Every SM streams a buffer of S bytes that a kernel wrote just before, R times, by
// 16-byte `ld.global.cg` loads (L2, not L1), `--inflight` independent loads a thread issued before
// any result is used; S from 8 MB (L2-resident) to 512 MB (DRAM). Then every SM rewrites a buffer of
// S bytes R times (16-byte stores). Medians of 7 timed launches (events).
//   l2_rate [--inflight 1|2|4|8]   (default 4; exit status 2: usage or no GPU)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

constexpr int kThreads = 512;

// reps rewrites of p[0, n); one rewrite also puts the buffer in L2 before a read.
__global__ void write_rate(uint4* p, size_t n, int reps) {
  for (int r = 0; r < reps; ++r)
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
      p[i] = make_uint4(uint32_t(r), uint32_t(i), 1u, 2u);
}

// kU loads in flight a thread: all kU issued (predicated past the end), then all used.
template <int kU>
__global__ void read_rate(const uint4* __restrict__ p, size_t n, int reps, uint32_t* sink) {
  uint32_t acc = 0;
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  for (int r = 0; r < reps; ++r) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += kU * stride) {
      uint4 x[kU];
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const size_t k = i + u * stride;
        x[u] = make_uint4(0, 0, 0, 0);
        if (k < n)
          asm volatile("ld.global.cg.v4.u32 {%0,%1,%2,%3}, [%4];"
                       : "+r"(x[u].x), "+r"(x[u].y), "+r"(x[u].z), "+r"(x[u].w)
                       : "l"(p + k));
      }
#pragma unroll
      for (int u = 0; u < kU; ++u) acc ^= x[u].x ^ x[u].y ^ x[u].z ^ x[u].w;
    }
  }
  if (acc == 0x12345678u) sink[0] = acc;  // keeps the loads
}

bool ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
  return false;
}

// Median of 7 launches of `launch` between two events, in ms.
template <typename F>
float median_ms(F launch, cudaEvent_t a, cudaEvent_t b) {
  std::vector<float> ts;
  for (int t = 0; t < 7; ++t) {
    launch();
    float ms = 0.f;
    cudaEventSynchronize(b);
    cudaEventElapsedTime(&ms, a, b);
    ts.push_back(ms);
  }
  std::sort(ts.begin(), ts.end());
  return ts[3];
}

}  // namespace

int main(int argc, char** argv) {
  int inflight = 4;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--inflight") == 0 && i + 1 < argc) inflight = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: l2_rate [--inflight 1|2|4|8]\n");
      return 2;
    }
  }
  if (inflight != 1 && inflight != 2 && inflight != 4 && inflight != 8) {
    std::fprintf(stderr, "--inflight takes 1, 2, 4 or 8, got %d\n", inflight);
    return 2;
  }
  cudaDeviceProp prop;
  if (!ok(cudaGetDeviceProperties(&prop, 0), "no GPU")) return 2;
  const int sms = prop.multiProcessorCount;
  std::printf("%s, %d SMs, L2 %d MB, %d loads in flight a thread\n", prop.name, sms,
              prop.l2CacheSize >> 20, inflight);
  const size_t max_bytes = size_t(512) << 20;
  uint4* buf = nullptr;
  uint32_t* sink = nullptr;
  if (!ok(cudaMalloc(&buf, max_bytes), "cudaMalloc") || !ok(cudaMalloc(&sink, 4), "cudaMalloc"))
    return 2;
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  const size_t sizes_mb[] = {8, 16, 32, 40, 48, 64, 512};
  auto reps_of = [](size_t bytes) { return int(std::max<size_t>(1, (size_t(1) << 30) / bytes)); };
  for (int ctas_per_sm : {1, 2, 4}) {
    for (size_t mb : sizes_mb) {
      const size_t bytes = mb << 20, n = bytes / 16;
      const int reps = reps_of(bytes);
      const dim3 grid(unsigned(sms * ctas_per_sm));
      const float ms = median_ms(
          [&] {
            write_rate<<<sms * 4, kThreads>>>(buf, n, 1);
            cudaEventRecord(a);
            switch (inflight) {
              case 1: read_rate<1><<<grid, kThreads>>>(buf, n, reps, sink); break;
              case 2: read_rate<2><<<grid, kThreads>>>(buf, n, reps, sink); break;
              case 4: read_rate<4><<<grid, kThreads>>>(buf, n, reps, sink); break;
              default: read_rate<8><<<grid, kThreads>>>(buf, n, reps, sink); break;
            }
            cudaEventRecord(b);
          },
          a, b);
      std::printf("read  %d CTAs/SM %4zu MB x %4d: %8.3f ms %6.2f TB/s\n", ctas_per_sm, mb, reps,
                  ms, double(bytes) * reps / (ms * 1e-3) / 1e12);
    }
  }
  for (size_t mb : {16, 32, 48, 512}) {
    const size_t bytes = mb << 20, n = bytes / 16;
    const int reps = reps_of(bytes);
    const float ms = median_ms(
        [&] {
          cudaEventRecord(a);
          write_rate<<<sms * 4, kThreads>>>(buf, n, reps);
          cudaEventRecord(b);
        },
        a, b);
    std::printf("write 4 CTAs/SM %4zu MB x %4d: %8.3f ms %6.2f TB/s\n", mb, reps, ms,
                double(bytes) * reps / (ms * 1e-3) / 1e12);
  }
  return ok(cudaDeviceSynchronize(), "l2_rate") ? 0 : 1;
}
