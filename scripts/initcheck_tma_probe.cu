// Does compute-sanitizer's initcheck see global memory written by TMA stores? Three buffers of
// the same shape are written, each in full, by a different store path (thread stores, bulk
// copies, TMA tensor stores with the 128-byte swizzle msa's bf16 partials use); one kernel then
// reads every element of each and checks it. Run it under initcheck: a report on a buffer whose
// every byte was written (the program checks the values) is initcheck not tracking that store
// path (CONTRIBUTING.md, Sanitizers). An argument picks one path (`threads`, `bulk` or `tma`), so
// that initcheck's error summary counts that path's reports alone.
//   nvcc -arch=sm_90a -O2 -o initcheck_tma_probe scripts/initcheck_tma_probe.cu
//   for p in threads bulk tma; do compute-sanitizer --tool initcheck ./initcheck_tma_probe $p; done
#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace {

constexpr int kCols = 64;   // one 128-byte row of 2-byte elements: the swizzle span
constexpr int kRows = 16;   // rows per CTA tile
constexpr int kTiles = 512; // CTAs
constexpr int kElems = kCols * kRows * kTiles;

#define CHECK(x)                                                                   \
  do {                                                                             \
    cudaError_t e_ = (x);                                                          \
    if (e_ != cudaSuccess) {                                                       \
      std::fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_));               \
      std::exit(2);                                                                \
    }                                                                              \
  } while (0)

__device__ uint16_t value(int i) { return uint16_t(0x3c00u + (i & 0x3ff)); }

// Tile of CTA b in shared memory, in the layout the store path expects (the 128-byte swizzle for
// TMA: 16-byte chunk c of row r sits at chunk c ^ (r % 8)).
__device__ void fill_tile(uint16_t* sm, bool swizzled) {
  for (int i = threadIdx.x; i < kCols * kRows; i += blockDim.x) {
    const int r = i / kCols, c = i % kCols, chunk = c / 8;
    const int sc = swizzled ? (chunk ^ (r % 8)) : chunk;
    sm[r * kCols + sc * 8 + c % 8] = value(blockIdx.x * kCols * kRows + i);
  }
}

__global__ void write_threads(uint16_t* out) {
  for (int i = threadIdx.x; i < kCols * kRows; i += blockDim.x)
    out[blockIdx.x * kCols * kRows + i] = value(blockIdx.x * kCols * kRows + i);
}

__global__ void write_bulk(uint16_t* out) {
  __shared__ alignas(128) uint16_t sm[kCols * kRows];
  fill_tile(sm, false);
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  __syncthreads();
  if (threadIdx.x == 0) {
    const uint32_t src = uint32_t(__cvta_generic_to_shared(sm));
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(
                     out + blockIdx.x * kCols * kRows),
                 "r"(src), "r"(kCols * kRows * 2)
                 : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
  }
}

__global__ void write_tma(const __grid_constant__ CUtensorMap map) {
  __shared__ alignas(1024) uint16_t sm[kCols * kRows];
  fill_tile(sm, true);
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  __syncthreads();
  if (threadIdx.x == 0) {
    const uint32_t src = uint32_t(__cvta_generic_to_shared(sm));
    asm volatile(
        "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];" ::"l"(&map),
        "r"(0), "r"(int(blockIdx.x) * kRows), "r"(src)
        : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
  }
}

__global__ void read_all(const uint16_t* in, int* bad) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < kElems; i += gridDim.x * blockDim.x)
    if (in[i] != value(i)) atomicAdd(bad, 1);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string only = argc > 1 ? argv[1] : "";
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q{};
  CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q));
  auto encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);

  uint16_t* buf[3];
  int* bad;
  for (auto& b : buf) CHECK(cudaMalloc(&b, kElems * 2));
  CHECK(cudaMalloc(&bad, 3 * sizeof(int)));
  CHECK(cudaMemset(bad, 0, 3 * sizeof(int)));

  CUtensorMap map;
  const cuuint64_t dims[2] = {kCols, cuuint64_t(kRows) * kTiles};
  const cuuint64_t strides[1] = {kCols * 2};
  const cuuint32_t box[2] = {kCols, kRows}, elem[2] = {1, 1};
  if (encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, buf[2], dims, strides, box, elem,
             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
    std::fprintf(stderr, "cuTensorMapEncodeTiled failed\n");
    return 2;
  }
  const char* paths[3] = {"threads", "bulk", "tma"};
  const char* names[3] = {"thread stores", "bulk copies", "TMA tensor stores"};
  int rc = 0;
  for (int i = 0; i < 3; ++i) {
    if (!only.empty() && only != paths[i]) continue;
    if (i == 0) write_threads<<<kTiles, 128>>>(buf[0]);
    if (i == 1) write_bulk<<<kTiles, 128>>>(buf[1]);
    if (i == 2) write_tma<<<kTiles, 128>>>(map);
    read_all<<<64, 256>>>(buf[i], bad + i);
    int h = 0;
    CHECK(cudaMemcpy(&h, bad + i, sizeof h, cudaMemcpyDeviceToHost));
    std::printf("%-18s buffer [%p, %p): %d of %d elements wrong\n", names[i],
                static_cast<void*>(buf[i]), static_cast<void*>(buf[i] + kElems), h, kElems);
    rc |= h != 0;
  }
  return rc;
}
