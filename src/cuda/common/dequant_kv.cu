// FP8 and FP4 K/V, and FP8 q, to bf16 for the sparse prefill (dequant_kv.cuh).
#include "cuda/common/dequant_kv.cuh"

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>

#include "common/codecs.h"
#include "cuda/common/pdl.cuh"
#include "cuda/device/info.h"

namespace msa::cuda {
namespace {

constexpr int kChunk = 16;                     // values per thread step: one 16-byte load
constexpr int kThreads = 256;
// The kernels are instantiated per head dim kD (64, 128, 256): a row is kD / kChunk chunks, and
// the index arithmetic divides by constants.

__device__ __forceinline__ float scale_of(const void* scale, int kind, int64_t token, int h, int hkv) {
  const float* s = static_cast<const float*>(scale);
  switch (kind) {
    case 1: return s[0];
    case 2: return s[token];
    case 3: return s[token * hkv + h];
    default: return 1.f;
  }
}

__device__ __forceinline__ uint32_t bf16x2_bits(float a, float b) {
  const __nv_bfloat162 x = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&x);
}

__device__ __forceinline__ void store16(__nv_bfloat16* dst, const uint32_t (&out)[8]) {
  uint4* d = reinterpret_cast<uint4*>(dst);
  d[0] = make_uint4(out[0], out[1], out[2], out[3]);
  d[1] = make_uint4(out[4], out[5], out[6], out[7]);
}

// 16 e4m3 values times `scale`, rounded to bf16, as two 16-byte stores.
__device__ __forceinline__ void convert16_fp8(const uint8_t* src, float scale, __nv_bfloat16* dst) {
  const uint4 in = *reinterpret_cast<const uint4*>(src);
  const uint32_t w[4] = {in.x, in.y, in.z, in.w};
  uint32_t out[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const __nv_fp8x2_storage_t pair = __nv_fp8x2_storage_t((w[i / 2] >> (16 * (i % 2))) & 0xffff);
    const float2 f = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3)));
    out[i] = bf16x2_bits(f.x * scale, f.y * scale);
  }
  store16(dst, out);
}

// An e2m1 nibble as f32: its sign, exponent and mantissa bits placed in an f16 (bits 15, 11-9),
// times 2^14 (f16's bias 15 against e2m1's 1); the subnormal 0.5 comes out of f16's own. No table:
// codec::e2m1_to_float's lookup costs a local-memory load per value here.
__device__ __forceinline__ float e2m1_bits_to_float(uint32_t nibble) {
  const unsigned short h = static_cast<unsigned short>(((nibble & 8u) << 12) | ((nibble & 7u) << 9));
  return __half2float(__ushort_as_half(h)) * 16384.f;
}

// 16 packed e2m1 values (8 bytes, element 2i in the low nibble) times `step`, rounded to bf16.
__device__ __forceinline__ void convert16_fp4(const uint8_t* src, float step, __nv_bfloat16* dst) {
  const uint2 in = *reinterpret_cast<const uint2*>(src);
  const uint32_t w[2] = {in.x, in.y};
  uint32_t out[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint32_t byte = (w[i / 4] >> (8 * (i % 4))) & 0xffu;
    out[i] = bf16x2_bits(e2m1_bits_to_float(byte & 0xfu) * step, e2m1_bits_to_float(byte >> 4) * step);
  }
  store16(dst, out);
}

// Where a row's values and scales are: element offsets of the row in the values and (FP4) in the
// scales, and its FP8 scale token.
struct RowAt {
  int64_t off, scale_row, token;
};

// One tensor's chunk c (16 values) of a row, into dst.
__device__ __forceinline__ void convert_chunk(const DequantKVParams& p, const uint8_t* x,
                                              const void* scale, int kind, float global,
                                              const RowAt& at, int h, int c, __nv_bfloat16* dst) {
  if (p.format == KVFormat::fp8) {
    convert16_fp8(x + at.off + c * kChunk, scale_of(scale, kind, at.token, h, p.num_kv_heads), dst);
    return;
  }
  // FP4: 8 bytes per chunk; NVFP4 one scale per chunk, MXFP4 one per two chunks.
  const uint8_t sb =
      static_cast<const uint8_t*>(scale)[at.scale_row + (p.format == KVFormat::nvfp4 ? c : c / 2)];
  const float step = p.format == KVFormat::nvfp4 ? codec::e4m3_to_float(sb) * global
                                                 : codec::e8m0_to_float(sb);
  convert16_fp4(x + at.off + c * (kChunk / 2), step, dst);
}

// One (key, head) row's chunk c of K and of V, batch-local key j of batch b (its output row o0 + j).
template <int kD>
__device__ __forceinline__ void convert_row(const DequantKVParams& p, int b, int64_t src0, int64_t o0,
                                            int64_t j, int h, int c) {
  RowAt k_at, v_at;
  // Offsets of (a, b, c) along dims 0-2 of a tensor with strides st.
  auto at3 = [](const int64_t* st, int64_t a, int64_t b2, int64_t c2) { return a * st[0] + b2 * st[1] + c2 * st[2]; };
  if (!p.paged) {
    const int64_t t = src0 + j;
    k_at = {at3(p.k_stride, t, h, 0), at3(p.k_scale_stride, t, h, 0), t};
    v_at = {at3(p.v_stride, t, h, 0), at3(p.v_scale_stride, t, h, 0), t};
  } else {
    const PagedKV& pk = p.pool;
    const int32_t page = pk.page_table[b * pk.page_table_stride + (j >> pk.page_shift)];
    if (page < 0 || page >= pk.num_pages) return;  // reported by the paged check
    const int64_t slot = j & ((int64_t(1) << pk.page_shift) - 1);
    const int64_t token = (int64_t(page) << pk.page_shift) + slot;
    // nhd: [page, slot, head, ...]; hnd: [page, head, slot, ...] (values and FP4 scales alike)
    const int64_t s1 = p.paged == 1 ? slot : h, s2 = p.paged == 1 ? h : slot;
    k_at = {at3(p.k_stride, page, s1, s2), at3(p.k_scale_stride, page, s1, s2), token};
    v_at = {at3(p.v_stride, page, s1, s2), at3(p.v_scale_stride, page, s1, s2), token};
  }
  const int64_t dst = ((o0 + j) * p.num_kv_heads + h) * kD + c * kChunk;
  if (p.k_raw) {  // FP8 QK: e4m3 bytes as they are, the scale beside them
    *reinterpret_cast<uint4*>(static_cast<uint8_t*>(p.k_out) + dst) =
        *reinterpret_cast<const uint4*>(p.k + k_at.off + c * kChunk);
    if (c == 0)
      p.k_scale_out[h * p.k_scale_out_stride + o0 + j] =
          scale_of(p.k_scale, p.k_scale_kind, k_at.token, h, p.num_kv_heads);
  } else {
    convert_chunk(p, p.k, p.k_scale, p.k_scale_kind, p.k_global, k_at, h, c,
                  static_cast<__nv_bfloat16*>(p.k_out) + dst);
  }
  convert_chunk(p, p.v, p.v_scale, p.v_scale_kind, p.v_global, v_at, h, c,
                static_cast<__nv_bfloat16*>(p.v_out) + dst);
}

// grid (x: steps over a batch's keys, y: batches, strided). A thread step converts one 16-value
// chunk of one (key, head) row of K and of V.
template <int kD>
__global__ void __launch_bounds__(kThreads) dequant_kv_kernel(DequantKVParams p) {
  constexpr int kChunksPerRow = kD / kChunk;
  pdl_wait();  // out_offsets: the paged check's output (pdl.cuh)
  pdl_trigger();
  for (int b = blockIdx.y; b < p.batch; b += gridDim.y) {
    const int64_t o0 = p.out_offsets[b], o1 = p.out_offsets[b + 1];
    if (o0 < 0 || o1 < o0 || o1 > p.out_rows) continue;
    int64_t src0 = 0;
    if (!p.paged) {  // bad lengths (reported by the q2k check) are skipped: never read past k
      src0 = p.cu_seqlens_k[b];
      if (src0 < 0 || src0 + (o1 - o0) > p.total_k) continue;
    }
    const int64_t n = (o1 - o0) * p.num_kv_heads * kChunksPerRow;
    for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n;
         i += int64_t(gridDim.x) * kThreads) {
      const int c = int(i % kChunksPerRow);
      const int h = int((i / kChunksPerRow) % p.num_kv_heads);
      convert_row<kD>(p, b, src0, o0, i / (int64_t(kChunksPerRow) * p.num_kv_heads), h, c);
    }
  }
}

// One 16-value chunk of q per thread step.
template <int kD>
__global__ void __launch_bounds__(kThreads) dequant_q_kernel(const DequantQParams p) {
  constexpr int kChunksPerRow = kD / kChunk;
  const int64_t n = p.total_q * p.heads * kChunksPerRow;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / kChunksPerRow, t = row / p.heads;
    const int c = int(i % kChunksPerRow), h = int(row % p.heads);
    convert16_fp8(p.q + t * p.stride_t + h * p.stride_h + c * kChunk, 1.f,
                  static_cast<__nv_bfloat16*>(p.out) + row * kD + c * kChunk);
  }
}

}  // namespace

void launch_dequant_q(const DequantQParams& p, cudaStream_t stream) {
  const int64_t steps = p.total_q * p.heads * (p.head_dim / kChunk);
  if (steps == 0) return;
  const unsigned blocks =
      unsigned(std::min<int64_t>((steps + kThreads - 1) / kThreads, 8 * int64_t(current_sm_count())));
  if (p.head_dim == 64) dequant_q_kernel<64><<<blocks, kThreads, 0, stream>>>(p);
  else if (p.head_dim == 256) dequant_q_kernel<256><<<blocks, kThreads, 0, stream>>>(p);
  else dequant_q_kernel<128><<<blocks, kThreads, 0, stream>>>(p);
}

void launch_dequant_kv(const DequantKVParams& p, cudaStream_t stream) {
  if (p.batch == 0 || p.max_keys == 0) return;
  const int64_t steps = p.max_keys * p.num_kv_heads * (p.head_dim / kChunk);
  // Enough blocks per batch to fill the GPU a few times over, at most one step per thread.
  const int64_t want = std::max<int64_t>(1, 4 * current_sm_count() / std::max<int64_t>(1, p.batch));
  const unsigned x = unsigned(std::min<int64_t>((steps + kThreads - 1) / kThreads, want));
  const dim3 grid(x, unsigned(std::min<int64_t>(p.batch, 65535)));
  if (p.head_dim == 64) launch_pdl(dequant_kv_kernel<64>, grid, kThreads, 0, stream, p);
  else if (p.head_dim == 256) launch_pdl(dequant_kv_kernel<256>, grid, kThreads, 0, stream, p);
  else launch_pdl(dequant_kv_kernel<128>, grid, kThreads, 0, stream, p);
}

}  // namespace msa::cuda
