// gather_key_sample and quantize_write_index_qk_nvfp4 on CUDA. The gather copies one sampled key
// row (and its NVFP4 scale bytes) per warp; the NVFP4 writer encodes one 16-value group per thread
// with sdsa::nvfp4_encode_group, the function the CPU reference encodes with, so both give the
// same bytes. Values out of range (a length past the table, an offset outside [0, stride), a
// sample past S, a page id or slot outside the pool) are flagged and skipped.
#include <cuda_runtime.h>

#include <cstdint>

#include "common/codecs.h"
#include "common/sdsa.h"
#include "cuda/device/check.h"
#include "cuda/device/status.cuh"
#include "cuda/sm90/sdsa/launch_kernels.h"

namespace msa::cuda::sdsa_sm90 {
namespace {

constexpr int kGatherWarps = 8;

// Request b's sample count, or -1 after flagging a bad length, offset or capacity.
__device__ int64_t sample_count(const GatherParams& p, int64_t b, bool report) {
  const CacheView& c = p.cache;
  const int32_t len = c.seq_lens[b];
  const int64_t table = int64_t(c.max_pages) * c.page_size;
  if (len < 0 || len > table) {
    if (report) flag_status(p.status, int32_t(StatusCode::seq_len_invalid), b, len, table);
    return -1;
  }
  const int32_t off = p.offsets != nullptr ? p.offsets[b] : 0;
  if (off < 0 || off >= p.stride) {
    if (report) flag_status(p.status, int32_t(StatusCode::sample_offset_invalid), b, off, p.stride);
    return -1;
  }
  const int64_t n = sdsa::sample_count(len, off, p.stride);
  if (n > p.capacity) {
    if (report) flag_status(p.status, int32_t(StatusCode::sample_past_capacity), b, n, p.capacity);
    return -1;
  }
  return n;
}

// Grid (B, chunks of samples): each warp copies samples i = chunk * kGatherWarps + warp, ...
__global__ void __launch_bounds__(kGatherWarps * 32) gather_kernel(GatherParams p) {
  const int64_t b = blockIdx.x;
  const bool first = blockIdx.y == 0 && threadIdx.x == 0;
  const int64_t n = sample_count(p, b, first);
  if (first) p.sample_lens[b] = int32_t(n < 0 ? 0 : n);
  if (n <= 0) return;
  const CacheView& c = p.cache;
  const int64_t off = p.offsets != nullptr ? p.offsets[b] : 0;
  const int lane = threadIdx.x & 31;
  for (int64_t i = int64_t(blockIdx.y) * kGatherWarps + (threadIdx.x >> 5); i < n;
       i += int64_t(gridDim.y) * kGatherWarps) {
    const int64_t j = off + i * p.stride;
    const int64_t col = j / c.page_size;
    const int32_t page = c.block_table[b * c.bt_s0 + col];
    if (page < 0 || page >= c.num_pages) {
      if (lane == 0) flag_status(p.status, int32_t(StatusCode::page_id_out_of_range), b, col, page);
      continue;
    }
    const int64_t slot = j % c.page_size;
    const uint8_t* src = static_cast<const uint8_t*>(c.keys) + page * p.key_s0_bytes + slot * p.key_s1_bytes;
    uint8_t* dst = p.sample + b * p.sample_s0 + i * p.sample_s1;
    if (p.vec) {
      for (int e = lane; e < p.row_bytes / 16; e += 32)
        reinterpret_cast<uint4*>(dst)[e] = reinterpret_cast<const uint4*>(src)[e];
    } else {
      for (int e = lane; e < p.row_bytes; e += 32) dst[e] = src[e];
    }
    if (p.sample_scale != nullptr) {
      const uint8_t* ss = c.scale + page * c.scale_s0 + slot * c.scale_s1;
      uint8_t* ds = p.sample_scale + b * p.sscale_s0 + i * p.sscale_s1;
      for (int e = lane; e < p.scale_bytes; e += 32) ds[e] = ss[e];
    }
  }
}

__device__ __forceinline__ float load_value(const EncodeParams& p, int64_t off) {
  switch (p.dtype) {
    case DType::bf16: return codec::bf16_to_float(static_cast<const uint16_t*>(p.x)[off]);
    case DType::f16: return codec::f16_to_float(static_cast<const uint16_t*>(p.x)[off]);
    default: return static_cast<const float*>(p.x)[off];
  }
}

// One thread per (row, 16-value group). A slot given twice is not detected here (the CPU rejects
// it): both rows' threads write the slot, so each of its groups holds one of the two keys'
// encodings (8 code bytes and the scale byte of one group come from one thread, but two
// groups may come from different keys).
__global__ void encode_kernel(EncodeParams p) {
  const int64_t groups = p.dim / 16;
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= p.n * groups) return;
  const int64_t r = idx / groups, g = idx % groups;
  int64_t s0 = r, s1 = 0;
  if (p.slots != nullptr) {
    const int32_t slot = p.slots[r];
    if (slot < 0) return;
    if (slot >= p.pool) {
      if (g == 0) flag_status(p.status, int32_t(StatusCode::slot_out_of_range), r, slot, p.pool);
      return;
    }
    s0 = slot / p.page_size;
    s1 = slot % p.page_size;
  }
  float x[16];
  for (int i = 0; i < 16; ++i) x[i] = load_value(p, r * p.x_s0 + g * 16 + i);
  uint8_t packed[8];
  const uint8_t byte = sdsa::nvfp4_encode_group(x, p.global_scale, packed);
  uint8_t* codes = p.codes + s0 * p.codes_s0 + s1 * p.codes_s1 + g * 8;
  for (int i = 0; i < 8; ++i) codes[i] = packed[i];
  p.scales[s0 * p.scales_s0 + s1 * p.scales_s1 + g] = byte;
}

}  // namespace

void launch_gather(const GatherParams& p, cudaStream_t stream) {
  const int64_t batch = p.cache.batch;
  if (batch == 0) return;
  const int64_t chunks = (p.capacity + kGatherWarps - 1) / kGatherWarps;
  const dim3 grid(unsigned(batch), unsigned(chunks < 1 ? 1 : chunks < 65535 ? chunks : 65535));
  gather_kernel<<<grid, kGatherWarps * 32, 0, stream>>>(p);
  MSA_CUDA_CHECK_LAUNCH();
}

void launch_encode(const EncodeParams& p, cudaStream_t stream) {
  const int64_t items = p.n * (p.dim / 16);
  if (items == 0) return;
  constexpr int kThreadsPerBlock = 128;
  encode_kernel<<<unsigned((items + kThreadsPerBlock - 1) / kThreadsPerBlock), kThreadsPerBlock, 0, stream>>>(p);
  MSA_CUDA_CHECK_LAUNCH();
}

}  // namespace msa::cuda::sdsa_sm90
