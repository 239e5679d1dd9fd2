// Host-side TMA descriptor builder shared by the sm_90a kernels: a 3-D tiled map over a
// [tokens, heads, D] tensor (D contiguous) with the 128-byte swizzle wgmma's K-major operands use.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "msa/tensor.h"

namespace msa::cuda {

// Box: `box_cols` elements of D (64 bf16/f16 or 128 fp8 = one 128-byte swizzle row) x
// `box_heads` heads x `box_tokens` tokens. Out-of-range boxes read as zeros, never fault.
// `op` names the caller in error messages.
CUtensorMap make_tma_3d(const Tensor& t, uint32_t box_cols, uint32_t box_heads,
                        uint32_t box_tokens, const char* op);

// 4-D map over a page pool, its dims innermost first: (D, Hkv, slot, page) for
// [pages, page_size, Hkv, D] (slots_outer) and (D, slot, Hkv, page) for [pages, Hkv, page_size,
// D]; box `box_cols` columns x `box_keys` slots x 1 head x 1 page, 128-byte swizzle. Any strides
// of the view work if they are positive multiples of 16 bytes below 2^40 (a dim of extent 1 gets
// a stand-in stride: it is never stepped); otherwise an msa::Error naming `name` and `op`.
// `l2_promotion` (128 or 256 bytes): the L2 fetch granularity of a box row. 256 suits rows whose
// neighbour line is read too (16-bit D = 128: both halves); 128 keeps a 128-byte row from
// pulling in its neighbour, another head's data in a [pages, page_size, Hkv, D] fp8 pool.
CUtensorMap make_tma_paged(const Tensor& pool, bool slots_outer, uint32_t box_cols,
                           uint32_t box_keys, const char* name, const char* op,
                           uint32_t l2_promotion = 256);

}  // namespace msa::cuda
