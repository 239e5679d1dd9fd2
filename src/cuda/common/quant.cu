// CUDA quantize / dequantize and the FP4 scale reorders (include/msa/quant.h): the same scale and
// rounding rules as the CPU reference, taken from common/codecs.h, so both backends give identical
// bits. Memory-bound and off the attention hot path: one warp per (token, head) row for FP8, one
// thread per scale group for FP4, one thread per element for dequantize and per written scale
// byte for the reorders.
#include <cuda_runtime.h>

#include <cstdint>

#include "backend.h"
#include "common/codecs.h"
#include "common/fp4_scale_layout.h"
#include "cuda/device/check.h"

namespace msa::cuda {
namespace {

// A [T, H, D] view with D contiguous; strides in elements (bytes for fp4x2 and scale bytes).
struct View3 {
  void* data;
  int64_t s0, s1;
  DType dtype;
};

View3 view3(const Tensor& t) { return {t.data, t.strides[0], t.strides[1], t.dtype}; }

__device__ __forceinline__ float load_plain(const View3& x, int64_t t, int64_t h, int64_t d) {
  const int64_t off = t * x.s0 + h * x.s1 + d;
  switch (x.dtype) {
    case DType::bf16: return codec::bf16_to_float(static_cast<const uint16_t*>(x.data)[off]);
    case DType::f16: return codec::f16_to_float(static_cast<const uint16_t*>(x.data)[off]);
    default: return static_cast<const float*>(x.data)[off];
  }
}

__device__ __forceinline__ void store_plain(const View3& x, int64_t t, int64_t h, int64_t d, double v) {
  const int64_t off = t * x.s0 + h * x.s1 + d;
  switch (x.dtype) {
    case DType::bf16: static_cast<uint16_t*>(x.data)[off] = codec::double_to_bf16(v); return;
    case DType::f16: static_cast<uint16_t*>(x.data)[off] = codec::double_to_f16(v); return;
    default: static_cast<float*>(x.data)[off] = float(v); return;
  }
}

// max that keeps NaN once seen, as the CPU reference's amax loop does.
__device__ __forceinline__ float nan_max(float a, float b) { return (a != a || b != b) ? __int_as_float(0x7fc00000) : fmaxf(a, b); }

__device__ __forceinline__ float warp_amax(float m) {
  for (int o = 16; o > 0; o >>= 1) m = nan_max(m, __shfl_xor_sync(0xffffffffu, m, o));
  return m;
}

__device__ float block_amax(float m) {
  __shared__ float part[32];
  m = warp_amax(m);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = m;
  __syncthreads();
  m = threadIdx.x < (blockDim.x >> 5) ? part[threadIdx.x] : 0.f;
  if (threadIdx.x < 32) m = warp_amax(m);
  if (threadIdx.x == 0) part[0] = m;
  __syncthreads();
  m = part[0];
  __syncthreads();
  return m;
}

struct Fp8Params {
  View3 x, codes;
  float* scale;  // [1] | [T] | [T, H], contiguous
  int64_t T, H, D;
};

__device__ __forceinline__ void encode_row(const Fp8Params& p, int64_t t, int64_t h, double s, int lane, int lanes) {
  uint8_t* c = static_cast<uint8_t*>(p.codes.data) + t * p.codes.s0 + h * p.codes.s1;
  for (int64_t d = lane; d < p.D; d += lanes) c[d] = codec::double_to_e4m3(double(load_plain(p.x, t, h, d)) / s);
}

// Per (token, head): one warp computes the row's amax, writes the scale and encodes the row.
__global__ void fp8_per_token_head_kernel(Fp8Params p) {
  const int64_t row = int64_t(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= p.T * p.H) return;
  const int lane = threadIdx.x & 31;
  const int64_t t = row / p.H, h = row % p.H;
  float m = 0.f;
  for (int64_t d = lane; d < p.D; d += 32) m = nan_max(m, fabsf(load_plain(p.x, t, h, d)));
  const float s = codec::fp8_scale_from_amax(warp_amax(m));
  if (lane == 0) p.scale[row] = s;
  encode_row(p, t, h, s, lane, 32);
}

// Per token: one block reduces over H x D, then encodes the token.
__global__ void fp8_per_token_kernel(Fp8Params p) {
  const int64_t t = blockIdx.x;
  float m = 0.f;
  for (int64_t i = threadIdx.x; i < p.H * p.D; i += blockDim.x)
    m = nan_max(m, fabsf(load_plain(p.x, t, i / p.D, i % p.D)));
  const float s = codec::fp8_scale_from_amax(block_amax(m));
  if (threadIdx.x == 0) p.scale[t] = s;
  for (int64_t h = 0; h < p.H; ++h) encode_row(p, t, h, s, threadIdx.x, blockDim.x);
}

// Per tensor, pass 1: amax over everything into scale[0] (as bits: non-negative floats, NaN
// included, order like their bit patterns, so atomicMax on ints is an exact, order-free max).
__global__ void fp8_tensor_amax_kernel(Fp8Params p) {
  float m = 0.f;
  const int64_t n = p.T * p.H * p.D;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    m = nan_max(m, fabsf(load_plain(p.x, i / (p.H * p.D), (i / p.D) % p.H, i % p.D)));
  m = block_amax(m);
  if (threadIdx.x == 0) atomicMax(reinterpret_cast<int*>(p.scale), __float_as_int(m));
}

// Pass 2: encode with the scale derived from the amax; pass 3 (one thread) replaces the amax.
__global__ void fp8_tensor_encode_kernel(Fp8Params p) {
  const double s = codec::fp8_scale_from_amax(p.scale[0]);
  for (int64_t h = 0; h < p.H; ++h) encode_row(p, blockIdx.x, h, s, threadIdx.x, blockDim.x);
}
__global__ void fp8_tensor_finalize_kernel(float* scale) { scale[0] = codec::fp8_scale_from_amax(scale[0]); }

struct Fp4Params {
  View3 x, codes, scale;
  float global;
  int64_t T, H, D;
  int group;  // 16 (NVFP4) or 32 (MXFP4)
};

// One thread per scale group: amax, scale byte, codes (two per byte).
__global__ void fp4_quantize_kernel(Fp4Params p) {
  const int64_t groups = p.D / p.group;
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= p.T * p.H * groups) return;
  const int64_t t = i / (p.H * groups), h = (i / groups) % p.H, g = i % groups;
  const bool nv = p.group == 16;
  float m = 0.f;
  for (int d = 0; d < p.group; ++d) m = nan_max(m, fabsf(load_plain(p.x, t, h, g * p.group + d)));
  const uint8_t byte = nv ? codec::nvfp4_scale_byte(m, p.global) : codec::mxfp4_scale_byte(m);
  static_cast<uint8_t*>(p.scale.data)[t * p.scale.s0 + h * p.scale.s1 + g] = byte;
  const double step = codec::fp4_step(byte, nv, p.global);
  uint8_t* c = static_cast<uint8_t*>(p.codes.data) + t * p.codes.s0 + h * p.codes.s1;
  for (int d = 0; d < p.group; d += 2) {
    const int64_t e = g * p.group + d;
    const uint8_t lo = step != 0.0 ? codec::double_to_e2m1(load_plain(p.x, t, h, e) / step) : 0;
    const uint8_t hi = step != 0.0 ? codec::double_to_e2m1(load_plain(p.x, t, h, e + 1) / step) : 0;
    c[e / 2] = uint8_t(lo | (hi << 4));
  }
}

struct DequantParams {
  View3 codes, out;
  const void* scale;  // fp8: f32 [1]|[T]|[T,H] or null; fp4: bytes [T, H, D/group] (strided)
  int64_t scale_s0, scale_s1;
  int scale_kind;     // fp8: 0 none, 1 tensor, 2 token, 3 token-head; fp4: 16 or 32 (group)
  float global;
  int64_t T, H, D;
};

__global__ void dequantize_kernel(DequantParams p) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= p.T * p.H * p.D) return;
  const int64_t t = i / (p.H * p.D), h = (i / p.D) % p.H, d = i % p.D;
  const uint8_t* c = static_cast<const uint8_t*>(p.codes.data) + t * p.codes.s0 + h * p.codes.s1;
  double v;
  if (p.codes.dtype == DType::fp8_e4m3) {
    const float* s = static_cast<const float*>(p.scale);
    const double sc = p.scale_kind == 0 ? 1.0 : p.scale_kind == 1 ? s[0] : p.scale_kind == 2 ? s[t] : s[t * p.H + h];
    v = sc * codec::e4m3_to_float(c[d]);
  } else {
    const uint8_t byte = static_cast<const uint8_t*>(p.scale)[t * p.scale_s0 + h * p.scale_s1 + d / p.scale_kind];
    v = codec::fp4_step(byte, p.scale_kind == 16, p.global) * codec::fp4x2_get(c, d);
  }
  store_plain(p.out, t, h, d, v);
}

// Public -> preordered: one thread per preordered byte, padding (rows or groups past the public
// tensor's) written as 0, so the output needs no memset.
__global__ void reorder_to_preordered_kernel(fp4_layout::PublicScales p, const uint8_t* pub,
                                             uint8_t* pre, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const fp4_layout::Coord c = fp4_layout::coord_of(i, p.rest_m(), p.rest_g());
  pre[i] = c.m < p.rows && c.g < p.groups ? pub[p.offset(c.l, c.m, c.g)] : uint8_t(0);
}

// Preordered -> public: one thread per public scale; padding is not read.
__global__ void reorder_to_public_kernel(fp4_layout::PublicScales p, const uint8_t* pre,
                                         uint8_t* pub, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int64_t g = i % p.groups, m = (i / p.groups) % p.rows, l = i / (p.groups * p.rows);
  pub[p.offset(l, m, g)] = pre[fp4_layout::row_offset(l, m, p.rest_m(), p.rest_g()) +
                               fp4_layout::group_offset(g)];
}

unsigned blocks_for(int64_t n, int threads) { return unsigned((n + threads - 1) / threads); }

}  // namespace

void quantize(const Tensor& x, QuantFormat f, const QTensor& out, cudaStream_t stream) {
  const int64_t T = x.shape[0], H = x.shape[1], D = x.shape[2];
  if (T * H * D == 0) return;
  if (f == QuantFormat::nvfp4 || f == QuantFormat::mxfp4) {
    Fp4Params p{view3(x), view3(out.values), view3(out.scale), out.global_scale, T, H, D,
                f == QuantFormat::nvfp4 ? 16 : 32};
    fp4_quantize_kernel<<<blocks_for(T * H * (D / p.group), 256), 256, 0, stream>>>(p);
    MSA_CUDA_CHECK_LAUNCH();
    return;
  }
  Fp8Params p{view3(x), view3(out.values), out.scale.ptr<float>(), T, H, D};
  switch (f) {
    case QuantFormat::fp8_per_token_head:
      fp8_per_token_head_kernel<<<blocks_for(T * H, 8), 256, 0, stream>>>(p);
      break;
    case QuantFormat::fp8_per_token:
      fp8_per_token_kernel<<<unsigned(T), 256, 0, stream>>>(p);
      break;
    default:
      MSA_CUDA_CHECK(cudaMemsetAsync(p.scale, 0, sizeof(float), stream));
      fp8_tensor_amax_kernel<<<264, 256, 0, stream>>>(p);
      MSA_CUDA_CHECK_LAUNCH();
      fp8_tensor_encode_kernel<<<unsigned(T), 256, 0, stream>>>(p);
      MSA_CUDA_CHECK_LAUNCH();
      fp8_tensor_finalize_kernel<<<1, 1, 0, stream>>>(p.scale);
      break;
  }
  MSA_CUDA_CHECK_LAUNCH();
}

void dequantize(const QTensor& x, const Tensor& out, cudaStream_t stream) {
  const int64_t T = out.shape[0], H = out.shape[1], D = out.shape[2];
  if (T * H * D == 0) return;
  DequantParams p{view3(x.values), view3(out), x.scale.data, 0, 0, 0, x.global_scale, T, H, D};
  if (x.values.dtype == DType::fp8_e4m3) {
    const Tensor& s = x.scale;
    p.scale_kind = !s.defined() ? 0 : s.numel() == 1 ? 1 : s.ndim == 1 ? 2 : 3;
  } else {
    p.scale_kind = x.scale.dtype == DType::fp8_e4m3 ? 16 : 32;
    p.scale_s0 = x.scale.strides[0];
    p.scale_s1 = x.scale.strides[1];
  }
  dequantize_kernel<<<blocks_for(T * H * D, 256), 256, 0, stream>>>(p);
  MSA_CUDA_CHECK_LAUNCH();
}

void reorder_fp4_scales(const Tensor& pub, const Tensor& pre, KVLayout layout, bool to_public,
                        cudaStream_t stream) {
  const fp4_layout::PublicScales p = fp4_layout::public_scales(pub, layout);
  const int64_t n = to_public ? p.matrices * p.rows * p.groups : pre.numel();
  if (n == 0) return;
  if (to_public) {
    reorder_to_public_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(p, pre.ptr<uint8_t>(),
                                                                      pub.ptr<uint8_t>(), n);
  } else {
    reorder_to_preordered_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(p, pub.ptr<uint8_t>(),
                                                                          pre.ptr<uint8_t>(), n);
  }
  MSA_CUDA_CHECK_LAUNCH();
}

}  // namespace msa::cuda
