// How fast can the memory system deliver SDSA-SELECT's key bytes (bench/CASES.md)? A plain read of
// the same layout, with no scoring: 64 rows of 2048 pages of 64 keys, each page 4 KB of NVFP4
// codes and 512 bytes of e4m3 scales in two pools, pages shuffled in the pools (then in order),
// the L2 flushed by a 256 MB memset before each timed run as msa's benchmarks do. One 128-thread
// block reads `ppb` consecutive pages of a row, each thread two coalesced 16-byte code loads and
// lanes 0-31 one 16-byte scale load a page, `kInFlight` pages at a time. The TB/s count the
// 72 bytes a key that SDSA-SELECT counts; docs/kernels/sdsa.md compares the select against it.
//   nvcc -arch=sm_90a -O3 -std=c++17 -o sdsa_layout_probe scripts/sdsa_layout_probe.cu
//   ./sdsa_layout_probe
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#define CHECK(x)                                                          \
  do {                                                                    \
    const cudaError_t e = (x);                                            \
    if (e != cudaSuccess) {                                               \
      std::printf("%s: %s\n", #x, cudaGetErrorString(e));                \
      return 1;                                                           \
    }                                                                     \
  } while (0)

constexpr int kRows = 64, kPagesPerRow = 2048, kPages = kRows * kPagesPerRow;
constexpr size_t kCodeBytes = 4096, kScaleBytes = 512;  // a page of 64 keys at D = 128

template <int kInFlight>
__global__ void __launch_bounds__(128) read_pages(const uint4* codes, const uint4* scales,
                                                  const int* table, int pages_per_block,
                                                  unsigned* sink) {
  const int row = blockIdx.x, p0 = blockIdx.y * pages_per_block;
  uint32_t acc = 0;
  for (int p = p0; p < p0 + pages_per_block; p += kInFlight) {
    uint4 c[kInFlight][2], s[kInFlight];
#pragma unroll
    for (int k = 0; k < kInFlight; ++k) {
      const int page = table[row * kPagesPerRow + p + k];
      const uint4* cp = codes + size_t(page) * (kCodeBytes / 16);
      c[k][0] = __ldg(cp + threadIdx.x);
      c[k][1] = __ldg(cp + 128 + threadIdx.x);
      s[k] = threadIdx.x < 32 ? __ldg(scales + size_t(page) * (kScaleBytes / 16) + threadIdx.x)
                              : make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (int k = 0; k < kInFlight; ++k)
      acc ^= c[k][0].x ^ c[k][0].w ^ c[k][1].y ^ c[k][1].z ^ s[k].x ^ s[k].w;
  }
  if (acc == 0x12345678u) *sink = acc;  // keeps the loads; never true for the fill below
}

int main() {
  uint4 *codes = nullptr, *scales = nullptr;
  int* table = nullptr;
  unsigned* sink = nullptr;
  void* flush = nullptr;
  const size_t flush_bytes = size_t(256) << 20;
  CHECK(cudaMalloc(&codes, kPages * kCodeBytes));
  CHECK(cudaMalloc(&scales, kPages * kScaleBytes));
  CHECK(cudaMalloc(&table, kPages * sizeof(int)));
  CHECK(cudaMalloc(&sink, sizeof(unsigned)));
  CHECK(cudaMalloc(&flush, flush_bytes));
  CHECK(cudaMemset(codes, 1, kPages * kCodeBytes));
  CHECK(cudaMemset(scales, 1, kPages * kScaleBytes));
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  const double bytes = double(kPages) * 64 * 72;
  std::vector<int> order(kPages);
  std::iota(order.begin(), order.end(), 0);
  for (const bool shuffled : {true, false}) {
    if (shuffled) std::shuffle(order.begin(), order.end(), std::mt19937_64(35));
    else std::iota(order.begin(), order.end(), 0);
    CHECK(cudaMemcpy(table, order.data(), kPages * sizeof(int), cudaMemcpyHostToDevice));
    for (const int ppb : {8, 32}) {
      for (const int in_flight : {1, 2, 4}) {
        std::vector<float> ms;
        for (int it = 0; it < 12; ++it) {
          CHECK(cudaMemsetAsync(flush, it, flush_bytes));
          CHECK(cudaEventRecord(start));
          const dim3 grid(kRows, kPagesPerRow / ppb);
          if (in_flight == 1) read_pages<1><<<grid, 128>>>(codes, scales, table, ppb, sink);
          if (in_flight == 2) read_pages<2><<<grid, 128>>>(codes, scales, table, ppb, sink);
          if (in_flight == 4) read_pages<4><<<grid, 128>>>(codes, scales, table, ppb, sink);
          CHECK(cudaGetLastError());
          CHECK(cudaEventRecord(stop));
          CHECK(cudaEventSynchronize(stop));
          float t = 0.f;
          CHECK(cudaEventElapsedTime(&t, start, stop));
          if (it >= 2) ms.push_back(t);
        }
        std::sort(ms.begin(), ms.end());
        const double med = ms[ms.size() / 2];
        std::printf("%-10s pages a block %2d, in flight %d: %7.1f us, %.2f TB/s of key bytes\n",
                    shuffled ? "shuffled" : "in order", ppb, in_flight, med * 1e3,
                    bytes / (med * 1e-3) / 1e12);
      }
    }
  }
  return 0;
}
