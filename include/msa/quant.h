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

}  // namespace msa
