// FP8 K/V to bf16 for the sparse prefill (dequant_kv.cuh).
#include "cuda/common/dequant_kv.cuh"

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>

#include "cuda/common/pdl.cuh"
#include "cuda/device/info.h"

namespace msa::cuda {
namespace {

constexpr int kHeadDim = 128;
constexpr int kChunk = 16;                     // values per thread step: one 16-byte load
constexpr int kChunksPerRow = kHeadDim / kChunk;
constexpr int kThreads = 256;

__device__ __forceinline__ float scale_of(const float* s, int kind, int64_t token, int h, int hkv) {
  switch (kind) {
    case 1: return s[0];
    case 2: return s[token];
    case 3: return s[token * hkv + h];
    default: return 1.f;
  }
}

// 16 e4m3 values times `scale`, rounded to bf16, as two 16-byte stores.
__device__ __forceinline__ void convert16(const uint8_t* src, float scale, __nv_bfloat16* dst) {
  const uint4 in = *reinterpret_cast<const uint4*>(src);
  const uint32_t w[4] = {in.x, in.y, in.z, in.w};
  uint32_t out[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const __nv_fp8x2_storage_t pair = __nv_fp8x2_storage_t((w[i / 2] >> (16 * (i % 2))) & 0xffff);
    const float2 f = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3)));
    const __nv_bfloat162 b = __floats2bfloat162_rn(f.x * scale, f.y * scale);
    out[i] = *reinterpret_cast<const uint32_t*>(&b);
  }
  uint4* d = reinterpret_cast<uint4*>(dst);
  d[0] = make_uint4(out[0], out[1], out[2], out[3]);
  d[1] = make_uint4(out[4], out[5], out[6], out[7]);
}

// One (key, head) row's chunk c of K and of V, batch-local key j of batch b (its output row o0 + j).
__device__ __forceinline__ void convert_row(const DequantKVParams& p, int b, int64_t src0, int64_t o0,
                                            int64_t j, int h, int c) {
  int64_t token, k_off, v_off;  // scale token; element offsets of the row in k and v
  if (!p.paged) {
    token = src0 + j;
    k_off = token * p.k_stride[0] + h * p.k_stride[1];
    v_off = token * p.v_stride[0] + h * p.v_stride[1];
  } else {
    const PagedKV& pk = p.pool;
    const int32_t page = pk.page_table[b * pk.page_table_stride + (j >> pk.page_shift)];
    if (page < 0 || page >= pk.num_pages) return;  // reported by the paged check
    const int64_t slot = j & ((int64_t(1) << pk.page_shift) - 1);
    token = (int64_t(page) << pk.page_shift) + slot;
    const int slot_dim = p.paged == 1 ? 1 : 2, head_dim = p.paged == 1 ? 2 : 1;
    k_off = page * p.k_stride[0] + slot * p.k_stride[slot_dim] + h * p.k_stride[head_dim];
    v_off = page * p.v_stride[0] + slot * p.v_stride[slot_dim] + h * p.v_stride[head_dim];
  }
  const int64_t dst = ((o0 + j) * p.num_kv_heads + h) * kHeadDim + c * kChunk;
  convert16(p.k + k_off + c * kChunk, scale_of(p.k_scale, p.k_scale_kind, token, h, p.num_kv_heads),
            static_cast<__nv_bfloat16*>(p.k_out) + dst);
  convert16(p.v + v_off + c * kChunk, scale_of(p.v_scale, p.v_scale_kind, token, h, p.num_kv_heads),
            static_cast<__nv_bfloat16*>(p.v_out) + dst);
}

// grid (x: steps over a batch's keys, y: batches, strided). A thread step converts one 16-value
// chunk of one (key, head) row of K and of V.
__global__ void __launch_bounds__(kThreads) dequant_kv_kernel(DequantKVParams p) {
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
      convert_row(p, b, src0, o0, i / (int64_t(kChunksPerRow) * p.num_kv_heads), h, c);
    }
  }
}

}  // namespace

void launch_dequant_kv(const DequantKVParams& p, cudaStream_t stream) {
  if (p.batch == 0 || p.max_keys == 0) return;
  const int64_t steps = p.max_keys * p.num_kv_heads * kChunksPerRow;
  // Enough blocks per batch to fill the GPU a few times over, at most one step per thread.
  const int64_t want = std::max<int64_t>(1, 4 * current_sm_count() / std::max<int64_t>(1, p.batch));
  const unsigned x = unsigned(std::min<int64_t>((steps + kThreads - 1) / kThreads, want));
  launch_pdl(dequant_kv_kernel, dim3(x, unsigned(std::min<int64_t>(p.batch, 65535))), kThreads, 0,
             stream, p);
}

}  // namespace msa::cuda
