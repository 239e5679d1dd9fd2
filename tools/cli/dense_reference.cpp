// measure_bf16_gemm_rate (dense_reference.h): a cuBLAS bf16 GEMM through dlopen, timed with CUDA
// events. Built with the CUDA backend only; the stub says so otherwise.
#include "dense_reference.h"

#ifdef MSA_WITH_CUDA
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdint>
#include <vector>
#endif

namespace msa::cli {

#ifdef MSA_WITH_CUDA
namespace {

using Create = cublasStatus_t (*)(cublasHandle_t*);
using Destroy = cublasStatus_t (*)(cublasHandle_t);
using SetStream = cublasStatus_t (*)(cublasHandle_t, cudaStream_t);
using GemmEx = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int,
                                  int, const void*, const void*, cudaDataType, int, const void*,
                                  cudaDataType, int, const void*, void*, cudaDataType, int,
                                  cublasComputeType_t, cublasGemmAlgo_t);

// Random bf16 bits, magnitudes 2^-2..2^2 of both signs (no zeros: a GEMM on zeros or constants
// draws less power and runs faster than on data).
std::vector<uint16_t> random_bf16(size_t n, uint64_t seed) {
  std::vector<uint16_t> x(n);
  for (size_t i = 0; i < n; ++i) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    const uint32_t h = uint32_t(seed >> 32);
    x[i] = uint16_t((h & 0x8000u) | ((125u + (h >> 29)) << 7) | ((h >> 8) & 0x7fu));
  }
  return x;
}

}  // namespace

GemmRate measure_bf16_gemm_rate() {
  void* lib = dlopen("libcublas.so.13", RTLD_NOW | RTLD_LOCAL);
  if (!lib) return {0, std::string("cuBLAS not found (") + dlerror() + ")"};
  const auto create = reinterpret_cast<Create>(dlsym(lib, "cublasCreate_v2"));
  const auto destroy = reinterpret_cast<Destroy>(dlsym(lib, "cublasDestroy_v2"));
  const auto set_stream = reinterpret_cast<SetStream>(dlsym(lib, "cublasSetStream_v2"));
  const auto gemm = reinterpret_cast<GemmEx>(dlsym(lib, "cublasGemmEx"));
  if (!create || !destroy || !set_stream || !gemm) return {0, "cuBLAS lacks cublasGemmEx"};
  constexpr int n = 8192;
  const size_t elems = size_t(n) * n;
  void *a = nullptr, *b = nullptr, *c = nullptr;
  cudaStream_t stream = nullptr;
  cublasHandle_t handle = nullptr;
  GemmRate r;
  if (cudaMalloc(&a, elems * 2) != cudaSuccess || cudaMalloc(&b, elems * 2) != cudaSuccess ||
      cudaMalloc(&c, elems * 2) != cudaSuccess ||
      cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess ||
      create(&handle) != CUBLAS_STATUS_SUCCESS || set_stream(handle, stream) != CUBLAS_STATUS_SUCCESS) {
    r.error = "could not set up the GEMM (CUDA or cuBLAS error)";
  } else {
    const std::vector<uint16_t> ha = random_bf16(elems, 1), hb = random_bf16(elems, 2);
    cudaMemcpy(a, ha.data(), elems * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(b, hb.data(), elems * 2, cudaMemcpyHostToDevice);
    const float one = 1.f, zero = 0.f;
    auto run = [&] {
      return gemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a, CUDA_R_16BF, n, b,
                  CUDA_R_16BF, n, &zero, c, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                  CUBLAS_GEMM_DEFAULT);
    };
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    std::vector<float> ms;
    bool ok = true;
    for (int i = 0; i < 13 && ok; ++i) {
      cudaEventRecord(e0, stream);
      ok = run() == CUBLAS_STATUS_SUCCESS;
      cudaEventRecord(e1, stream);
      ok = ok && cudaEventSynchronize(e1) == cudaSuccess;
      float t = 0;
      cudaEventElapsedTime(&t, e0, e1);
      if (i >= 3) ms.push_back(t);
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    if (!ok) {
      r.error = "the cuBLAS GEMM failed";
    } else {
      std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
      r.tflops = 2.0 * n * double(n) * n / (ms[ms.size() / 2] * 1e-3) / 1e12;
    }
  }
  if (handle) destroy(handle);
  if (stream) cudaStreamDestroy(stream);
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  return r;
}
#else
GemmRate measure_bf16_gemm_rate() { return {0, "msa was built without CUDA"}; }
#endif

}  // namespace msa::cli
