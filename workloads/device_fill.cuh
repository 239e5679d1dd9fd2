// Random benchmark inputs filled on the device (the decode and logits benchmarks): N(0, 1) values
// as bf16 or e4m3, random bytes, and uniform values in [lo, lo + span) as f32 or e4m3, all from
// hashed element indices, so a seed gives the same bits on any grid. Kernels in an anonymous
// namespace: each including .cu file gets its own copy (no clash of their host stubs at link time).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "workloads/inputs.h"

namespace {

// N(0, 1) draw of element i of stream `seed` (Box-Muller on two hashed uniforms).
__device__ __forceinline__ float normal_at(uint64_t seed, int64_t i) {
  using msa::bench::mix64;
  const uint64_t a = mix64(seed ^ (uint64_t(i) * 2)), b = mix64(seed ^ (uint64_t(i) * 2 + 1));
  const float u1 = (float(a >> 40) + 1.f) * 0x1.0p-24f, u2 = float(b >> 40) * 0x1.0p-24f;
  return sqrtf(-2.f * logf(u1)) * cospif(2.f * u2);
}
__global__ void fill_bf16(__nv_bfloat16* x, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = __float2bfloat16(normal_at(seed, i));
}
__global__ void fill_fp8(uint8_t* x, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = __nv_cvt_float_to_fp8(normal_at(seed, i), __NV_SATFINITE, __NV_E4M3);
}
// Random bytes (packed e2m1: every byte is two valid FP4 codes).
__global__ void fill_bytes(uint8_t* x, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = uint8_t(msa::bench::mix64(seed ^ uint64_t(i)) >> 56);
}
// Uniform in [lo, lo + span) rounded to e4m3 (NVFP4 block scales).
__global__ void fill_e4m3_uniform(uint8_t* x, int64_t n, uint64_t seed, float lo, float span) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = __nv_cvt_float_to_fp8(lo + span * float(msa::bench::mix64(seed ^ uint64_t(i)) >> 40) * 0x1.0p-24f,
                                 __NV_SATFINITE, __NV_E4M3);
}
// Uniform f32 in [lo, lo + span).
__global__ void fill_uniform(float* x, int64_t n, uint64_t seed, float lo, float span) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = lo + span * float(msa::bench::mix64(seed ^ uint64_t(i)) >> 40) * 0x1.0p-24f;
}

}  // namespace
