// Quantize / dequantize for the KV and indexer formats (docs/semantics.md, Quantized formats), CPU
// and CUDA.
#pragma once

#include "msa/common.h"

namespace msa {

enum class QuantFormat : uint8_t {
  fp8_per_tensor,      // values fp8_e4m3 [T, H, D], scale f32 [1]
  fp8_per_token,       // scale f32 [T]
  fp8_per_token_head,  // scale f32 [T, H]
  nvfp4,               // values fp4x2 [T, H, D/2], scale fp8_e4m3 [T, H, D/16], global f32
  mxfp4,               // values fp4x2 [T, H, D/2], scale e8m0 [T, H, D/32]
};
const char* quant_format_name(QuantFormat f);

// x: [T, H, D] f32 | bf16 | f16. out.values / out.scale preallocated in the format's shapes.
// The fp8 scales are amax / 448 (1 where amax is 0); the NVFP4 block scale is
// amax_block / (6 * out.global_scale) rounded to e4m3; the MXFP4 scale is the power of two
// 2^(floor(log2(amax_block)) - 2) (OCP MX rule). Values round to nearest even.
void quantize(const Tensor& x, QuantFormat format, const QTensor& out, cudaStream_t stream = nullptr);

// out: [T, H, D] f32 | bf16 | f16, the exact dequantized value (rounded once to out's dtype).
void dequantize(const QTensor& x, const Tensor& out, cudaStream_t stream = nullptr);

// The preordered FP4 scale layout (docs/semantics.md, Quantized formats), which the indexer
// (block_scores, block_topk) takes beside the public one: a contiguous fp8_e4m3 | e8m0 tensor
// [L, restM, restG, 32, 4, 4], restG = ceil(G / 4) for G scales a row (D / 16 or D / 32). The
// scale of (matrix l, row m, group g) sits at
//   l*512*restM*restG + (m/128)*512*restG + (g/4)*512 + (m%32)*16 + ((m/32)%4)*4 + g%4,
// and padding (rows m >= the matrix's rows, groups g >= G) holds zero bytes.
// - layout flat: public [T, H, G] (q, or flat keys) -> [H, ceil(T / 128), restG, 32, 4, 4],
//   matrix l = head h, row m = token t.
// - layout paged_nhd / paged_hnd: a pool's scales [P, 128, Hkv, G] / [P, Hkv, 128, G] (page size
//   128 only) -> [P * Hkv, 1, restG, 32, 4, 4], matrix l = page * Hkv + h, row m = slot.
// `scale`: the public scales (last dim contiguous, other strides free); `out`: allocated by the
// caller in the preordered shape, same dtype and device. Every byte of out is written.
void reorder_fp4_scales(const Tensor& scale, KVLayout layout, const Tensor& out,
                        cudaStream_t stream = nullptr);
// The inverse: `scale` preordered, `out` the public tensor of `layout` (any strides but a
// contiguous last dim), whose shape gives T (or P and Hkv) and G. Padding is not read.
void reorder_fp4_scales_to_public(const Tensor& scale, KVLayout layout, const Tensor& out,
                                  cudaStream_t stream = nullptr);

}  // namespace msa
